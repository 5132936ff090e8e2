"""FOAM on sharded params: states sharded like params, no collectives.

Runs on the 8 simulated CPU devices of ``conftest.py``. For every layout of
the sharding issue (FSDP, TP, FSDP x TP, scan-stacked layers, a narrow leaf,
an embedding sharded on its feature axis, 1-D norms) we check that

* each moment has its parameter's ``PartitionSpec`` and the expected folded
  shape (written out by hand in the table below, not computed by the
  library's policy);
* one jitted step on the sharded params equals a float64 NumPy reference;
* the compiled update (FOAM's and ``optax.adamw``'s) holds no collective;
* the state is folded: its size is the folded size, not Adam's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compile_log import compilations
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import foam_jax
from benchmarks.hlo import COLLECTIVES
from benchmarks.hlo import count_collectives

B1, B2, EPS, LR = 0.9, 0.999, 1e-8, 1e-2


def _bytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


@dataclasses.dataclass(frozen=True)
class Leaf:
  shape: tuple[int, ...]
  spec: P
  fold: tuple[int, int] | None  # Expected (axis, block size), None = Adam.


@dataclasses.dataclass(frozen=True)
class Layout:
  mesh_shape: tuple[int, ...]
  mesh_axes: tuple[str, ...]
  leaves: dict[str, Leaf]


LAYOUTS = {
    "fsdp": Layout((8,), ("data",), {
        "kernel": Leaf((64, 32), P("data", None), (0, 4)),
    }),
    "tp": Layout((8,), ("model",), {
        "kernel": Leaf((32, 64), P(None, "model"), (0, 4)),
    }),
    "fsdp_tp": Layout((2, 4), ("data", "model"), {
        "kernel": Leaf((32, 64), P("data", "model"), (0, 4)),
    }),
    "scan_stacked": Layout((2, 4), ("data", "model"), {
        "layers": Leaf((3, 32, 16), P(None, "data", "model"), (1, 4)),
    }),
    # 16 rows on 8 devices: 2 rows per shard cannot hold a block of 4, so the
    # default policy folds the unsharded last axis instead (still 4x).
    "narrow": Layout((8,), ("data",), {
        "kernel": Leaf((16, 32), P("data", None), (1, 4)),
    }),
    # Both axes sharded and short: the level drops to blocks of 2.
    "narrow_both": Layout((2, 4), ("data", "model"), {
        "kernel": Leaf((8, 2), P("model", "data"), (0, 2)),
    }),
    "embedding": Layout((8,), ("model",), {
        "embed_tokens": Leaf((40, 64), P(None, "model"), None),
    }),
    "norms": Layout((8,), ("model",), {
        "scale": Leaf((64,), P("model"), None),
    }),
}


def _mesh(layout: Layout, axis_type=AxisType.Explicit):
  return jax.make_mesh(
      layout.mesh_shape, layout.mesh_axes,
      axis_types=(axis_type,) * len(layout.mesh_axes),
  )


def _sharded_params(layout: Layout, mesh, seed=0):
  rng = np.random.default_rng(seed)
  return {
      name: jax.device_put(
          jnp.asarray(rng.standard_normal(leaf.shape), jnp.float32),
          NamedSharding(mesh, leaf.spec),
      )
      for name, leaf in layout.leaves.items()
  }


def _folded_shape(leaf: Leaf):
  if leaf.fold is None:
    return leaf.shape
  axis, k = leaf.fold
  shape = list(leaf.shape)
  shape[axis] //= k
  return tuple(shape)


def _reference_first_update(g: np.ndarray, fold) -> np.ndarray:
  """FOAM's first update from zero moments, in float64 NumPy."""
  g = g.astype(np.float64)
  step = np.sqrt(1 - B2) / (1 - B1)
  if fold is None:
    m, v = (1 - B1) * g, (1 - B2) * g * g
    return step * m / (np.sqrt(v) + EPS)
  axis, k = fold
  x = np.moveaxis(g, axis, 0)
  blocks = x.reshape((x.shape[0] // k, k) + x.shape[1:])
  mean = blocks.mean(axis=1, keepdims=True)
  sq_mean = (blocks * blocks).mean(axis=1, keepdims=True)
  r = blocks - mean
  m, v = (1 - B1) * mean, (1 - B2) * sq_mean
  u = step * (m + r) / (np.sqrt(v + r * r) + EPS)
  return np.moveaxis(u.reshape(x.shape), 0, axis)


def _step_fn(tx):
  def step(params, grads, state):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return step


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_states_sharded_like_params_and_step_matches_reference(name):
  layout = LAYOUTS[name]
  mesh = _mesh(layout)
  params = _sharded_params(layout, mesh)
  grads = _sharded_params(layout, mesh, seed=1)
  tx = foam_jax.foam(LR, weight_decay=0.0)
  state = tx.init(params)
  shardings = foam_jax.sharding.state_shardings(tx, params)
  for key, leaf in layout.leaves.items():
    for moments in (state[0].mu, state[0].nu):
      assert moments[key].shape == _folded_shape(leaf)
      assert moments[key].sharding.spec == leaf.spec
    assert shardings[0].mu[key] == params[key].sharding
    assert shardings[0].nu[key] == params[key].sharding
  assert shardings[0].count.spec == P()

  new_params, new_state = jax.jit(_step_fn(tx))(params, grads, state)
  for key, leaf in layout.leaves.items():
    want = np.asarray(params[key], np.float64) - LR * _reference_first_update(
        np.asarray(grads[key]), leaf.fold
    )
    np.testing.assert_allclose(new_params[key], want, rtol=1e-5, atol=1e-6)
    assert new_params[key].sharding.spec == leaf.spec
    assert new_state[0].mu[key].sharding.spec == leaf.spec
    assert new_state[0].mu[key].shape == _folded_shape(leaf)


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
@pytest.mark.parametrize("optimizer", ["foam", "adamw"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_compiled_update_has_no_collectives(name, optimizer, axis_type):
  layout = LAYOUTS[name]
  mesh = _mesh(layout, axis_type)
  params = _sharded_params(layout, mesh)
  tx = foam_jax.foam(LR, weight_decay=0.0) if optimizer == "foam" else optax.adamw(LR)
  state = tx.init(params)  # Eager: allocated sharded like the params.
  for key, leaf in layout.leaves.items():
    assert state[0].mu[key].sharding.spec == leaf.spec
    assert state[0].nu[key].sharding.spec == leaf.spec
    if optimizer == "foam":
      assert state[0].nu[key].shape == _folded_shape(leaf)
  hlo = jax.jit(_step_fn(tx)).lower(params, params, state).compile().as_text()
  counts = count_collectives(hlo)
  assert counts == dict.fromkeys(COLLECTIVES, 0), counts


def test_count_collectives_sees_a_reduction():
  """The counter can fail: a global sum over a sharded axis all-reduces."""
  layout = LAYOUTS["fsdp"]
  params = _sharded_params(layout, _mesh(layout))
  hlo = jax.jit(lambda p: jnp.sum(p["kernel"])).lower(params).compile().as_text()
  assert sum(count_collectives(hlo).values()) >= 1
  with pytest.raises(TypeError, match="hlo_text"):
    count_collectives(b"bytes")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_state_is_folded_size(name):
  layout = LAYOUTS[name]
  params = _sharded_params(layout, _mesh(layout))
  foam_state = foam_jax.foam(LR, weight_decay=0.0).init(params)[0]
  adam_state = optax.adam(LR).init(params)[0]
  want = sum(np.prod(_folded_shape(l)) for l in layout.leaves.values()) / sum(
      np.prod(l.shape) for l in layout.leaves.values()
  )
  ratio = _bytes((foam_state.mu, foam_state.nu)) / (
      _bytes((adam_state.mu, adam_state.nu))
  )
  assert ratio == pytest.approx(want)


@pytest.mark.parametrize("name", ["fsdp_tp", "narrow", "scan_stacked"])
def test_explicit_axes_jit_init_and_update(name):
  layout = LAYOUTS[name]
  mesh = _mesh(layout, AxisType.Explicit)
  params = _sharded_params(layout, mesh)
  tx = foam_jax.foam(LR, weight_decay=0.0)
  with jax.set_mesh(mesh):
    state = jax.jit(tx.init)(params)  # Tracers carry the shardings.
    for key, leaf in layout.leaves.items():
      assert state[0].mu[key].shape == _folded_shape(leaf)
      assert state[0].mu[key].sharding.spec == leaf.spec
    step = jax.jit(_step_fn(tx))
    hlo = step.lower(params, params, state).compile().as_text()
    _, new_state = step(params, params, state)
  assert sum(count_collectives(hlo).values()) == 0
  for key, leaf in layout.leaves.items():
    assert new_state[0].nu[key].sharding.spec == leaf.spec


def test_abstract_init_keeps_shardings():
  layout = LAYOUTS["fsdp_tp"]
  mesh = _mesh(layout, AxisType.Explicit)
  abstract = {
      "kernel": jax.ShapeDtypeStruct(
          (32, 64), jnp.float32, sharding=NamedSharding(mesh, P("data", "model"))
      )
  }
  tx = foam_jax.foam(LR, weight_decay=0.0)
  state = jax.eval_shape(tx.init, abstract)
  assert state[0].mu["kernel"].shape == (8, 64)
  assert state[0].mu["kernel"].sharding.spec == P("data", "model")
  assert foam_jax.state_bytes(tx, abstract) == 2 * 8 * 64 * 4 + 4


def test_state_shardings_drive_jit_init_under_auto_axes():
  layout = LAYOUTS["scan_stacked"]
  mesh = _mesh(layout, AxisType.Auto)
  params = _sharded_params(layout, mesh)
  tx = optax.chain(optax.clip_by_global_norm(1.0), foam_jax.foam(LR, weight_decay=0.0))
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      params,
  )
  shardings = foam_jax.sharding.state_shardings(tx, abstract)
  state = jax.jit(tx.init, out_shardings=shardings)(params)
  moments = state[1][0].mu["layers"]
  assert moments.shape == (3, 8, 16)
  assert moments.sharding == params["layers"].sharding
  assert state[1][0].count.sharding.spec == P()


def test_narrow_leaf_under_auto_jit_needs_pinned_specs():
  layout = LAYOUTS["narrow"]
  mesh = _mesh(layout, AxisType.Auto)
  params = _sharded_params(layout, mesh)
  # Traced with automatic axes, init cannot see that 2 rows per shard do not
  # hold a block of 4; state_shardings says so instead of sharding wrongly.
  with pytest.raises(ValueError, match=r"\['kernel'\].*fitted_fold_specs"):
    foam_jax.sharding.state_shardings(foam_jax.foam(LR, weight_decay=0.0), params)
  pinned = foam_jax.sharding.fitted_fold_specs(params)
  assert pinned == {"kernel": foam_jax.FoldSpec(axis=-1, level=2)}
  tx = foam_jax.foam(LR, fold_spec=pinned, weight_decay=0.0)
  state = jax.jit(tx.init, out_shardings=foam_jax.sharding.state_shardings(tx, params))(
      params
  )
  assert state[0].mu["kernel"].shape == (16, 8)
  assert state[0].mu["kernel"].sharding.spec == P("data", None)
  hlo = jax.jit(_step_fn(tx)).lower(params, params, state).compile().as_text()
  assert sum(count_collectives(hlo).values()) == 0


def test_explicit_spec_that_straddles_raises_naming_leaf_axis_and_shard():
  layout = LAYOUTS["narrow"]
  params = _sharded_params(layout, _mesh(layout))
  spec = {"kernel": foam_jax.FoldSpec(axis=-2, level=2)}
  with pytest.raises(ValueError, match=r"\['kernel'\].*axis -2.*pieces of 2"):
    foam_jax.foam(LR, fold_spec=spec, weight_decay=0.0).init(params)
  assert foam_jax.sharding.straddling_blocks(params, spec) == [
      foam_jax.sharding.Straddle("['kernel']", -2, 4, 2)
  ]
  assert foam_jax.sharding.straddling_blocks(params) == [  # The paper's policy, unfitted.
      foam_jax.sharding.Straddle("['kernel']", -2, 4, 2)
  ]
  fitted = foam_jax.sharding.fitted_fold_specs(params)
  assert foam_jax.sharding.straddling_blocks(params, fitted) == []


def test_state_shardings_rejects_unsharded_params():
  with pytest.raises(ValueError, match="params must carry NamedShardings"):
    foam_jax.sharding.state_shardings(
        foam_jax.foam(LR, weight_decay=0.0), {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
    )


WRAPPERS = {
    "masked": lambda: optax.masked(
        foam_jax.foam(LR, weight_decay=0.0), {"kernel": True, "bias": False}
    ),
    "inject_hyperparams": lambda: optax.inject_hyperparams(
        foam_jax.foam, static_args=("fold_level",)
    )(learning_rate=LR),
    "multi_steps": lambda: optax.MultiSteps(foam_jax.foam(LR, weight_decay=0.0), 4),
}


def _foam_state(state):
  """The ScaleByFoamState inside a wrapper's state."""
  found = [
      s for s in jax.tree.leaves(
          state, is_leaf=lambda x: isinstance(x, foam_jax.ScaleByFoamState)
      ) if isinstance(s, foam_jax.ScaleByFoamState)
  ]
  assert len(found) == 1
  return found[0]


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_state_shardings_through_optax_wrappers(wrapper):
  layout = LAYOUTS["fsdp_tp"]
  mesh = _mesh(layout)
  params = {
      "kernel": _sharded_params(layout, mesh)["kernel"],
      "bias": jax.device_put(jnp.zeros((64,)), NamedSharding(mesh, P("model"))),
  }
  tx = WRAPPERS[wrapper]()
  shardings = foam_jax.sharding.state_shardings(tx, params)
  state = jax.jit(tx.init, out_shardings=shardings)(params)
  foam_state = _foam_state(state)
  assert foam_state.mu["kernel"].shape == (8, 64)
  assert foam_state.mu["kernel"].sharding.spec == P("data", "model")
  assert foam_state.count.sharding.spec == P()
  if wrapper == "masked":
    assert isinstance(foam_state.mu["bias"], optax.MaskedNode)
  else:
    assert foam_state.nu["bias"].sharding.spec == P("model")
  for leaf in jax.tree.leaves(state):  # Everything else: replicated or param-like.
    assert leaf.sharding.spec in (P(), P("data", "model"), P("model"))


def test_foam_mini_folds_each_shard_into_one_block():
  """FOAM-Mini's whole-axis block would span shards: it shrinks to a shard."""
  layout = LAYOUTS["fsdp_tp"]  # (32, 64), axis -2 split 2 ways: 16 rows each.
  params = _sharded_params(layout, _mesh(layout))
  tx = foam_jax.foam_mini(LR, weight_decay=0.0)
  state = tx.init(params)
  assert state[0].mu["kernel"].shape == (2, 64)
  assert state[0].mu["kernel"].sharding.spec == P("data", "model")
  hlo = jax.jit(_step_fn(tx)).lower(params, params, state).compile().as_text()
  assert sum(count_collectives(hlo).values()) == 0
  new_params, _ = jax.jit(_step_fn(tx))(params, params, state)
  want = np.asarray(params["kernel"], np.float64) - LR * _reference_first_update(
      np.asarray(params["kernel"]), (0, 16)
  )
  np.testing.assert_allclose(new_params["kernel"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["foam", "foam_mini"])
@pytest.mark.parametrize("name", ["fsdp", "fsdp_tp"])
def test_sharded_step_compiles_once_and_keeps_state_shardings(name, optimizer):
  """Step 1's outputs are placed like its inputs: step 2 reuses the compile.

  (``optax.adamw`` compiles twice here: its step count starts uncommitted.)
  """
  layout = LAYOUTS[name]
  mesh = _mesh(layout, AxisType.Auto)
  params = _sharded_params(layout, mesh)
  tx = {"foam": foam_jax.foam(LR), "foam_mini": foam_jax.foam_mini(LR)}[optimizer]
  state = tx.init(params)
  step = jax.jit(_step_fn(tx), donate_argnums=(0, 2))
  grads = jax.tree.map(lambda p: p * 0.5, params)
  shardings = jax.tree.map(lambda x: x.sharding, state)
  params, state = step(params, grads, state)
  with compilations() as log:
    params, state = step(params, grads, state)
  assert not log, f"the step recompiled on its second call: {log}"
  assert jax.tree.map(lambda x: x.sharding, state) == shardings
