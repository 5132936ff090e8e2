"""The update as the H100 compiler counts it, compiled without a GPU.

Counts from a compiler, not timings: bytes accessed, temporaries and
collectives of the donated step ``tx.update`` then ``optax.apply_updates``,
compiled for an H100 SXM5 through the CUDA plugin from the project's target
description (``benchmarks/targets``). These tests need the plugin
(``jax-cuda13-plugin``, as ``.ci/run``'s deviceless step installs it) and are
marked ``deviceless``: the default run deselects them, that step runs them.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.deviceless

from benchmarks import deviceless  # noqa: E402

deviceless.configure_environment()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import foam_jax  # noqa: E402
from benchmarks import compile_report  # noqa: E402
from examples.llama import optimizers  # noqa: E402

# The leaf shapes of the checks: LLaMA-7B's MLP weight, and one whose fold
# axis ends in a short tail block.
SHAPES = [(4096, 11008), (4098, 11000)]


def _bytes(tx, shape, dtype):
  params = {"up_proj": {"kernel": jax.ShapeDtypeStruct(shape, dtype)}}
  return compile_report.measure_update(tx, params, "h100")


def test_the_target_description_parses_and_says_h100():
  text = deviceless.target_config()
  assert "core_count: 132" in text and "major: 9" in text
  (device,) = deviceless.devices("h100", 1)  # The CUDA plugin parsed it.
  assert device.platform == "gpu", device
  assert device.device_kind == "NVIDIA H100 80GB HBM3", device.device_kind


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_foam_moves_less_than_adamw(shape, dtype):
  adamw = _bytes(optax.adamw(1e-3), shape, dtype)
  foam = _bytes(foam_jax.foam(1e-3), shape, dtype)
  ratio = foam["bytes_accessed"] / adamw["bytes_accessed"]
  # Two kernels at level 2: 5.5 weight-sizes against Adam's 7 (0.786).
  assert ratio <= 0.79, (ratio, foam, adamw)
  assert foam["temp_per_weight"] <= 0.5, foam


@pytest.mark.parametrize("shape", SHAPES)
def test_folded_lion_and_muon_move_no_more_than_optax(shape):
  dtype = jnp.bfloat16
  assert (_bytes(foam_jax.foam_lion(1e-3), shape, dtype)["bytes_accessed"]
          <= _bytes(optax.lion(1e-3), shape, dtype)["bytes_accessed"])
  assert (_bytes(foam_jax.foam_muon(1e-3), shape, dtype)["bytes_accessed"]
          <= _bytes(optax.contrib.muon(1e-3), shape, dtype)["bytes_accessed"])


@pytest.mark.parametrize("shape", SHAPES)
def test_fold_axis_minus_one_moves_no_more_than_adamw(shape):
  dtype = jnp.bfloat16
  along_last = foam_jax.foam(1e-3, fold_spec=optimizers.fold_along(-1, None))
  assert (_bytes(along_last, shape, dtype)["bytes_accessed"]
          <= _bytes(optax.adamw(1e-3), shape, dtype)["bytes_accessed"])


@pytest.mark.parametrize("make", [
    lambda: foam_jax.foam(1e-3),
    lambda: foam_jax.foam(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    lambda: foam_jax.foam_lion(1e-3),
], ids=["foam", "foam_int8", "foam_lion"])
@pytest.mark.parametrize("mesh_shape", [{"fsdp": 8, "tp": 1}, {"fsdp": 4, "tp": 2}])
def test_the_sharded_update_has_no_collectives(mesh_shape, make):
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = jax.sharding.Mesh(
      np.array(deviceless.devices("h100", 8), dtype=object).reshape(
          mesh_shape["fsdp"], mesh_shape["tp"]), ("fsdp", "tp"))
  sharding = NamedSharding(mesh, P("fsdp", "tp"))  # The example's MLP kernel.
  params = {"up_proj": {"kernel": jax.ShapeDtypeStruct((4096, 11008), jnp.bfloat16,
                                                        sharding=sharding)}}
  tx = make()
  state = foam_jax.sharding.abstract_state(tx, params)  # Each leaf sharded like its param.

  def step(p, s, g):
    u, s2 = tx.update(g, s, p)
    return optax.apply_updates(p, u), s2

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
  assert deviceless.counts(compiled)["collectives"] == {}

