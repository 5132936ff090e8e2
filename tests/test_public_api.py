"""The public surface: what ``foam_jax`` exports, and its deprecated names."""

import warnings

import pytest

import foam_jax

PUBLIC = {
    "FoldSpec", "ScaleByFoamState", "default_fold_specs", "foam", "foam_mini",
    "paper_schedule", "scale_by_foam", "sharding", "state_bytes",
    "foam_muon", "foam_lion", "scale_by_folded_muon", "scale_by_folded_lion",
    "convert_state", "QuantizedMoment", "SignedQuantizedMoment",
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


@pytest.mark.parametrize("name", sorted(foam_jax._DEPRECATED))  # pylint: disable=protected-access
def test_deprecated_names_still_work_and_warn(name):
  with pytest.warns(DeprecationWarning, match=f"foam_jax.{name} is deprecated"):
    value = getattr(foam_jax, name)
  assert value is not None


def test_deprecated_aliases_are_the_real_objects():
  with pytest.warns(DeprecationWarning):
    assert foam_jax.state_shardings is foam_jax.sharding.state_shardings
  with pytest.warns(DeprecationWarning):
    memory = foam_jax.memory
  assert memory.state_bytes is foam_jax.state_bytes


def test_unknown_names_raise_attribute_error():
  with pytest.raises(AttributeError, match="no attribute 'adamw'"):
    _ = foam_jax.adamw
