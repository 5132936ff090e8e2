"""The benchmarks' grid names (benchmarks.grid) over the example's families."""

import jax.numpy as jnp
import pytest

from benchmarks import grid
from examples.llama import optimizers


def test_every_grid_name_is_a_family_with_settings_the_family_takes():
  assert set(optimizers.OPTIMIZERS) <= set(grid.NAMES)
  for name in grid.NAMES:
    family, settings = grid.GRID[name]
    assert family in optimizers.OPTIMIZERS
    optimizers.check_fold_settings(
        family, **{k: v for k, v in settings.items() if k.startswith("fold_")})
    optimizers.check_moment_dtypes(
        family, **{k: v for k, v in settings.items() if k.endswith("_dtype")})
    assert grid.DEFAULT_LR[name] == optimizers.DEFAULT_LR[family]


def test_grid_names_build_their_settings():
  params = {"q_proj": jnp.zeros((16, 8))}
  assert grid.make_optimizer("foam_l2_ax1", 1e-3).init(params)[0].mu["q_proj"].shape == (16, 2)
  assert grid.make_optimizer("foam_l3", 1e-3).init(params)[0].mu["q_proj"].shape == (2, 8)
  int8 = grid.make_optimizer("foam_int8", 1e-3).init(params)[0].mu
  assert int8.codes["q_proj"].dtype == jnp.int8
  with pytest.raises(ValueError, match="Unknown optimizer"):
    grid.make_optimizer("foam_l9")


def test_old_names_in_results_files_map_onto_the_grid():
  for old, new in [("foam_l2", "foam"), ("foam-l2", "foam"), ("foam-mini", "foam_mini"),
                   ("foam-l4", "foam_l4"), ("foam-l2-ax-1", "foam_l2_ax1"),
                   ("foam_l1", "foam_l1")]:
    assert grid.canonical_name(old) == new
    assert new in grid.NAMES
