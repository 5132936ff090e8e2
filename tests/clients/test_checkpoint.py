"""Orbax checkpoints of sharded params + FOAM state: exact resume, new meshes.

Recipe under test (also in the README):

1. Build the optimizer with ``fold_spec=foam_jax.sharding.fitted_fold_specs(params)``
   on the training mesh, so the fold of every leaf is pinned and does not
   depend on the mesh a checkpoint is later restored onto.
2. Save ``{"params": ..., "opt_state": ...}`` with Orbax.
3. Restore onto any mesh with a target of ``jax.ShapeDtypeStruct`` s whose
   shardings come from the new mesh: the params' own, and
   ``foam_jax.sharding.abstract_state(tx, params)`` for the state (its shapes, with
   shardings from ``foam_jax.sharding.state_shardings``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import foam_jax

SPECS = {
    "w_in": P("data", "model"),  # (32, 64): FSDP x TP, folded on axis -2.
    "b_in": P("model"),  # (64,): Adam.
    "w_out": P("model", "data"),  # (64, 16)
    # 16 rows over 8 devices: 2 rows per shard, so it folds on axis -1.
    "mix": P(("data", "model"), None),  # (16, 16)
}
SHAPES = {"w_in": (32, 64), "b_in": (64,), "w_out": (64, 16), "mix": (16, 16)}
STEPS = 3


def _mesh(n_devices: int):
  shape = {8: (2, 4), 4: (2, 2), 1: (1, 1)}[n_devices]
  return jax.make_mesh(
      shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2,
      devices=jax.devices()[:n_devices],
  )


def _abstract_params(mesh):
  return {
      k: jax.ShapeDtypeStruct(SHAPES[k], jnp.float32,
                              sharding=NamedSharding(mesh, SPECS[k]))
      for k in SHAPES
  }


def _init_params(mesh):
  rng = np.random.default_rng(0)
  return {
      k: jax.device_put(
          jnp.asarray(rng.standard_normal(s) / 4, jnp.float32),
          NamedSharding(mesh, SPECS[k]),
      )
      for k, s in SHAPES.items()
  }


def _loss(params, x, y):
  h = jax.nn.gelu(x @ params["w_in"] + params["b_in"])
  return jnp.mean((h @ params["w_out"] @ params["mix"] - y) ** 2)


def _train(tx, params, state, mesh, start: int, steps: int):
  @jax.jit
  def step(params, state, x, y):
    grads = jax.grad(_loss)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  data = NamedSharding(mesh, P("data", None))
  for i in range(start, start + steps):
    rng = np.random.default_rng(i)
    x = jax.device_put(rng.standard_normal((8, 32)).astype(np.float32), data)
    y = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32), data)
    params, state = step(params, state, x, y)
  return params, state


def _target(tx, mesh):
  """Restore target for ``mesh``: shapes, dtypes and the mesh's shardings."""
  abstract_params = _abstract_params(mesh)
  return {
      "params": abstract_params,
      "opt_state": foam_jax.sharding.abstract_state(tx, abstract_params),
  }


def _assert_trees_equal(got, want):
  jax.tree.map(
      lambda g, w: np.testing.assert_array_equal(np.asarray(g), np.asarray(w)),
      got, want,
  )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """3 steps on 8 devices, saved; plus the uninterrupted 6-step run."""
  mesh = _mesh(8)
  params = _init_params(mesh)
  tx = foam_jax.foam(1e-2, fold_spec=foam_jax.sharding.fitted_fold_specs(params), weight_decay=0.0)
  state = tx.init(params)
  assert state[0].mu["mix"].shape == (16, 4)  # Folded on the unsharded axis.
  mid_params, mid_state = _train(tx, params, state, mesh, 0, STEPS)
  path = tmp_path_factory.mktemp("ckpt") / "step_3"
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, {"params": mid_params, "opt_state": mid_state})
  checkpointer.wait_until_finished()
  checkpointer.close()
  final = _train(tx, mid_params, mid_state, mesh, STEPS, STEPS)
  mid = {"params": mid_params, "opt_state": mid_state}
  return tx, path, mid, final


def test_resume_on_same_mesh_is_bit_identical(saved):
  tx, path, _, (want_params, want_state) = saved
  mesh = _mesh(8)
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(path, _target(tx, mesh))
  params, state = _train(
      tx, restored["params"], restored["opt_state"], mesh, STEPS, STEPS
  )
  _assert_trees_equal(params, want_params)
  _assert_trees_equal(state, want_state)
  assert int(state[0].count) == 2 * STEPS


@pytest.mark.parametrize("n_devices", [8, 4, 1])
def test_restore_onto_other_mesh_shapes(saved, n_devices):
  tx, path, mid, (want_params, _) = saved
  mesh = _mesh(n_devices)
  target = _target(tx, mesh)
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(path, target)
  _assert_trees_equal(restored, mid)  # Same values, bit for bit.
  for k, spec in SPECS.items():
    for tree in (restored["params"], restored["opt_state"][0].mu,
                 restored["opt_state"][0].nu):
      assert tree[k].sharding.spec == spec
      assert tree[k].sharding.mesh.devices.size == n_devices
  assert restored["opt_state"][0].mu["w_in"].shape == (8, 64)  # Still folded.
  # Training continues on the new mesh (reduction order may differ across
  # meshes, so this comparison allows float32 rounding).
  params, _ = _train(
      tx, restored["params"], restored["opt_state"], mesh, STEPS, STEPS
  )
  jax.tree.map(
      lambda g, w: np.testing.assert_allclose(
          np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6
      ),
      params, want_params,
  )
