"""FOAM's TPU kernels (folded Adam, folded Lion), in Pallas's interpreter on CPU.

Their numerics against the float64 reference at the XLA path's tolerance
(every bias-correction form, Nesterov, both second moments, Lion's modes,
levels 1-4, tail blocks, stacked leaves), the state they write continuing on
the XLA path, what they cover, the traffic their grid implies, and where
they run on a mesh.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tpu_harness
from reference import NumpyFoam
from reference_folded import NumpyFoldedLion

import foam_jax
from foam_jax._src import tpu_adam
from foam_jax._src import tpu_dispatch
from foam_jax._src import tpu_folded
from foam_jax._src import tpu_lion

# name: (shape, fold level or None for Adam, covered by the kernel).
LEAVES = {
    "l1": ((64, 128), 1, True),
    "l2": ((64, 256), 2, True),
    "l3_tail": ((266, 128), 3, True),    # 34 blocks of 8, the last of 2: two row tiles
    "l4_stacked": ((2, 64, 128), 4, True),
    "l2_partial_cols": ((256, 200), 2, True),   # a partial column tile
    "narrow": ((16, 6), 2, False),       # fewer than 128 columns: XLA
    "one_tile_tail": ((30, 128), 2, False),  # a tail block in a single tile: XLA
    "bias": ((7,), None, False),
    "embed": ((20, 130), None, False),
}
LEAVES_AXIS = tpu_harness.Leaves(LEAVES, axis=-2)
SHAPES, RULES, fold_spec = LEAVES_AXIS.shapes, LEAVES_AXIS.rules, LEAVES_AXIS.fold_spec
_grads = LEAVES_AXIS.grads


def _kernel_calls(tx, params, state, name=tpu_adam.KERNEL_NAME):
  return tpu_harness.kernel_calls(tx, params, state, name)


def _run(tx, ref, steps=6, seed=0, name=tpu_adam.KERNEL_NAME):
  return tpu_harness.run_against_reference(tx, ref, LEAVES_AXIS, name, steps, seed)


@pytest.mark.parametrize("bias_correction", ["step_size", "folded_moments"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_the_kernel_matches_the_float64_reference(bias_correction, nesterov):
  hp = dict(lr=3e-2, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, alpha=0.25, c=0.7,
            eps_root=1e-3, nesterov=nesterov, bias_correction=bias_correction)
  tx = foam_jax.foam(hp["lr"], hp["b1"], hp["b2"], hp["eps"], hp["eps_root"], None,
                     hp["wd"], alpha=hp["alpha"], residual_scale=hp["c"], nesterov=nesterov,
                     bias_correction=bias_correction, fold_spec=fold_spec)
  _run(tx, NumpyFoam(RULES, **hp))


def test_the_kernel_matches_the_reference_with_the_square_of_the_mean():
  hp = dict(lr=1e-2, b1=0.8, b2=0.99, eps=1e-8, alpha=1.0, c=1.0,
            second_moment="square_of_mean")
  tx = foam_jax.foam(hp["lr"], hp["b1"], hp["b2"], hp["eps"], weight_decay=0.0,
                     second_moment="square_of_mean", fold_spec=fold_spec)
  _run(tx, NumpyFoam(RULES, **hp))


def test_optax_moments_form_matches_the_reference_where_the_forms_coincide():
  # eps = eps_root = 0: correcting the moments or the step size is the same.
  hp = dict(lr=1e-2, b1=0.9, b2=0.999, eps=0.0, alpha=0.5, c=1.0)
  tx = foam_jax.foam(hp["lr"], eps=0.0, weight_decay=0.0, alpha=0.5,
                     bias_correction="moments", fold_spec=fold_spec)
  _run(tx, NumpyFoam(RULES, **hp))


def test_the_lion_kernel_matches_the_float64_reference():
  hp = dict(lr=1e-2, b1=0.9, b2=0.99, wd=0.1, c=0.7)
  tx = foam_jax.foam_lion(hp["lr"], b1=hp["b1"], b2=hp["b2"], weight_decay=hp["wd"],
                          residual_scale=hp["c"], fold_spec=fold_spec)
  _run(tx, NumpyFoldedLion(RULES, **hp), name=tpu_lion.KERNEL_NAME)


@pytest.mark.parametrize("mode", ["hard", "smooth", "refined"])
def test_the_lion_kernel_and_the_xla_path_agree(mode):
  """Three kernel steps; the XLA path from each step's input state agrees."""
  tx = foam_jax.scale_by_folded_lion(mode=mode, smooth_beta=3.0, fold_spec=fold_spec)
  rng = np.random.default_rng(4)
  params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
  state, kernel_steps = tx.init(params), []
  # One interpreter block (entering and leaving it clears JAX's caches): one trace per path.
  with tpu_dispatch.interpret():
    kernel_update = jax.jit(tx.update)
    for _ in range(3):
      grads = jax.tree.map(jnp.asarray, _grads(rng, params))
      u, new_state = kernel_update(grads, state)
      kernel_steps.append((state, grads, u, new_state))
      state = new_state
  xla_update = jax.jit(tx.update)
  for state, grads, u, new_state in kernel_steps:
    u_xla, s_xla = xla_update(grads, state)
    for k in SHAPES:
      np.testing.assert_allclose(u[k], u_xla[k], rtol=1e-5, atol=1e-6, err_msg=k)
      np.testing.assert_allclose(new_state.mu[k], s_xla.mu[k], rtol=1e-6, atol=1e-7,
                                 err_msg=k)


def test_the_kernel_and_the_xla_path_agree_and_share_the_state():
  """Three steps on either path, then three on the other: the same run.

  The moments' update is the same for every bias-correction form (each
  form's update is checked against the float64 reference above).
  """
  tx = foam_jax.foam(1e-2, weight_decay=0.0, fold_spec=fold_spec)
  rng = np.random.default_rng(1)
  params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
  grads = [jax.tree.map(jnp.asarray, _grads(rng, params)) for _ in range(6)]

  steps = tpu_harness.steps
  xla_update = jax.jit(tx.update)
  xla_half_p, xla_half_s = steps(xla_update, params, tx.init(params), grads[:3])
  xla_p, xla_s = steps(xla_update, xla_half_p, xla_half_s, grads[3:])
  # The kernel's steps in one interpreter block (entering and leaving it clears
  # JAX's caches): the first three of one run, the last three of the other.
  with tpu_dispatch.interpret():
    kernel_update = jax.jit(tx.update)
    kernel_first = steps(kernel_update, params, tx.init(params), grads[:3])
    kernel_last = steps(kernel_update, xla_half_p, xla_half_s, grads[3:])
  kernel_then_xla = steps(xla_update, *kernel_first, grads[3:])
  for p, s in (kernel_then_xla, kernel_last):
    assert jax.tree.structure(s) == jax.tree.structure(xla_s)
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(xla_s)):
      assert a.shape == b.shape and a.dtype == b.dtype
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), p, xla_p)


def test_bfloat16_weights_and_moments_agree_with_the_xla_path():
  tpu_harness.check_bfloat16_against_xla(
      foam_jax.foam(1e-2, weight_decay=0.0, fold_spec=fold_spec), LEAVES_AXIS)


def test_absent_and_masked_leaves_pass_through_the_kernel_path():
  params = {"w": jnp.ones((64, 128)), "frozen": jnp.ones((64, 128)), "gone": None}
  tx = optax.masked(foam_jax.foam(1e-2), {"w": True, "frozen": False, "gone": False})
  state = tx.init(params)
  grads = {"w": jnp.full((64, 128), 0.5), "frozen": jnp.ones((64, 128)), "gone": None}
  with tpu_dispatch.interpret():
    u, _ = jax.jit(tx.update)(grads, state, params)
  u_xla, _ = jax.jit(tx.update)(grads, state, params)
  assert u["gone"] is None
  np.testing.assert_array_equal(u["frozen"], grads["frozen"])
  np.testing.assert_allclose(u["w"], u_xla["w"], rtol=1e-6)


def test_8_bit_moments_stay_on_the_xla_path():
  params = {"w": jnp.ones((64, 128))}
  tx = foam_jax.foam(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  state = tx.init(params)
  with tpu_dispatch.interpret():
    assert _kernel_calls(tx, params, state) == 0


@pytest.mark.parametrize("shape,axis,level,dtype,covered", [
    ((4096, 11008), 0, 2, "bfloat16", True),
    ((4098, 11000), 0, 2, "float32", True),     # tail block, partial tiles
    ((4, 4096, 4096), 1, 4, "bfloat16", True),  # scanned layers
    ((4096, 11008), 1, 2, "bfloat16", False),   # fold axis -1
    ((4096, 11008), 0, 5, "bfloat16", False),   # blocks of 32 rows
    ((4096, 64), 0, 2, "float32", False),       # fewer than 128 columns
    ((4096,), 0, 2, "float32", False),
    ((64, 128), 0, 2, "float64", False),
    ((64, 128), 0, 2, "complex64", False),
])
def test_what_the_kernel_covers(shape, axis, level, dtype, covered):
  assert (tpu_folded.plan(shape, axis, level, dtype) is not None) == covered


@pytest.mark.parametrize("shape,level", [((4096, 11008), 2), ((4098, 11000), 3),
                                         ((3, 300, 640), 1), ((64, 128), 4)])
def test_each_block_is_copied_once_and_the_traffic_is_the_operands(shape, level):
  kplan = tpu_folded.plan(shape, len(shape) - 2, level, "bfloat16")
  grid = kplan.grid
  for name, visits in tpu_folded.block_visits(kplan).items():
    assert len(visits) == len(set(visits)) == int(np.prod(grid)), name
  rows = kplan.folded_rows
  folded = int(np.prod(shape[:-2])) * rows * shape[-1]
  # bf16 gradient in and u out; float32 moments in and out.
  expected = 2 * int(np.prod(shape)) * 2 + 2 * folded * (4 + 4)
  assert tpu_folded.hbm_bytes(kplan, "bfloat16", "float32", "float32") == expected


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
@pytest.mark.parametrize("shape,spec,per_shard", [
    ((512, 256), ("fsdp", "tp"), True),
    ((2, 256, 256), (None, "fsdp", "tp"), True),
    ((512, 256), (None, "fsdp"), False),   # shards of 64 columns: XLA
    ((516, 256), ("fsdp", None), False),   # shards that split a fold block: XLA
])
def test_sharded_updates_run_per_shard_without_collectives(axis_type, shape, spec, per_shard):
  from jax.sharding import AxisType
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from benchmarks import hlo

  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((4, 2), ("fsdp", "tp"), axis_types=(getattr(AxisType, axis_type),) * 2)
  sharding = NamedSharding(mesh, P(*spec))
  rng = np.random.default_rng(3)
  params = {"w": jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32), sharding)}
  grads = {"w": jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32), sharding)}
  tx = foam_jax.foam(1e-2)
  with jax.set_mesh(mesh):
    state = jax.jit(tx.init)(params)
    u_xla, _ = jax.jit(tx.update)(grads, state, params)
    xla_compiled = jax.jit(tx.update).lower(grads, state, params).compile().as_text()
    with tpu_dispatch.interpret():
      update = jax.jit(tx.update)
      u, s = update(grads, state, params)
      compiled = update.lower(grads, state, params).compile().as_text()
      calls = _kernel_calls(tx, grads, state)
  # The kernel runs per shard where the sharding is in the types; with
  # Auto axes (not known when traced) the update is XLA's.
  assert (calls > 0) == (per_shard and axis_type == "Explicit")
  # No collective where the kernel runs; elsewhere what the XLA path has.
  assert hlo.count_collectives(compiled) == hlo.count_collectives(xla_compiled)
  if per_shard:
    assert not any(hlo.count_collectives(compiled).values())
  assert u["w"].sharding.spec == u_xla["w"].sharding.spec
  np.testing.assert_allclose(np.asarray(u["w"]), np.asarray(u_xla["w"]), rtol=1e-6, atol=1e-7)
