"""The public surface: what ``foam_jax`` exports, and nothing more."""

import warnings

import pytest

import foam_jax

PUBLIC = {
    "FoldPolicy", "FoldSpec", "ScaleByFoamState", "default_fold_specs", "foam", "foam_mini",
    "paper_schedule", "scale_by_foam", "sharding", "state_bytes",
    "foam_muon", "foam_lion", "scale_by_folded_muon", "scale_by_folded_lion",
    "convert_state", "QuantizedMoments",
}
SHARDING = {"Straddle", "abstract_state", "fitted_fold_specs", "pin_layout",
            "state_shardings", "straddling_blocks"}


def test_top_level_exports_exactly_the_public_api():
  assert set(foam_jax.__all__) == PUBLIC
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # Public names never warn.
    for name in PUBLIC:
      assert getattr(foam_jax, name) is not None
    for name in SHARDING:
      assert getattr(foam_jax.sharding, name) is not None
  assert set(foam_jax.sharding.__all__) == SHARDING


def test_unknown_names_raise_attribute_error():
  with pytest.raises(AttributeError, match="no attribute 'adamw'"):
    _ = foam_jax.adamw


@pytest.mark.parametrize("name", ["abstract_state", "state_shardings", "fold", "memory",
                                  "WHOLE_AXIS_LEVEL", "transform"])
def test_pre_release_aliases_are_gone(name):
  with pytest.raises(AttributeError):
    getattr(foam_jax, name)


def test_levanter_module_imports_without_levanter():
  """foam_jax.levanter imports anywhere; its configs need Levanter, and say so."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  import foam_jax.levanter  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec("levanter") is not None:
    assert foam_jax.levanter.is_available()
    return
  assert not foam_jax.levanter.is_available()
  with pytest.raises(ImportError, match="marin-levanter"):
    _ = foam_jax.levanter.FoamConfig
  with pytest.raises(ImportError, match="marin-levanter"):
    foam_jax.levanter.register()
  with pytest.raises(AttributeError):
    _ = foam_jax.levanter.NoSuchName
