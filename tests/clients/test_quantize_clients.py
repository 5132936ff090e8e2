"""int8 moments in Flax NNX's optimizer and Orbax checkpoints, sharded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import foam_jax
from tests.library.int8_meshes import mesh as _mesh
from tests.library.int8_meshes import sharded_params as _sharded


class _Mlp(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(
        32, 512, rngs=rngs,
        kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(),
                                          ("data", "model")))


def test_nnx_optimizer_with_sharded_params():
  with jax.set_mesh(_mesh()):
    model = _Mlp(nnx.Rngs(0))
    optimizer = nnx.Optimizer(
        model, foam_jax.foam(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
        wrt=nnx.Param)
    mu = nnx.state(optimizer)["opt_state"][0]["mu"]
    codes, scales = mu["codes"]["up"]["kernel"], mu["scales"]["up"]["kernel"]
    assert codes[...].shape == (8, 512) and codes[...].dtype == jnp.int8
    assert codes[...].sharding.spec == P("data", "model")
    assert scales[...].sharding.spec == P("data", "model")
    grads = nnx.grad(lambda m: jnp.sum(m.up(jnp.ones((4, 32))) ** 2))(model)
    for _ in range(3):  # The stock update, over and over.
      optimizer.update(model, grads)
    assert int(nnx.state(optimizer)["opt_state"][0]["count"][...]) == 3


def test_nnx_optimizer_state_round_trips_through_orbax(tmp_path):
  """``nnx.state(optimizer)`` saved and restored as Flax's checkpointing guide does."""
  with jax.set_mesh(_mesh()):  # _Mlp shards its kernel over ("data", "model").
    model = _Mlp(nnx.Rngs(0))
    optimizer = nnx.Optimizer(
        model, foam_jax.foam(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8), wrt=nnx.Param)
    x = jnp.linspace(-1.0, 1.0, 4 * 32).reshape(4, 32)
    grads = nnx.grad(lambda m: jnp.sum(m.up(x) ** 2))(model)
    for _ in range(2):
      optimizer.update(model, grads)
    saved = nnx.state(optimizer)
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(tmp_path / "opt", saved)
    fresh = nnx.Optimizer(
        _Mlp(nnx.Rngs(1)), foam_jax.foam(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
        wrt=nnx.Param)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(fresh))
    with ocp.StandardCheckpointer() as checkpointer:
      restored = checkpointer.restore(tmp_path / "opt", target)
    nnx.update(fresh, restored)
    want, got = nnx.as_pure(saved), nnx.as_pure(nnx.state(fresh))
    assert jax.tree.structure(want) == jax.tree.structure(got)
    assert len(jax.tree.leaves(got)) == len(jax.tree.leaves(want))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(x.dtype == jnp.int8 for x in jax.tree.leaves(got))
    fresh.update(model, grads)  # And it trains on.
    assert int(fresh.step[...]) == 3


def test_orbax_save_and_restore_onto_another_mesh(tmp_path):
  mesh = _mesh(AxisType.Auto)
  params = _sharded(mesh, narrow=False)
  tx = foam_jax.foam(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8,
                     fold_spec=foam_jax.sharding.fitted_fold_specs(params))
  state = tx.init(params)
  step = jax.jit(tx.update)
  for _ in range(2):
    _, state = step(params, state, params)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "ckpt", {"opt_state": state})
  small = jax.make_mesh((1, 2), ("data", "model"),
                        axis_types=(AxisType.Auto,) * 2,
                        devices=jax.devices()[:2])
  new_params = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=NamedSharding(small, x.sharding.spec)),
      params)
  target = {"opt_state": foam_jax.sharding.abstract_state(tx, new_params)}
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / "ckpt", target)["opt_state"]
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(
      np.asarray(a), np.asarray(b)), state, restored)
  codes = restored[0].mu.codes["w"]
  assert codes.sharding.mesh.shape == small.shape
