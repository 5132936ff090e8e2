"""scale_by_foam / foam against the float64 NumPy reference, and edge cases."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference
from reference import LeafRule
from reference import NumpyFoam

import foam_jax
from foam_jax import FoldSpec

# A pytree with every kind of leaf the default policy meets.
SHAPES = {
    "divisible": (16, 6),       # folded along -2, 4 blocks of 4
    "nondivisible": (10, 5),    # folded, tail block of 2
    "stacked": (3, 12, 4),      # scan-stacked layers: folded along -2
    "bias": (7,),               # 1-D: Adam
    "embed_tokens": (20, 8),    # embedding: Adam
    "lm_head": (8, 20),         # output head: Adam
    "small": (3, 5),            # axis shorter than the block: one block
}
DEFAULT_RULES = {
    "divisible": LeafRule(axis=-2, k=4),
    "nondivisible": LeafRule(axis=-2, k=4),
    "stacked": LeafRule(axis=-2, k=4),
    "bias": LeafRule(),
    "embed_tokens": LeafRule(),
    "lm_head": LeafRule(),
    "small": LeafRule(axis=-2, k=4),
}


def _random_tree(rng, shapes, scale=1.0, dtype=np.float32):
  def draw(s):
    x = scale * rng.standard_normal(s)
    if np.issubdtype(dtype, np.complexfloating):
      x = x + 1j * scale * rng.standard_normal(s)
    return x.astype(dtype)
  return {k: draw(s) for k, s in shapes.items()}


def _run_parity(tx, ref, steps=32, seed=0, grad_scale=1.0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  params = _random_tree(rng, SHAPES, dtype=dtype)
  ref.init(params)
  ref_params = {k: reference.wide(v) for k, v in params.items()}
  params = jax.tree.map(jnp.asarray, params)
  state = tx.init(params)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  worst = 0.0
  for _ in range(steps):
    # Gradients depend on the current params (a quadratic pull) plus noise,
    # with a per-row scale so blocks mix entries of different magnitudes.
    noise = _random_tree(rng, SHAPES, grad_scale, dtype)
    grads = {k: noise[k] + 0.1 * np.asarray(params[k]) for k in SHAPES}
    updates, state = step(jax.tree.map(jnp.asarray, grads), state, params)
    params = optax.apply_updates(params, updates)
    ref_params = ref.step(ref_params, {k: reference.wide(g) for k, g in grads.items()})
    for k in SHAPES:
      err = np.abs(reference.wide(params[k]) - ref_params[k]).max()
      worst = max(worst, float(err))
  for k in SHAPES:
    np.testing.assert_allclose(np.asarray(params[k]), ref_params[k],
                               rtol=1e-5, atol=1e-5, err_msg=k)
  return worst, state


@pytest.mark.single_device
def test_foam_matches_float64_reference_default_policy():
  hp = dict(lr=3e-2, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, alpha=0.25, c=0.7)
  tx = foam_jax.foam(hp["lr"], b1=hp["b1"], b2=hp["b2"], eps=hp["eps"],
                     weight_decay=hp["wd"], alpha=hp["alpha"],
                     residual_scale=hp["c"])
  worst, state = _run_parity(tx, NumpyFoam(DEFAULT_RULES, **hp))
  assert worst < 1e-5
  # The folded leaves really are folded: the state is a quarter along -2.
  mu = state[0].mu
  assert mu["divisible"].shape == (4, 6)
  assert mu["nondivisible"].shape == (3, 5)
  assert mu["stacked"].shape == (3, 3, 4)
  assert mu["small"].shape == (1, 5)
  assert mu["embed_tokens"].shape == (20, 8) and mu["bias"].shape == (7,)


@pytest.mark.single_device
@pytest.mark.parametrize("bias_correction", ["step_size", "folded_moments"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_eps_root_and_nesterov_match_float64_reference(nesterov, bias_correction):
  hp = dict(lr=3e-2, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, alpha=0.25, c=0.7,
            eps_root=1e-3, nesterov=nesterov, bias_correction=bias_correction)
  tx = foam_jax.foam(hp["lr"], hp["b1"], hp["b2"], hp["eps"], hp["eps_root"],
                     None, hp["wd"], alpha=hp["alpha"], residual_scale=hp["c"],
                     nesterov=nesterov, bias_correction=bias_correction)
  worst, _ = _run_parity(tx, NumpyFoam(DEFAULT_RULES, **hp))
  assert worst < 1e-5


@pytest.mark.single_device
@pytest.mark.parametrize("second_moment", ["mean_of_squares", "square_of_mean"])
def test_complex_params_match_float64_reference(second_moment):
  """Complex block means, |g|^2 and |R|^2 in the second moment (Adam's rule)."""
  hp = dict(lr=3e-2, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, alpha=0.25, c=0.7)
  tx = foam_jax.foam(hp["lr"], b1=hp["b1"], b2=hp["b2"], weight_decay=hp["wd"],
                     alpha=hp["alpha"], residual_scale=hp["c"],
                     second_moment=second_moment)
  ref = NumpyFoam(DEFAULT_RULES, second_moment=second_moment, **hp)
  worst, state = _run_parity(tx, ref, dtype=np.complex64)
  assert worst < 2e-5
  assert state[0].mu["divisible"].dtype == jnp.complex64
  assert {x.dtype for x in jax.tree.leaves(state[0].nu)} == {jnp.dtype(jnp.float32)}


@pytest.mark.single_device
@pytest.mark.parametrize("second_moment", ["mean_of_squares", "square_of_mean"])
def test_explicit_specs_and_second_moment_forms(second_moment):
  specs = {
      "divisible": FoldSpec(axis=-1, level=1),   # 3 blocks of 2 along -1
      "nondivisible": FoldSpec(axis=0, level=3),  # blocks of 8 + tail of 2
      "stacked": FoldSpec(axis=0, level=None),    # level from fold_level=1
      "bias": FoldSpec(axis=0, level=2),          # 1-D leaves can be folded
      "embed_tokens": None,
      "lm_head": FoldSpec(axis=-1, level=9),      # whole axis in one block
      "small": None,
  }
  rules = {
      "divisible": LeafRule(-1, 2), "nondivisible": LeafRule(0, 8),
      "stacked": LeafRule(0, 2), "bias": LeafRule(0, 4),
      "embed_tokens": LeafRule(), "lm_head": LeafRule(-1, 512),
      "small": LeafRule(),
  }
  hp = dict(lr=1e-2, b1=0.8, b2=0.99, eps=1e-6, wd=0.0, alpha=0.5, c=1.0)
  tx = foam_jax.foam(hp["lr"], b1=hp["b1"], b2=hp["b2"], eps=hp["eps"],
                     alpha=hp["alpha"], fold_level=1, fold_spec=specs,
                     second_moment=second_moment, weight_decay=0.0)
  ref = NumpyFoam(rules, second_moment=second_moment, **hp)
  worst, _ = _run_parity(tx, ref, steps=30, seed=1)
  assert worst < 1e-5


def test_second_moment_forms_differ():
  # Guards the test above: the two forms must give different updates.
  g = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((8, 4)), jnp.float32)}
  outs = []
  for form in ("mean_of_squares", "square_of_mean"):
    tx = foam_jax.scale_by_foam(second_moment=form)
    outs.append(tx.update(g, tx.init(g))[0]["w"])
  assert float(jnp.abs(outs[0] - outs[1]).max()) > 1e-3


def test_residual_scale_zero_gives_block_constant_updates():
  g = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((8, 3)), jnp.float32)}
  tx = foam_jax.scale_by_foam(residual_scale=0.0, fold_level=2)
  u = np.asarray(tx.update(g, tx.init(g))[0]["w"])
  np.testing.assert_allclose(u[:4], np.broadcast_to(u[:1], (4, 3)), rtol=1e-6)
  np.testing.assert_allclose(u[4:], np.broadcast_to(u[4:5], (4, 3)), rtol=1e-6)


@pytest.mark.single_device
@pytest.mark.parametrize("eps_root", [0.0, 1e-3])
@pytest.mark.parametrize("nesterov", [False, True])
def test_level_zero_with_alpha_one_is_optax_adam(nesterov, eps_root):
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((8, 6)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(6), jnp.float32)}
  # eps=0: both forms of bias correction coincide exactly.
  for eps, rtol in [(0.0, 2e-6), (1e-8, 1e-4)]:
    foam_tx = foam_jax.foam(1e-2, eps=eps, eps_root=eps_root, fold_level=0,
                            weight_decay=0.0, nesterov=nesterov)
    adam_tx = optax.adam(1e-2, eps=eps, eps_root=eps_root, nesterov=nesterov)
    fp, ap = params, params
    fs, as_ = foam_tx.init(fp), adam_tx.init(ap)
    for _ in range(20):
      g = jax.tree.map(lambda p: jnp.sin(3 * p) + 0.1, fp)
      fu, fs = foam_tx.update(g, fs, fp)
      au, as_ = adam_tx.update(g, as_, ap)
      chex.assert_trees_all_close(fu, au, rtol=rtol, atol=1e-9)
      fp, ap = optax.apply_updates(fp, fu), optax.apply_updates(ap, au)


@pytest.mark.single_device
def test_updates_come_back_in_grad_dtype_and_states_in_given_dtype():
  params = {"w": jnp.ones((8, 4), jnp.bfloat16), "b": jnp.ones((4,), jnp.bfloat16)}
  tx = foam_jax.foam(1e-2, weight_decay=0.0)
  state = tx.init(params)
  assert state[0].mu["w"].dtype == jnp.bfloat16
  updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
  assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
  assert all(jnp.isfinite(u.astype(jnp.float32)).all() for u in jax.tree.leaves(updates))

  params32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  tx = foam_jax.foam(1e-2, mu_dtype=jnp.bfloat16, nu_dtype="bfloat16", weight_decay=0.0)
  state = tx.init(params32)
  assert {x.dtype for x in jax.tree.leaves(state[0].mu)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(state[0].nu)} == {jnp.dtype(jnp.bfloat16)}
  updates, state = tx.update(jax.tree.map(jnp.ones_like, params32), state, params32)
  assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))
  assert state[0].mu["w"].dtype == jnp.bfloat16


@pytest.mark.single_device
def test_low_precision_states_track_float32_states():
  rng = np.random.default_rng(3)
  params = {"w": jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)}
  full = foam_jax.foam(1e-2, weight_decay=0.0)
  low = foam_jax.foam(1e-2, mu_dtype=jnp.bfloat16, weight_decay=0.0)
  sf, sl = full.init(params), low.init(params)
  for _ in range(10):
    g = {"w": jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)}
    uf, sf = full.update(g, sf, params)
    ul, sl = low.update(g, sl, params)
  # bf16 keeps ~3 significant digits of the first moment.
  np.testing.assert_allclose(np.asarray(ul["w"]), np.asarray(uf["w"]), rtol=0.05, atol=1e-4)


@pytest.mark.parametrize(
    "name,grads",
    [
        ("zeros", lambda s: jnp.zeros(s, jnp.float32)),
        ("huge", lambda s: jnp.full(s, 1e30, jnp.float32)),
        ("huge_mixed", lambda s: 1e30 * jnp.sign(jnp.arange(np.prod(s)).reshape(s) % 3 - 1.0)),
        ("tiny", lambda s: jnp.full(s, 1e-30, jnp.float32)),
    ],
)
def test_extreme_gradients_give_finite_updates(name, grads):
  shapes = {"w": (8, 4), "odd": (7, 3), "v": (5,), "s": (), "empty": (0, 4), "empty2": (4, 0)}
  params = {k: jnp.ones(s, jnp.float32) for k, s in shapes.items()}
  tx = foam_jax.foam(1e-3, weight_decay=0.01)
  state = tx.init(params)
  for _ in range(3):
    updates, state = tx.update({k: grads(s) for k, s in shapes.items()}, state, params)
    for k, u in updates.items():
      assert u.shape == shapes[k], k
      assert bool(jnp.all(jnp.isfinite(u))), (name, k)


def test_update_without_params():
  g = {"w": jnp.ones((8, 4)), "b": jnp.ones((4,))}
  tx = foam_jax.scale_by_foam()
  updates, _ = tx.update(g, tx.init(g))
  assert updates["w"].shape == (8, 4)


def test_count_and_state_structure():
  params = {"w": jnp.ones((8, 4))}
  tx = foam_jax.scale_by_foam()
  state = tx.init(params)
  assert isinstance(state, foam_jax.ScaleByFoamState)
  assert state.count.dtype == jnp.int32 and int(state.count) == 0
  _, state = tx.update(params, state)
  assert int(state.count) == 1


def test_state_from_other_params_is_rejected():
  tx = foam_jax.scale_by_foam()
  state = tx.init({"w": jnp.ones((8, 4))})
  with pytest.raises(ValueError, match="does not fit a gradient"):
    tx.update({"w": jnp.ones((8, 5, 2))}, state._replace(
        param_shapes=foam_jax.ScaleByFoamState(None, None, None).param_shapes))
  with pytest.raises(ValueError, match=r"\['w'\] has shape \(8, 5, 2\).*shape \(8, 4\)"):
    tx.update({"w": jnp.ones((8, 5, 2))}, state)


def test_state_with_zero_blocks_is_rejected_not_looped_on():
  tx = foam_jax.scale_by_foam()
  state = tx.init({"w": jnp.ones((8, 4))})
  bad = state._replace(mu={"w": jnp.zeros((0, 4))}, nu={"w": jnp.zeros((0, 4))})
  with pytest.raises(ValueError, match="is not a fold of shape"):
    tx.update({"w": jnp.ones((8, 4))}, bad)


@pytest.mark.single_device
@pytest.mark.parametrize("nesterov", [False, True])
def test_folded_moments_correction_at_level_zero_is_optax_adam(nesterov):
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)}
  foam_tx = foam_jax.foam(1e-2, eps_root=1e-3, fold_level=0, weight_decay=0.0,
                          nesterov=nesterov, bias_correction="folded_moments")
  adam_tx = optax.adam(1e-2, eps_root=1e-3, nesterov=nesterov)
  fs, as_ = foam_tx.init(params), adam_tx.init(params)
  for _ in range(20):
    g = jax.tree.map(lambda p: jnp.sin(3 * p) + 0.1, params)
    fu, fs = foam_tx.update(g, fs, params)
    au, as_ = adam_tx.update(g, as_, params)
    chex.assert_trees_all_close(fu, au, rtol=2e-6, atol=1e-9)


@pytest.mark.single_device
def test_folded_moments_correction_keeps_a_residual_update_near_adams():
  """A gradient with zero block means (a LoRA ``lora_b`` starting at zero is
  nearly so) is all residual: the step-size form divides it by the warm-up
  correction, the folded-moments form does not."""
  p = {"w": jnp.zeros((8, 4))}
  g = {"w": jnp.tile(jnp.array([[1.0], [-1.0]]), (4, 4))}  # Block means 0.

  def size_at_step_10(tx):
    s = tx.init(p)
    for _ in range(10):
      u, s = tx.update(g, s, p)
    return float(jnp.abs(u["w"]).mean())

  adam = size_at_step_10(optax.adam(1.0))
  step_size = size_at_step_10(foam_jax.foam(1.0, weight_decay=0.0))
  folded = size_at_step_10(foam_jax.foam(1.0, weight_decay=0.0,
                                         bias_correction="folded_moments"))
  # sqrt(1 - b2^10) / (1 - b1^10) = 0.15; 1 / sqrt(2) (V counts R^2 twice).
  assert step_size / adam < 0.2
  assert 0.65 < folded / adam < 0.75
