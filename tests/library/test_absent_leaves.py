"""Other people's trees: ``None`` and ``optax.MaskedNode`` leaves, array-only states.

Equinox hands an optimizer ``None`` for every non-array field
(``eqx.filter(model, eqx.is_inexact_array)``), Levanter for a model's absent
fields; ``optax.masked`` hands ``MaskedNode``. Optax passes both through:
nothing in the state, the same placeholder in the update. And every state
leaf is an array, so a container that keeps array leaves keeps the state.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import foam_jax

PARAMS = {"w": jnp.ones((8, 512)), "b": None, "scale": jnp.ones((512,)),
          "block": {"kernel": jnp.ones((16, 512)), "bias": None}}
# scale_by_folded_muon, like optax.contrib.scale_by_muon, takes matrices only.
MATRICES = {"w": jnp.ones((8, 512)), "b": None,
            "block": {"kernel": jnp.ones((16, 512)), "bias": None}}

OPTIMIZERS = {
    "foam": lambda **kw: foam_jax.foam(1e-2, **kw),
    "foam_mini": lambda **kw: foam_jax.foam_mini(1e-2, **kw),
    "foam_muon": lambda **kw: foam_jax.foam_muon(1e-2, **kw),
    "foam_lion": lambda **kw: foam_jax.foam_lion(1e-3, **kw),
    "scale_by_foam": lambda **kw: foam_jax.scale_by_foam(**kw),
    "scale_by_folded_muon": lambda **kw: foam_jax.scale_by_folded_muon(**kw),
    "scale_by_folded_lion": lambda **kw: foam_jax.scale_by_folded_lion(**kw),
}
STORAGE = {
    "float": {},
    "bfloat16": {"mu_dtype": jnp.bfloat16},
    "int8": {"mu_dtype": jnp.int8},
}
CASES = [(name, storage) for name in OPTIMIZERS for storage in STORAGE]


def _make(name, storage):
  kw = dict(STORAGE[storage])
  if storage == "int8" and name in ("foam", "foam_mini", "scale_by_foam"):
    kw["nu_dtype"] = jnp.int8
  return OPTIMIZERS[name](**kw)


def _params(name):
  return MATRICES if name == "scale_by_folded_muon" else PARAMS


def _grads(params, seed=0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)


@pytest.mark.parametrize("name,storage", CASES)
def test_none_leaves_pass_through_init_and_update(name, storage):
  tx, params = _make(name, storage), _params(name)
  state = tx.init(params)
  grads = _grads(params)
  updates, state = jax.jit(tx.update)(grads, state, params)
  assert updates["b"] is None and updates["block"]["bias"] is None
  assert updates["w"].shape == (8, 512)
  # Nothing in the state for an absent param: the present params' state.
  present = {k: v for k, v in params.items() if k != "b"}
  present["block"] = {"kernel": params["block"]["kernel"]}
  without = tx.init(present)
  assert len(jax.tree.leaves(state)) == len(jax.tree.leaves(without))
  # The present params' updates are those of a tree without the absent ones.
  want, _ = jax.jit(tx.update)(_grads(present), without, present)
  np.testing.assert_array_equal(updates["w"], want["w"])
  np.testing.assert_array_equal(updates["block"]["kernel"], want["block"]["kernel"])


@pytest.mark.parametrize("name,storage", CASES)
def test_every_state_leaf_is_an_array(name, storage):
  """So no container that keeps array leaves (nnx, Orbax, Levanter) drops one."""
  tx, params = _make(name, storage), _params(name)
  state = tx.init(params)
  leaves = jax.tree.leaves(state)
  assert leaves and all(isinstance(x, jax.Array) for x in leaves), (
      [type(x) for x in leaves])
  abstract = jax.eval_shape(tx.init, params)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))
  _, state = jax.jit(tx.update)(_grads(params), state, params)
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
  if storage == "int8":
    assert any(x.dtype == jnp.int8 for x in jax.tree.leaves(state))


def test_the_planning_helpers_and_convert_state_take_none_leaves():
  specs = foam_jax.default_fold_specs(PARAMS)
  assert specs["b"] is None and specs["w"] == foam_jax.FoldSpec(axis=-2, level=2)
  assert foam_jax.state_bytes(foam_jax.foam(1e-2), PARAMS) == foam_jax.state_bytes(
      foam_jax.foam(1e-2), {**PARAMS, "b": None, "block": {"kernel": PARAMS["block"]["kernel"]}})
  adamw = optax.adamw(1e-2)
  state = adamw.init(PARAMS)
  _, state = adamw.update(_grads(PARAMS), state, PARAMS)
  for tx in (foam_jax.foam(1e-2), foam_jax.foam(1e-2, mu_dtype="int8", nu_dtype="int8")):
    converted = foam_jax.convert_state(state, tx, PARAMS)
    assert jax.tree.structure(converted) == jax.tree.structure(tx.init(PARAMS))
    assert int(converted[0].count) == 1


def test_a_spec_entry_at_an_absent_param_is_ignored():
  specs = {"w": foam_jax.FoldSpec(axis=-1, level=3), "b": foam_jax.FoldSpec(),
           "scale": None, "block": {"kernel": None, "bias": foam_jax.FoldSpec()}}
  state = foam_jax.scale_by_foam(fold_spec=specs).init(PARAMS)
  assert state.mu["w"].shape == (8, 64) and state.mu["b"] is None
  assert state.mu["block"]["bias"] is None


def _mesh():
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def test_sharding_helpers_take_none_leaves():
  mesh = _mesh()
  params = {"w": jax.ShapeDtypeStruct((64, 512), jnp.float32,
                                      sharding=NamedSharding(mesh, P("data", "model"))),
            "b": None}
  for tx in (foam_jax.foam(1e-2), foam_jax.foam(1e-2, mu_dtype="int8", nu_dtype="int8")):
    shardings = foam_jax.sharding.state_shardings(tx, params)
    assert shardings[0].count.spec == P()
    abstract = foam_jax.sharding.abstract_state(tx, params)
    assert all(x.sharding.spec in (P(), P("data", "model"))
               for x in jax.tree.leaves(abstract))
  assert foam_jax.sharding.fitted_fold_specs(params)["b"] is None
  assert foam_jax.sharding.straddling_blocks(params) == []
  concrete = {"w": jax.device_put(jnp.ones((64, 512)), NamedSharding(mesh, P("data", "model"))),
              "b": None}
  pinned = foam_jax.sharding.pin_layout(foam_jax.foam(1e-2), concrete)
  assert pinned.init(concrete)[0].mu["b"] is None


def test_pin_layout_passes_masked_nodes_through():
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  params = {"w": jax.device_put(jnp.ones((64, 512)), NamedSharding(mesh, P("data", "model"))),
            "n": jax.device_put(jnp.ones((512,)), NamedSharding(mesh, P("model")))}
  mask = {"w": True, "n": False}
  # Pinned inside optax.masked: init is handed MaskedNode for "n".
  tx = optax.masked(foam_jax.sharding.pin_layout(
      foam_jax.foam(1e-2, nu_dtype=jnp.int8), params), mask)
  state = jax.jit(tx.init)(params)
  assert isinstance(state.inner_state[0].nu.codes["n"], optax.MaskedNode)
  updates, _ = jax.jit(tx.update)(params, state, params)
  assert updates["w"].shape == (64, 512)
  # Pinned on params that hold MaskedNode leaves themselves.
  masked = {"w": params["w"], "n": optax.MaskedNode()}
  pinned = foam_jax.sharding.pin_layout(foam_jax.foam(1e-2, nu_dtype=jnp.int8), masked)
  state = pinned.init(masked)
  assert isinstance(state[0].mu["n"], optax.MaskedNode)
  assert state[0].nu.codes["w"].sharding.spec == P("data", "model")
