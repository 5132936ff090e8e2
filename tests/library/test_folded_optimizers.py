"""foam_muon / foam_lion: float64 reference, Optax at level 0, sizes, sharding."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from optax.contrib import MuonDimensionNumbers
from reference import LeafRule
from reference_folded import NumpyFoldedLion
from reference_folded import NumpyFoldedMuon

import foam_jax
from benchmarks.hlo import COLLECTIVES
from benchmarks.hlo import count_collectives

# Divisible, non-divisible, 3-D (scan-stacked) and 1-D leaves, plus the
# leaves FOAM's policy leaves alone.
SHAPES = {
    "divisible": (16, 6),
    "nondivisible": (10, 5),
    "stacked": (3, 12, 4),
    "bias": (7,),
    "embed_tokens": (20, 8),
}
RULES = {
    "divisible": LeafRule(axis=-2, k=4),
    "nondivisible": LeafRule(axis=-2, k=4),
    "stacked": LeafRule(axis=-2, k=4),
    "bias": LeafRule(),
    "embed_tokens": LeafRule(),
}
# Folded state sizes, by hand: ceil(n / 4) along axis -2.
FOLDED_SHAPES = {
    "divisible": (4, 6),
    "nondivisible": (3, 5),
    "stacked": (3, 3, 4),
    "bias": (7,),
    "embed_tokens": (20, 8),
}
STEPS = 24


def _tree(rng, shapes, scale=1.0):
  return {k: (scale * rng.standard_normal(s)).astype(np.float32)
          for k, s in shapes.items()}


def _run_parity(tx, ref, shapes, *, steps=STEPS, atol=1e-5):
  rng = np.random.default_rng(0)
  params = _tree(rng, shapes)
  ref.init(params)
  ref_params = {k: reference.wide(v) for k, v in params.items()}
  params = jax.tree.map(jnp.asarray, params)
  state = tx.init(params)
  step = jax.jit(tx.update)
  for _ in range(steps):
    noise = _tree(rng, shapes)
    grads = {k: noise[k] + 0.1 * np.asarray(params[k]) for k in shapes}
    updates, state = step(jax.tree.map(jnp.asarray, grads), state, params)
    params = optax.apply_updates(params, updates)
    ref_params = ref.step(
        ref_params, {k: reference.wide(g) for k, g in grads.items()})
  for k in shapes:
    np.testing.assert_allclose(np.asarray(params[k]), ref_params[k],
                               rtol=atol, atol=atol, err_msg=k)
  return state


def _moment_states(state):
  is_moments = lambda x: hasattr(x, "mu") and hasattr(x, "count")
  return [x for x in jax.tree.leaves(state, is_leaf=is_moments)
          if is_moments(x)]


# --- Against the float64 reference. ---


@pytest.mark.single_device
def test_foam_lion_matches_float64_reference():
  hp = dict(lr=1e-2, b1=0.9, b2=0.99, wd=0.1, c=0.7)
  tx = foam_jax.foam_lion(hp["lr"], b1=hp["b1"], b2=hp["b2"],
                          weight_decay=hp["wd"], residual_scale=hp["c"])
  state = _run_parity(tx, NumpyFoldedLion(RULES, **hp), SHAPES)
  for k, shape in FOLDED_SHAPES.items():
    assert state[0].mu[k].shape == shape


# A matrix the Muon rule hands to AdamW: its moments fold like FOAM's.
MUON_SHAPES = dict(SHAPES, adam_matrix=(12, 6))
MUON_RULES = dict(RULES, adam_matrix=LeafRule(axis=-2, k=4))
HIDDEN = ("divisible", "nondivisible", "stacked")


def _dims(params):
  return {k: MuonDimensionNumbers(-2, -1) if k in HIDDEN else None
          for k in params}


@pytest.mark.single_device
@pytest.mark.parametrize("nesterov", [True, False])
def test_foam_muon_matches_float64_reference(nesterov):
  hp = dict(lr=1e-2, beta=0.9, wd=0.05, adam_b1=0.8, adam_b2=0.95,
            adam_wd=0.01, alpha=0.5, c=0.7, nesterov=nesterov)
  tx = foam_jax.foam_muon(
      hp["lr"], beta=hp["beta"], weight_decay=hp["wd"], nesterov=nesterov,
      adam_b1=hp["adam_b1"], adam_b2=hp["adam_b2"],
      adam_weight_decay=hp["adam_wd"], alpha=hp["alpha"],
      residual_scale=hp["c"], muon_weight_dimension_numbers=_dims)
  state = _run_parity(tx, NumpyFoldedMuon(MUON_RULES, HIDDEN, **hp),
                      MUON_SHAPES, atol=1e-5)
  shapes = {}
  for moments in _moment_states(state):
    for k, x in moments.mu.items():
      if not isinstance(x, optax.MaskedNode):
        shapes[k] = x.shape
  assert shapes == dict(FOLDED_SHAPES, adam_matrix=(3, 6))


def test_foam_muon_default_policy_is_foams_matrix_rule():
  params = {k: jnp.zeros(s) for k, s in SHAPES.items()}
  dims = foam_jax._src.muon.matrix_dimension_numbers(params)  # pylint: disable=protected-access
  assert {k for k, d in dims.items() if d is not None} == set(HIDDEN)
  assert dims["stacked"] == MuonDimensionNumbers(-2, -1)
  labels = {}
  for moments in _moment_states(foam_jax.foam_muon(1e-3).init(params)):
    for k, x in moments.mu.items():
      if not isinstance(x, optax.MaskedNode):
        labels[k] = type(moments).__name__
  assert {k for k, v in labels.items() if v == "FoldedMuonState"} == set(HIDDEN)


# --- Level 0 is Optax. ---


def _matrix_rule(params):
  """FOAM's matrix rule, written out here: ndim >= 2, no embed/lm_head."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: MuonDimensionNumbers(-2, -1)
      if x.ndim >= 2 and not any(
          f in jax.tree_util.keystr(path).lower() for f in ("embed", "lm_head"))
      else None, params)


def _compare(tx_ref, tx, shapes, steps, jit):
  """Every step's updates and the final states are bit for bit Optax's."""
  rng = np.random.default_rng(1)
  params = jax.tree.map(jnp.asarray, _tree(rng, shapes))
  s_ref, s = tx_ref.init(params), tx.init(params)
  update_ref, update = (jax.jit(tx_ref.update), jax.jit(tx.update)) if jit else (
      tx_ref.update, tx.update)
  for _ in range(steps):
    grads = jax.tree.map(jnp.asarray, _tree(rng, shapes))
    u_ref, s_ref = update_ref(grads, s_ref, params)
    u, s = update(grads, s, params)
    for a, b in zip(jax.tree.leaves(u_ref), jax.tree.leaves(u)):
      np.testing.assert_array_equal(a, b)
    params = optax.apply_updates(params, u_ref)
  for a, b in zip(jax.tree.leaves(s_ref), jax.tree.leaves(s)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.single_device
@pytest.mark.parametrize("jit", [False, True])
def test_foam_lion_level_0_is_optax_lion_exactly(jit):
  """Bit for bit, eagerly and under jit, over 20 steps."""
  _compare(optax.lion(1e-2, weight_decay=0.1),
           foam_jax.foam_lion(1e-2, weight_decay=0.1, fold_level=0),
           SHAPES, steps=20, jit=jit)


@pytest.mark.single_device
@pytest.mark.parametrize("kwargs", [
    {}, {"nesterov": False}, {"adaptive": True, "weight_decay": 0.1,
                              "adam_weight_decay": 0.01},
])
def test_foam_muon_level_0_is_optax_muon_exactly(kwargs):
  """Bit for bit, eagerly and under jit."""
  shapes = dict(SHAPES, lm_head=(8, 20))
  make = lambda: (  # pylint: disable=g-long-lambda
      optax.contrib.muon(1e-2, muon_weight_dimension_numbers=_matrix_rule,
                         **kwargs),
      foam_jax.foam_muon(1e-2, fold_level=0, **kwargs))
  _compare(*make(), shapes, steps=2, jit=False)  # Eager Newton-Schulz is slow.
  _compare(*make(), shapes, steps=20, jit=True)


def test_foam_muon_level_0_with_a_bfloat16_momentum_is_within_its_rounding():
  """The docstring's bound: a 16-bit momentum is orthogonalized as stored."""
  params = {k: jnp.ones(s) for k, s in SHAPES.items()}
  ref = optax.contrib.muon(1e-2, mu_dtype=jnp.bfloat16,
                           muon_weight_dimension_numbers=_matrix_rule)
  ours = foam_jax.foam_muon(1e-2, mu_dtype=jnp.bfloat16, fold_level=0)
  s_ref, s_ours = ref.init(params), ours.init(params)
  ref_update, ours_update = jax.jit(ref.update), jax.jit(ours.update)
  for t in range(5):
    g = {k: jax.random.normal(jax.random.key(t), v.shape) for k, v in params.items()}
    u_ref, s_ref = ref_update(g, s_ref, params)
    u_ours, s_ours = ours_update(g, s_ours, params)
    for k in params:
      scale = float(jnp.max(jnp.abs(u_ref[k])))
      assert float(jnp.max(jnp.abs(u_ours[k] - u_ref[k]))) <= 2.0 ** -6 * scale, (t, k)


def test_state_trees_mirror_optaxs():
  params = {k: jnp.zeros(s) for k, s in SHAPES.items()}
  lion_ref = optax.lion(1e-3).init(params)
  lion = foam_jax.foam_lion(1e-3).init(params)
  # Optax's fields, then the leafless record of the params' shapes.
  assert lion[0]._fields == (*lion_ref[0]._fields, "param_shapes")
  muon_ref = optax.contrib.muon(
      1e-3, muon_weight_dimension_numbers=_matrix_rule).init(params)
  muon = foam_jax.foam_muon(1e-3).init(params)
  strip = lambda t: jax.tree.structure(jax.tree.map(lambda _: 0, t))  # pylint: disable=g-long-lambda
  ours = str(strip(muon)).replace("FoldedMuonState", "MuonState").replace(
      "ScaleByFoamState", "ScaleByAdamState")
  # Optax 0.2.6 scales by shape inside scale_by_muon, later versions in a
  # stateless step of their own: stateless steps aside, the trees are equal.
  empty = "CustomNode(namedtuple[EmptyState], []), "
  ours = re.sub(r", CustomNode\(ParamShapes\[.*?\], \[\]\)", "", ours)
  assert ours.replace(empty, "") == str(strip(muon_ref)).replace(empty, "")


# --- Folded state sizes. ---


@pytest.mark.parametrize("level, k", [(1, 2), (2, 4), (3, 8)])
def test_folded_state_sizes_are_exact(level, k):
  params = {k_: jax.ShapeDtypeStruct(s, jnp.float32) for k_, s in SHAPES.items()}

  def folded(shape):
    shape = list(shape)
    shape[-2] = -(-shape[-2] // min(k, shape[-2]))
    return int(np.prod(shape))

  matrices = sum(folded(SHAPES[n]) for n in HIDDEN)
  others = sum(int(np.prod(SHAPES[n])) for n in ("bias", "embed_tokens"))
  lion = foam_jax.state_bytes(foam_jax.foam_lion(1e-3, fold_level=level), params)
  assert lion == 4 * (matrices + others + 1)  # + the int32 count
  muon = foam_jax.state_bytes(foam_jax.foam_muon(1e-3, fold_level=level), params)
  # Muon: momentum of the matrices, its count and 3 NS coefficients; AdamW:
  # mu and nu of the rest, its count.
  assert muon == 4 * (matrices + 1 + 3 + 2 * others + 1)


# --- Sharding. ---

LAYOUTS = {
    "fsdp": ((8,), ("data",), {"kernel": ((64, 32), P("data", None))}),
    "tp": ((8,), ("model",), {"kernel": ((32, 64), P(None, "model"))}),
    "fsdp_tp": ((2, 4), ("data", "model"),
                {"kernel": ((32, 64), P("data", "model")),
                 "scale": ((64,), P("model"))}),
    "scan_stacked": ((2, 4), ("data", "model"),
                     {"layers": ((3, 32, 16), P(None, "data", "model"))}),
}


def _sharded(layout, axis_type=AxisType.Explicit, seed=0):
  mesh_shape, axes, leaves = layout
  mesh = jax.make_mesh(mesh_shape, axes, axis_types=(axis_type,) * len(axes))
  rng = np.random.default_rng(seed)
  return {k: jax.device_put(jnp.asarray(rng.standard_normal(s), jnp.float32),
                            NamedSharding(mesh, spec))
          for k, (s, spec) in leaves.items()}


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_folded_lion_update_has_no_collectives(name, axis_type):
  params = _sharded(LAYOUTS[name], axis_type)
  tx = foam_jax.foam_lion(1e-3)
  state = tx.init(params)
  for k, p in params.items():
    assert state[0].mu[k].sharding.spec == p.sharding.spec
    if p.ndim >= 2:
      assert state[0].mu[k].size * 4 == p.size  # Folded 4x.

  def step(params, grads, state):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  hlo = jax.jit(step).lower(params, params, state).compile().as_text()
  assert count_collectives(hlo) == dict.fromkeys(COLLECTIVES, 0)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_folded_muon_state_is_sharded_like_params(name):
  # Automatic mesh axes: under explicit ones Newton-Schulz's products of
  # matrices sharded along their contracting axis need an out_sharding
  # (Optax's Muon alike), and XLA inserts the collectives automatically here.
  params = _sharded(LAYOUTS[name], AxisType.Auto)
  tx = foam_jax.foam_muon(1e-3)
  state = tx.init(params)
  seen = 0
  for moments in _moment_states(state):
    for field in ("mu", "nu"):
      for k, x in getattr(moments, field, {}).items():
        if isinstance(x, optax.MaskedNode):
          continue
        assert x.sharding.spec == params[k].sharding.spec, (k, field)
        seen += 1
  assert seen >= len(params)
  grads = _sharded(LAYOUTS[name], AxisType.Auto, seed=1)
  _, new_state = jax.jit(tx.update)(grads, state, params)
  for moments in _moment_states(new_state):
    for k, x in moments.mu.items():
      if not isinstance(x, optax.MaskedNode):
        assert x.sharding.spec == params[k].sharding.spec


# --- Arguments. ---


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="mode"):
    foam_jax.scale_by_folded_lion(mode="soft")
  with pytest.raises(TypeError, match="fold_level"):
    foam_jax.foam_lion(1e-3, fold_level=1.5)
  with pytest.raises(ValueError, match="b1"):
    foam_jax.foam_lion(1e-3, b1=1.5)
  with pytest.raises(ValueError, match="ns_coeffs"):
    foam_jax.foam_muon(1e-3, ns_coeffs="nope")
  with pytest.raises(ValueError, match="preconditioning"):
    foam_jax.scale_by_folded_muon(preconditioning="nope")
  with pytest.raises(TypeError, match="mu_dtype"):
    foam_jax.foam_muon(1e-3, mu_dtype=jnp.int32)  # int8 means quantized.


def test_init_is_abstract_and_masked_nodes_pass():
  params = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in SHAPES.items()}
  for tx in (foam_jax.foam_lion(1e-3), foam_jax.foam_muon(1e-3)):
    state = jax.eval_shape(tx.init, params)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(state))
  masked = optax.masked(foam_jax.foam_lion(1e-3),
                        {k: k != "bias" for k in SHAPES})
  real = {k: jnp.ones(s) for k, s in SHAPES.items()}
  state = masked.init(real)
  updates, _ = masked.update(real, state, real)
  assert updates["bias"].shape == SHAPES["bias"]


@pytest.mark.parametrize("name", ["fsdp", "tp", "fsdp_tp"])
def test_folded_muon_needs_exactly_optax_muons_collectives(name):
  """Newton-Schulz needs whole matrices: the same collectives as Optax's Muon.

  Folding adds none: the folded momentum update is block-local.
  """
  params = _sharded(LAYOUTS[name], AxisType.Auto)
  counts = {}
  for label, tx in (
      ("optax", optax.contrib.muon(1e-3, muon_weight_dimension_numbers=_matrix_rule)),
      ("folded", foam_jax.foam_muon(1e-3))):
    state = tx.init(params)
    hlo = jax.jit(tx.update).lower(params, state, params).compile().as_text()
    counts[label] = count_collectives(hlo)
  assert counts["folded"] == counts["optax"]
