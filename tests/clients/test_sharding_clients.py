"""Sharded states as Flax NNX and Linen carry them: Variable metadata and boxes."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import foam_jax

LR = 1e-2


class _Mlp(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    init = nnx.initializers.lecun_normal()
    self.up = nnx.Linear(
        32, 64, rngs=rngs,
        kernel_init=nnx.with_partitioning(init, ("data", "model")),
        bias_init=nnx.with_partitioning(nnx.initializers.zeros, ("model",)),
    )
    self.norm = nnx.LayerNorm(
        64, rngs=rngs,
        scale_init=nnx.with_partitioning(nnx.initializers.ones, ("model",)),
        use_bias=False,
    )


def _make_optimizer():
  return nnx.Optimizer(_Mlp(nnx.Rngs(0)), foam_jax.foam(LR, weight_decay=0.0), wrt=nnx.Param)


@pytest.mark.parametrize(
    "axis_type, under_jit",
    [(AxisType.Auto, False), (AxisType.Explicit, False), (AxisType.Explicit, True)],
)
def test_nnx_optimizer_state_carries_param_sharding_metadata(axis_type, under_jit):
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
  with jax.set_mesh(mesh):
    optimizer = (nnx.jit(_make_optimizer) if under_jit else _make_optimizer)()
  specs = nnx.get_partition_spec(nnx.state(optimizer))
  state = nnx.state(optimizer)
  for moments in ("mu", "nu"):
    kernel = state["opt_state"][0][moments]["up"]["kernel"]
    assert kernel[...].shape == (8, 64)  # Folded 4x along the input axis.
    assert kernel[...].sharding.spec == P("data", "model")
    spec_of = lambda *keys, m=moments: jax.tree.leaves(  # pylint: disable=g-long-lambda
        specs["opt_state"][0][m][keys[0]][keys[1]]
    )[0]
    assert spec_of("up", "kernel") == P("data", "model")
    assert spec_of("up", "bias") == P("model")
    assert spec_of("norm", "scale") == P("model")


def test_linen_boxed_path():
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  model = nn.Dense(
      64,
      kernel_init=nn.with_partitioning(
          nn.initializers.lecun_normal(), ("data", "model")
      ),
      bias_init=nn.with_partitioning(nn.initializers.zeros, ("model",)),
  )
  x = jnp.ones((4, 32))
  init_params = lambda key: model.init(key, x)["params"]
  to_shardings = lambda specs: jax.tree.map(
      lambda s: NamedSharding(mesh, s), specs,
      is_leaf=lambda s: isinstance(s, P),
  )
  abstract_params = jax.eval_shape(init_params, jax.random.key(0))
  params = jax.jit(
      init_params, out_shardings=to_shardings(nn.get_partition_spec(abstract_params))
  )(jax.random.key(0))

  tx = foam_jax.foam(LR, weight_decay=0.0)
  abstract_state = jax.eval_shape(tx.init, abstract_params)
  state_specs = nn.get_partition_spec(abstract_state)
  assert state_specs[0].mu["kernel"] == P("data", "model")
  assert state_specs[0].mu["bias"] == P("model")
  state = jax.jit(tx.init, out_shardings=to_shardings(state_specs))(params)
  kernel_mu = state[0].mu["kernel"]
  assert isinstance(kernel_mu, nn.Partitioned)
  assert kernel_mu.value.shape == (8, 64)
  assert kernel_mu.value.sharding.spec == P("data", "model")

  unboxed = nn.unbox(params)
  grads = jax.tree.map(jnp.ones_like, unboxed)
  updates, _ = jax.jit(tx.update)(grads, nn.unbox(state), unboxed)
  assert updates["kernel"].sharding.spec == P("data", "model")
