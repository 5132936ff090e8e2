"""The statistics pass (moment.FoldedGradient with a gate) against the fused form.

On XLA:CPU with one device, leaves whose fused update XLA:CPU runs slowly
(16-bit gradients folded along their last axis, blocks of 16 or more) get
their block statistics in a pass of their own, behind a conditional. It is
a different compiled form of the same arithmetic: these tests force it on
(the suite runs on 8 simulated devices, where it is off by default) and
hold it to the float64 reference and to the fused form.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import test_transform
from reference import LeafRule
from reference import NumpyFoam

import foam_jax
from foam_jax import FoldSpec
from foam_jax._src import moment


@pytest.fixture
def statistics_pass(monkeypatch):
  """Sets where the pass runs: ``True`` (where needed) or ``False`` (nowhere)."""
  def use(value):
    monkeypatch.setattr(moment, "STATISTICS_PASS", value)
  return use


def test_needs_statistics_pass_rule():
  geom = moment.Geometry
  assert moment.needs_statistics_pass(jnp.bfloat16, (8, 64), geom(1, 1))
  assert moment.needs_statistics_pass(jnp.float16, (8, 64), geom(1, 3))
  assert not moment.needs_statistics_pass(jnp.bfloat16, (64, 8), geom(0, 2))
  assert not moment.needs_statistics_pass(jnp.float32, (8, 64), geom(1, 2))
  assert moment.needs_statistics_pass(jnp.float32, (64, 8), geom(0, 4))
  assert not moment.needs_statistics_pass(jnp.float32, (64, 8), None)
  assert not moment.needs_statistics_pass(jnp.bfloat16, (8, 64), geom(1, 0))
  # One block per axis (FOAM-Mini): fused in 32 bits off the last axis only.
  assert not moment.needs_statistics_pass(jnp.float32, (64, 8), geom(0, 6))
  assert not moment.needs_statistics_pass(jnp.float32, (64, 8), geom(0, 9))
  assert moment.needs_statistics_pass(jnp.bfloat16, (64, 8), geom(0, 6))
  assert moment.needs_statistics_pass(jnp.float32, (8, 64), geom(1, 6))
  assert moment.needs_statistics_pass(jnp.float32, (128, 8), geom(0, 6))
  # 8-bit moments: every folded leaf, never one that is not folded.
  assert moment.needs_statistics_pass(jnp.float32, (64, 8), geom(0, 2), quantized=True)
  assert not moment.needs_statistics_pass(jnp.float32, (64, 8), None, quantized=True)


def test_off_by_default_with_several_devices():
  assert jax.device_count() > 1 and moment.STATISTICS_PASS is None
  assert not moment.GateChain(jnp.zeros((), jnp.int32)).active


def _compiled_text(tx, params):
  state = tx.init(params)
  update = lambda g, s, p: tx.update(g, s, p)  # A fresh trace per call.
  return jax.jit(update).lower(params, state, params).compile().as_text()


def test_pass_is_a_conditional_only_where_needed(statistics_pass):
  params = {"minor16": jnp.ones((8, 64), jnp.bfloat16),
            "fused": jnp.ones((64, 8), jnp.float32)}
  specs = {"minor16": FoldSpec(axis=-1, level=2), "fused": FoldSpec(axis=-2, level=2)}
  tx = foam_jax.foam(1e-2, fold_spec=specs)
  statistics_pass(True)
  assert _compiled_text(tx, params).count(" conditional(") == 1
  statistics_pass(False)
  assert " conditional(" not in _compiled_text(tx, params)


def test_matches_float64_reference(statistics_pass):
  """Blocks of 16 and whole axes (float32) take the pass; so does its math."""
  statistics_pass(True)
  specs = {
      "divisible": FoldSpec(axis=-2, level=4),    # one block of 16
      "nondivisible": FoldSpec(axis=0, level=4),  # one block of 10
      "stacked": FoldSpec(axis=-2, level=5),      # whole axis
      "bias": FoldSpec(axis=0, level=2),          # fused: block of 4
      "embed_tokens": None,
      "lm_head": FoldSpec(axis=-1, level=4),      # 20 = 16 + a tail of 4
      "small": FoldSpec(axis=-1, level=9),
  }
  rules = {
      "divisible": LeafRule(-2, 16), "nondivisible": LeafRule(0, 16),
      "stacked": LeafRule(-2, 32), "bias": LeafRule(0, 4),
      "embed_tokens": LeafRule(), "lm_head": LeafRule(-1, 16),
      "small": LeafRule(-1, 512),
  }
  for nesterov in (False, True):
    hp = dict(lr=1e-2, b1=0.8, b2=0.99, eps=1e-6, wd=0.1, alpha=0.5, c=0.7,
              eps_root=1e-4, nesterov=nesterov)
    tx = foam_jax.foam(hp["lr"], hp["b1"], hp["b2"], hp["eps"], hp["eps_root"],
                       None, hp["wd"], alpha=hp["alpha"], residual_scale=hp["c"],
                       fold_spec=specs, nesterov=nesterov)
    worst, _ = test_transform._run_parity(tx, NumpyFoam(rules, **hp), steps=24)
    assert worst < 1e-5


def _trajectory(tx, params, steps=12, seed=0):
  rng = np.random.default_rng(seed)
  state = tx.init(params)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  out = []
  for _ in range(steps):
    grads = jax.tree.map(
        lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    out.append(params)
  return out, state


@pytest.mark.parametrize("level", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_sixteen_bit_minor_axis_equals_fused_form(statistics_pass, level, dtype):
  """Same block sums in the same order; only the last bit may differ.

  Each step runs in both forms from the same params, state and gradients.
  The two compiled forms may contract a multiply-add differently, so a
  16-bit moment can round the other way: a last-bit difference, in a few
  entries. A wrong statistic would move most entries by much more.
  """
  rng = np.random.default_rng(level)
  params = {"w": jnp.asarray(rng.standard_normal((6, 48)), dtype),
            "v": jnp.asarray(rng.standard_normal((2, 5, 32)), dtype)}
  tx = foam_jax.foam(1e-2, fold_spec=lambda p: jax.tree.map(
      lambda _: FoldSpec(axis=-1, level=level), p))
  statistics_pass(True)
  with_pass = jax.jit(lambda g, s, p: tx.update(g, s, p))
  statistics_pass(False)
  fused = jax.jit(lambda g, s, p: tx.update(g, s, p))
  state = tx.init(params)
  ulp = float(jnp.finfo(dtype).eps)
  for _ in range(12):
    grads = jax.tree.map(
        lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    statistics_pass(True)
    out_pass = with_pass(grads, state, params)
    statistics_pass(False)
    out_fused = fused(grads, state, params)
    for a, b in zip(jax.tree.leaves(out_pass), jax.tree.leaves(out_fused)):
      a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
      # An entry where the moment and the residual cancel keeps the
      # absolute size of a last-bit difference of its terms.
      np.testing.assert_allclose(a, b, rtol=2 * ulp, atol=2 * ulp * np.abs(b).max())
      assert np.mean(a != b) < 0.05
    updates, state = out_fused
    params = optax.apply_updates(params, updates)


@pytest.mark.parametrize("fold_level", [2, 4])
def test_int8_moments_equal_without_the_gate(statistics_pass, fold_level):
  """8-bit moments requantized behind the gate: the same codes and scales."""
  rng = np.random.default_rng(7)
  params = {"w": jnp.asarray(rng.standard_normal((32, 64)), jnp.float32),
            "embed": jnp.asarray(rng.standard_normal((16, 300)), jnp.float32)}
  tx = foam_jax.foam(1e-2, mu_dtype="int8", nu_dtype="int8", fold_level=fold_level)
  statistics_pass(True)
  gated, state_gated = _trajectory(tx, params, steps=8)
  statistics_pass(False)
  plain, state_plain = _trajectory(tx, params, steps=8)
  for a, b in zip(gated, plain):
    for k in params:
      np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
  for a, b in zip(jax.tree.leaves(state_gated), jax.tree.leaves(state_plain)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

