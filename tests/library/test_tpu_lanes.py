"""FOAM's TPU kernels for a fold along the last axis, in Pallas's interpreter on CPU.

The MXU fold and spread (``foam_jax._src.tpu_lanes``): exact splits into
bfloat16 parts, non-finite entries kept in their own block, the kernels'
numerics against the float64 reference at the XLA path's tolerance (both
second moments, both bias-correction forms, Lion, levels 1-4, partial tiles,
stacked leaves), the state they write continuing on the XLA path, what they
cover, and the traffic their grid implies.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tpu_harness
from reference import NumpyFoam
from reference_folded import NumpyFoldedLion

import foam_jax
from foam_jax import FoldSpec
from foam_jax._src import tpu_adam
from foam_jax._src import tpu_dispatch
from foam_jax._src import tpu_folded
from foam_jax._src import tpu_lanes
from foam_jax._src import tpu_lion

# name: (shape, fold level along the last axis or None for Adam, covered by the kernel).
LEAVES = {
    "l1_rows_tail": ((520, 256), 1, True),   # two row tiles of 512, the second of 8
    "l2_partial_cols": ((24, 1600), 2, True),  # 400 folded lanes: a partial lane tile
    "l2_column_major": ((640, 1200), 2, True),  # moments stored column-major: 3 row tiles
    "l4_stacked": ((2, 16, 2048), 4, True),
    "tail_block": ((16, 1030), 2, False),    # 1030 = 257 blocks of 4 and one of 2: XLA
    "narrow": ((16, 256), 2, False),         # 64 folded lanes: XLA
    "bias": ((7,), None, False),
}
LEAVES_AXIS = tpu_harness.Leaves(LEAVES, axis=-1)
SHAPES, RULES, fold_spec = LEAVES_AXIS.shapes, LEAVES_AXIS.rules, LEAVES_AXIS.fold_spec
_grads = LEAVES_AXIS.grads
_kernel_calls = tpu_harness.kernel_calls


def test_split_parts_sum_to_the_value_exactly():
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096),
                      [3.4e38, -3.4028235e38, 1.0 + 2.0**-23, 1e-38, 0.0, -0.0]])
  x = jnp.asarray(x, jnp.float32)
  parts = tpu_lanes.split(x, 3)
  assert all(p.dtype == jnp.bfloat16 for p in parts)
  total = parts[2].astype(jnp.float32) + parts[1].astype(jnp.float32) + parts[0].astype(
      jnp.float32)
  normal = np.abs(np.asarray(x)) >= 2.0**-100  # Below, the smallest part is subnormal.
  np.testing.assert_array_equal(np.asarray(total)[normal], np.asarray(x)[normal])
  # bfloat16 squares need two parts, bfloat16 values one.
  b = jnp.asarray(rng.standard_normal(1024), jnp.bfloat16).astype(jnp.float32)
  two = tpu_lanes.split(b * b, 2)
  np.testing.assert_array_equal(two[0].astype(jnp.float32) + two[1].astype(jnp.float32), b * b)


def test_fold_and_spread_keep_non_finite_entries_in_their_block():
  k = 4
  x = np.arange(8 * 512, dtype=np.float32).reshape(8, 512) / 7.0
  x[0, 1], x[1, 6], x[1, 7], x[2, 9], x[3, 12], x[3, 13] = (
      np.inf, np.nan, np.inf, -np.inf, np.inf, -np.inf)
  ones = tpu_lanes.fold_matrix(k)
  mean = np.asarray(tpu_lanes.fold(jnp.asarray(x), ones, k))
  with np.errstate(invalid="ignore"):  # inf - inf
    want = x.astype(np.float64).reshape(8, 128, k).mean(-1)
  np.testing.assert_allclose(mean, want, rtol=1e-6)  # NaN where NumPy has NaN
  assert np.isfinite(mean).sum() == np.isfinite(want).sum() == 8 * 128 - 4
  folded = want.astype(np.float32)
  back = np.asarray(tpu_lanes.spread(jnp.asarray(folded), ones.T))
  np.testing.assert_array_equal(back, np.repeat(folded, k, axis=-1))


def _run(tx, ref, name):
  tpu_harness.run_against_reference(tx, ref, LEAVES_AXIS, name, steps=5)


@pytest.mark.parametrize("second_moment,bias_correction", [
    ("mean_of_squares", "step_size"), ("square_of_mean", "folded_moments")])
def test_the_kernel_matches_the_float64_reference(second_moment, bias_correction):
  hp = dict(lr=3e-2, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, alpha=0.25, c=0.7, eps_root=1e-3,
            nesterov=True, bias_correction=bias_correction, second_moment=second_moment)
  tx = foam_jax.foam(hp["lr"], hp["b1"], hp["b2"], hp["eps"], hp["eps_root"], None, hp["wd"],
                     alpha=hp["alpha"], residual_scale=hp["c"], nesterov=True,
                     bias_correction=bias_correction, second_moment=second_moment,
                     fold_spec=fold_spec)
  _run(tx, NumpyFoam(RULES, **hp), tpu_adam.KERNEL_NAME)


def test_the_lion_kernel_matches_the_float64_reference():
  hp = dict(lr=1e-2, b1=0.9, b2=0.99, wd=0.1, c=0.7)
  tx = foam_jax.foam_lion(hp["lr"], b1=hp["b1"], b2=hp["b2"], weight_decay=hp["wd"],
                          residual_scale=hp["c"], fold_spec=fold_spec)
  _run(tx, NumpyFoldedLion(RULES, **hp), tpu_lion.KERNEL_NAME)


def test_the_kernel_and_the_xla_path_share_the_state_and_its_faults():
  """Three steps on either path, then two on the other: the same run, NaNs in the same blocks."""
  tx = foam_jax.foam(1e-2, weight_decay=0.0, fold_spec=fold_spec)
  rng = np.random.default_rng(1)
  params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
  grads = [_grads(rng, params) for _ in range(5)]
  grads[1]["l1_rows_tail"][3, 5] = np.inf        # one block's second moment: inf
  grads[2]["l2_partial_cols"][7, 9] = np.nan     # one block: NaN from here on
  grads = [jax.tree.map(jnp.asarray, g) for g in grads]

  steps = tpu_harness.steps
  xla_update = jax.jit(tx.update)
  xla_half = steps(xla_update, params, tx.init(params), grads[:3])
  xla_p, xla_s = steps(xla_update, *xla_half, grads[3:])
  with tpu_dispatch.interpret():  # One block: entering and leaving clears JAX's caches.
    kernel_update = jax.jit(tx.update)
    kernel_first = steps(kernel_update, params, tx.init(params), grads[:3])
    kernel_last = steps(kernel_update, *xla_half, grads[3:])
  kernel_then_xla = steps(xla_update, *kernel_first, grads[3:])
  for p, s in (kernel_then_xla, kernel_last):
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(xla_s)):
      assert a.shape == b.shape and a.dtype == b.dtype
      np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    for k in SHAPES:
      np.testing.assert_array_equal(np.isnan(p[k]), np.isnan(xla_p[k]), err_msg=k)
      np.testing.assert_allclose(p[k], xla_p[k], rtol=2e-5, atol=2e-6, err_msg=k)
  assert 0 < np.isnan(xla_p["l2_partial_cols"]).sum() < xla_p["l2_partial_cols"].size


def test_bfloat16_weights_and_moments_agree_with_the_xla_path():
  tpu_harness.check_bfloat16_against_xla(
      foam_jax.foam(1e-2, weight_decay=0.0, fold_spec=fold_spec), LEAVES_AXIS)


@pytest.mark.parametrize("shape,level,dtype,covered", [
    ((4096, 11008), 2, "bfloat16", True),
    ((4098, 11000), 2, "float32", True),     # partial tiles both ways
    ((4, 4096, 4096), 4, "bfloat16", True),  # scanned layers
    ((4096, 11002), 2, "bfloat16", False),   # a tail block
    ((4096, 1024), 5, "bfloat16", False),    # blocks of 32 lanes
    ((4096, 256), 2, "float32", False),      # 64 folded lanes
    ((4096,), 2, "float32", False),
    ((64, 512), 2, "float64", False),
])
def test_what_the_kernel_covers(shape, level, dtype, covered):
  axis = len(shape) - 1
  assert (tpu_lanes.plan(shape, axis, level, dtype) is not None) == covered
  assert tpu_folded.covers(shape, axis, level, dtype) == covered


@pytest.mark.parametrize("shape,dtype,column_major", [
    ((4096, 2752), "bfloat16", True),    # rows whole tiles, lanes not
    ((4098, 2752), "bfloat16", False),   # row-major pads less
    ((640, 300), "float32", True),
    ((24, 400), "float32", False),
    ((128, 128), "float32", False),      # a tie stays row-major
])
def test_which_moments_the_compiler_stores_column_major(shape, dtype, column_major):
  # The TPU compiler's choices for these shapes (libtpu 0.0.42.1, compiled
  # without a device); the layout only moves bytes, never values.
  assert tpu_lanes.column_major(shape, dtype) == column_major


@pytest.mark.parametrize("shape,level", [((4096, 11008), 2), ((4098, 11000), 3),
                                         ((3, 600, 640), 1), ((8, 2048), 4)])
def test_each_block_is_copied_once_and_the_traffic_is_the_operands(shape, level):
  lplan = tpu_lanes.plan(shape, len(shape) - 1, level, "bfloat16")
  visits = tpu_lanes.block_visits(lplan)
  for name in ("gradient", "moments"):
    assert len(visits[name]) == len(set(visits[name])) == int(np.prod(lplan.grid)), name
  assert visits["matrices"] == [(0, 0, 0)]
  folded = int(np.prod(shape)) // lplan.block
  # bf16 gradient in and u out; float32 moments in and out; the 0/1 matrices in.
  expected = 2 * int(np.prod(shape)) * 2 + 2 * folded * (4 + 4) + 2 * 128 * 128 * lplan.block * 2
  assert tpu_lanes.hbm_bytes(lplan, "bfloat16", "float32", "float32") == expected


@pytest.mark.parametrize("spec,per_shard", [
    (("fsdp", "tp"), True),   # (512, 2048) in shards of (128, 1024): 256 folded lanes
    (("tp", "fsdp"), False),  # (256, 1024) in shards of (128, 256): 64 folded lanes, XLA
])
def test_a_sharded_leaf_runs_per_shard_without_collectives(spec, per_shard):
  from jax.sharding import AxisType
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from benchmarks import hlo

  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  shape = (512, 2048) if per_shard else (256, 1024)
  mesh = jax.make_mesh((4, 2), ("fsdp", "tp"), axis_types=(AxisType.Explicit,) * 2)
  sharding = NamedSharding(mesh, P(*spec))
  rng = np.random.default_rng(3)
  params = {"w": jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32), sharding)}
  grads = {"w": jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32), sharding)}
  along_last = lambda p: jax.tree.map(lambda _: FoldSpec(axis=-1, level=2), p)  # noqa: E731
  tx = foam_jax.foam(1e-2, fold_spec=along_last)
  with jax.set_mesh(mesh):
    state = jax.jit(tx.init)(params)
    u_xla, _ = jax.jit(tx.update)(grads, state, params)
    with tpu_dispatch.interpret():
      update = jax.jit(tx.update)
      u, _ = update(grads, state, params)
      compiled = update.lower(grads, state, params).compile().as_text()
      calls = _kernel_calls(tx, grads, state, tpu_adam.KERNEL_NAME)
  assert (calls > 0) == per_shard
  if per_shard:
    assert not any(hlo.count_collectives(compiled).values())
  assert u["w"].sharding.spec == u_xla["w"].sharding.spec
  np.testing.assert_allclose(np.asarray(u["w"]), np.asarray(u_xla["w"]), rtol=1e-6, atol=1e-7)
