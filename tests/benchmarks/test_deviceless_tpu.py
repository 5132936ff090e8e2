"""The update as the TPU compiler counts it, compiled without a TPU.

Counts from a compiler, not timings: the donated step ``tx.update`` then
``optax.apply_updates`` compiled for TPU v5e through libtpu
(``benchmarks.deviceless``), with the Pallas kernel's HBM traffic added to
the compiler's count (``deviceless.pallas_kernel_bytes``: libtpu counts a
kernel as moving nothing). These tests need libtpu (``jax[tpu]`` of the
installed jax, as ``.ci/run``'s deviceless step installs it) and are marked
``deviceless``: the default run deselects them, that step runs them.
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.deviceless,
    pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu"),
]

from benchmarks import deviceless  # noqa: E402

deviceless.configure_environment("v5e")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import foam_jax  # noqa: E402
from benchmarks import compile_report  # noqa: E402

# LLaMA-7B's MLP weight, and one whose fold axis ends in a short tail block
# and whose columns are no multiple of the 128 lanes.
SHAPES = [(4096, 11008), (4098, 11000)]


def _counts(tx, shape, dtype):
  params = {"up_proj": {"kernel": jax.ShapeDtypeStruct(shape, dtype)}}
  return compile_report.measure_update(tx, params, "v5e")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_foam_moves_at_most_nine_tenths_of_adamw(shape, dtype):
  adamw = _counts(optax.adamw(1e-3), shape, dtype)
  foam = _counts(foam_jax.foam(1e-3), shape, dtype)
  # The kernel reads the gradient and the folded moments and writes the
  # moments and u (3 weight-sizes at level 2 in bf16); apply_updates reads
  # u and the weight and writes the weight (3): 6 of Adam's 7.
  assert foam["kernel_bytes"] > 0, foam
  ratio = foam["bytes_accessed"] / adamw["bytes_accessed"]
  assert ratio <= 0.90, (ratio, foam, adamw)
  assert foam["collectives"] == {}
  if dtype == jnp.bfloat16:
    assert foam["temp_per_weight"] <= 0.5, foam


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_the_sharded_update_has_no_collectives(axis_type):
  """fsdp=4, tp=2 on 8 chips, the example's MLP kernel sharding."""
  mesh = jax.sharding.Mesh(np.array(deviceless.devices("v5e", 8), dtype=object).reshape(4, 2),
                           ("fsdp", "tp"), axis_types=(axis_type,) * 2)
  sharding = NamedSharding(mesh, P("fsdp", "tp"))
  params = {"up_proj": {"kernel": jax.ShapeDtypeStruct((4096, 11008), jnp.bfloat16,
                                                        sharding=sharding)}}

  def compiled_counts(tx):
    state = foam_jax.sharding.abstract_state(tx, params)

    def step(p, s, g):
      u, s2 = tx.update(g, s, p)
      return optax.apply_updates(p, u), s2

    return deviceless.counts(
        jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile())

  foam, adamw = compiled_counts(foam_jax.foam(1e-3)), compiled_counts(optax.adamw(1e-3))
  assert foam["collectives"] == {}
  if axis_type == AxisType.Explicit:  # The kernel runs per shard.
    assert foam["kernel_bytes"] > 0
    assert foam["bytes_accessed"] / adamw["bytes_accessed"] <= 0.90, (foam, adamw)


@pytest.mark.parametrize("shape", SHAPES)
def test_folded_lion_runs_its_kernel(shape):
  # The kernel reads the gradient and the folded momentum and writes the
  # momentum and u (2.5 weight-sizes at level 2 in bf16); apply_updates reads
  # u and the weight and writes the weight: 5.5 against optax.lion's one
  # fused kernel (5), where the XLA path moved 28.75 on v5p, 36.5 on v5e.
  lion = _counts(optax.lion(1e-3), shape, jnp.bfloat16)
  folded = _counts(foam_jax.foam_lion(1e-3), shape, jnp.bfloat16)
  assert folded["kernel_bytes"] > 0, folded
  assert folded["bytes_accessed"] / lion["bytes_accessed"] <= 1.11, (folded, lion)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_a_fold_along_the_last_axis_moves_less_than_adamw(shape, dtype):
  # The lanes kernel (foam_jax._src.tpu_lanes) moves what the rows kernel
  # moves; XLA's program for this fold moved 58 weight-sizes on v5e (bf16).
  # (4096, 11008)'s folded moments, (4096, 2752), are stored column-major.
  along_last = lambda params: jax.tree.map(lambda _: foam_jax.FoldSpec(axis=-1, level=2), params)
  adamw = _counts(optax.adamw(1e-3), shape, dtype)
  foam = _counts(foam_jax.foam(1e-3, fold_spec=along_last), shape, dtype)
  assert foam["kernel_bytes"] > 0, foam
  assert foam["bytes_accessed"] / adamw["bytes_accessed"] <= 0.90, (foam, adamw)
  if dtype == jnp.bfloat16:
    assert foam["temp_per_weight"] <= 0.5, foam
