"""fold / unfold / residual: against the loop reference, and their algebra."""

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import np_fold
from reference import np_unfold

from foam_jax._src import folding

SETTINGS = hypothesis.settings(max_examples=30, deadline=None, derandomize=True)

# The property tests call the functions jitted (axis, level and length
# static), as the transforms do: one compile per drawn shape rather than one
# per operation.
fold = jax.jit(folding.fold, static_argnums=(1, 2))
unfold = jax.jit(folding.unfold, static_argnums=(1, 2, 3))
residual = jax.jit(folding.residual, static_argnums=(1, 2))


@st.composite
def array_axis_level(draw):
  """A float64 array of rank 1-4 (sizes 0-9), one of its axes, a level 0-4."""
  shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=9))
  x = draw(
      hnp.arrays(
          np.float64,
          shape,
          elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
      )
  )
  axis = draw(st.integers(-len(shape), len(shape) - 1))
  level = draw(st.integers(0, 4))
  return x, axis, level


@pytest.fixture(autouse=True, scope="module")
def _x64():
  with jax.enable_x64(True):
    yield


@SETTINGS
@hypothesis.given(array_axis_level())
def test_fold_matches_loop_reference_and_keeps_rank(case):
  x, axis, level = case
  got = np.asarray(fold(jnp.asarray(x), axis, level))
  want = np_fold(x, axis, 2**level)
  assert got.ndim == x.ndim
  assert got.shape == folding.folded_shape(x.shape, axis, level)
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@SETTINGS
@hypothesis.given(array_axis_level())
def test_unfold_of_fold_plus_residual_is_identity(case):
  x, axis, level = case
  n = x.shape[axis]
  xj = jnp.asarray(x)
  folded = fold(xj, axis, level)
  back = unfold(folded, axis, level, n)
  res = residual(xj, axis, level)
  assert back.shape == x.shape and res.shape == x.shape
  np.testing.assert_allclose(np.asarray(back + res), x, rtol=1e-12, atol=1e-9)
  np.testing.assert_allclose(
      np.asarray(back), np_unfold(np_fold(x, axis, 2**level), axis, 2**level, n),
      rtol=1e-12, atol=1e-9,
  )


@SETTINGS
@hypothesis.given(array_axis_level())
def test_residual_has_zero_mean_in_every_block(case):
  x, axis, level = case
  res = np.asarray(residual(jnp.asarray(x), axis, level))
  block_means = np_fold(res, axis, 2**level)
  scale = max(1.0, float(np.abs(x).max(initial=0.0)))
  np.testing.assert_allclose(block_means, 0.0, atol=1e-12 * scale * 10)


@SETTINGS
@hypothesis.given(array_axis_level())
def test_projection_is_idempotent(case):
  x, axis, level = case
  n = x.shape[axis]
  project = lambda y: unfold(fold(y, axis, level), axis, level, n)
  once = project(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(project(once)), np.asarray(once),
                             rtol=1e-12, atol=1e-9)


def test_tail_block_is_averaged_over_its_true_length():
  x = jnp.arange(10.0)
  # Blocks of 4: [0..3], [4..7], [8, 9] -> means 1.5, 5.5, 8.5 (not 17/4).
  np.testing.assert_array_equal(np.asarray(folding.fold(x, 0, 2)), [1.5, 5.5, 8.5])


def test_block_larger_than_axis_folds_whole_axis():
  x = jnp.arange(12.0).reshape(3, 4)
  got = folding.fold(x, axis=-1, level=5)
  assert got.shape == (3, 1)
  np.testing.assert_allclose(np.asarray(got[:, 0]), [1.5, 5.5, 9.5])
  assert folding.fold(x, 0, 62).shape == (1, 4)
  assert folding.fold(x, 0, folding.whole_axis_level(3)).shape == (1, 4)


def test_level_zero_is_identity():
  x = jnp.arange(6.0).reshape(2, 3)
  np.testing.assert_array_equal(np.asarray(folding.fold(x, 0, 0)), np.asarray(x))
  np.testing.assert_array_equal(np.asarray(folding.residual(x, 0, 0)), 0.0)


def test_zero_size_axis():
  x = jnp.zeros((0, 5))
  assert folding.fold(x, 0, 2).shape == (0, 5)
  assert folding.residual(x, 0, 2).shape == (0, 5)


def test_fold_has_no_gathers():
  hlo = jax.jit(lambda x: folding.residual(x, -2, 2)).lower(
      jnp.zeros((10, 6), jnp.float32)).as_text()
  assert "gather" not in hlo


def test_out_of_range_axis_raises():
  with pytest.raises(ValueError, match="axis 2 is out of range"):
    folding.fold(jnp.zeros((4, 4)), axis=2, level=1)


def test_state_size_formula():
  # 2 * ceil(n / k) * (size / n) elements per folded leaf (both moments).
  for shape, axis, level in [((5461, 2048), 0, 2), ((3, 10, 7), 1, 3), ((9, 4), -1, 1)]:
    n = shape[axis]
    want = -(-n // 2**level) * int(np.prod(shape)) // n
    assert folding.state_size(shape, axis, level) == want
  assert folding.state_size((7, 3), None, 2) == 21
