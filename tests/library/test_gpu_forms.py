"""The GPU forms of the update, run on the CPU against the float64 references.

On GPUs the update takes other forms of the same values, chosen at lowering
with ``jax.lax.platform_dependent``: the residual's block mean summed from
each block's own entries (``folding.shifted_block_sums``) and folded float
moments read back as stored through an ``optimization_barrier``. On a CPU
the lowering takes the default branch, so these tests make
``platform_dependent`` take the ``cuda`` branch and rerun the float64
reference tests (and int8's) through it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_folded_optimizers
import test_quantize
import test_transform

from foam_jax._src import folding


@pytest.fixture
def gpu_branches(monkeypatch):
  """``jax.lax.platform_dependent`` takes the ``cuda`` branch; counts the calls."""
  taken = []

  def as_on_gpu(*args, default=None, **branches):
    taken.append("cuda" in branches)
    return branches.get("cuda", default)(*args)

  monkeypatch.setattr(jax.lax, "platform_dependent", as_on_gpu)
  return taken


@pytest.mark.parametrize("k", [2, 4, 8, 16])
@pytest.mark.parametrize("n", [16, 13])
def test_shifted_block_sums_are_each_entrys_block_sum(k, n):
  level = k.bit_length() - 1
  k = folding.block_size(n, level)  # The whole axis where it is shorter than a block.
  rng = np.random.default_rng(k + n)
  x = rng.standard_normal((n, 5)).astype(np.float32)
  padded = np.concatenate([x, np.zeros((-n % k, 5), np.float32)]).astype(np.float64)
  expected = np.repeat(padded.reshape(-1, k, 5).sum(axis=1, keepdims=True), k, axis=1)
  got = jax.jit(lambda x: folding.shifted_block_sums(folding.to_blocks(x, 0, level), 0))(
      jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reference_test, args", [
    (test_transform.test_foam_matches_float64_reference_default_policy, ()),
    (test_transform.test_eps_root_and_nesterov_match_float64_reference, (False, "step_size")),
    (test_transform.test_eps_root_and_nesterov_match_float64_reference, (True, "step_size")),
    (test_transform.test_eps_root_and_nesterov_match_float64_reference,
     (True, "folded_moments")),
    (test_transform.test_complex_params_match_float64_reference, ("mean_of_squares",)),
    (test_transform.test_complex_params_match_float64_reference, ("square_of_mean",)),
    (test_transform.test_low_precision_states_track_float32_states, ()),
    (test_folded_optimizers.test_foam_lion_matches_float64_reference, ()),
    (test_folded_optimizers.test_foam_muon_matches_float64_reference, (True,)),
    (test_folded_optimizers.test_foam_muon_matches_float64_reference, (False,)),
    (test_quantize.test_update_reads_the_new_moments_and_stores_them_within_the_code_error, ()),
], ids=lambda x: x.__name__ if callable(x) else str(x))
def test_reference_tests_pass_on_gpu_branches(gpu_branches, reference_test, args):
  reference_test(*args)
  assert any(gpu_branches)
