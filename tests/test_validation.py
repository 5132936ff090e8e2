"""Bad input fails early with a message that names the culprit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import foam_jax
from foam_jax import FoldSpec

PARAMS = {"layer": {"kernel": jnp.zeros((8, 4)), "bias": jnp.zeros(4)}, "scale": jnp.zeros(())}


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(learning_rate=-1e-3), ValueError, "learning_rate"),
        (dict(learning_rate="fast"), TypeError, "learning_rate"),
        (dict(learning_rate=1e-3, b1=1.0), ValueError, "b1"),
        (dict(learning_rate=1e-3, b1=-0.1), ValueError, "b1"),
        (dict(learning_rate=1e-3, b2=1.5), ValueError, "b2"),
        (dict(learning_rate=1e-3, b2=1.0), ValueError, "b2"),
        (dict(learning_rate=1e-3, eps=-1e-8), ValueError, "eps"),
        (dict(learning_rate=1e-3, eps=float("nan")), ValueError, "eps"),
        (dict(learning_rate=1e-3, fold_level=-1), ValueError, "fold_level"),
        (dict(learning_rate=1e-3, fold_level=1.5), TypeError, "fold_level"),
        (dict(learning_rate=1e-3, fold_level=True), TypeError, "fold_level"),
        (dict(learning_rate=1e-3, weight_decay=-0.1), ValueError, "weight_decay"),
        (dict(learning_rate=1e-3, alpha=-1.0), ValueError, "alpha"),
        (dict(learning_rate=1e-3, residual_scale=-1.0), ValueError, "residual_scale"),
        (dict(learning_rate=1e-3, second_moment="median"), ValueError, "second_moment"),
    ],
)
def test_bad_hyperparameters_raise_at_construction(kwargs, error, match):
  with pytest.raises(error, match=match):
    foam_jax.foam(**kwargs)


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: foam_jax.foam(float("inf")), ValueError, "learning_rate must be finite"),
        (lambda: foam_jax.foam(1e-3, eps=float("inf")), ValueError, "eps must be finite"),
        (lambda: foam_jax.foam(1e-3, nesterov="yes"), TypeError, "nesterov must be a bool"),
        (lambda: foam_jax.foam_muon(1e-3, beta=1.0), ValueError, "beta must be < 1.0"),
        (lambda: foam_jax.scale_by_folded_muon(beta=1.0), ValueError, "beta must be < 1.0"),
        (lambda: foam_jax.foam_muon(1e-3, ns_steps=0), ValueError, "ns_steps must be >= 1"),
        (lambda: foam_jax.foam_muon(1e-3, ns_steps=-1), ValueError, "ns_steps must be >= 1"),
        (lambda: foam_jax.foam_muon(1e-3, ns_steps=2.5), TypeError, "ns_steps must be an int"),
        (lambda: foam_jax.foam_muon(1e-3, nesterov="yes"), TypeError, "nesterov"),
        (lambda: foam_jax.foam_muon(1e-3, adam_learning_rate=-1), ValueError,
         "adam_learning_rate"),
        (lambda: foam_jax.foam_muon(1e-3, adam_b1=1.5), ValueError, "adam_b1"),
        (lambda: foam_jax.foam_muon(1e-3, adam_b2=-0.1), ValueError, "adam_b2"),
    ],
)
def test_arguments_that_passed_or_failed_late_raise_at_construction(make, error, match):
  with pytest.raises(error, match=match):
    make()


def test_a_numpy_integer_level_works_as_its_int():
  state = foam_jax.foam(1e-3, fold_level=np.int64(2)).init(PARAMS)
  assert state[0].mu["layer"]["kernel"].shape == (2, 4)


def test_schedules_and_arrays_are_accepted():
  foam_jax.foam(optax.constant_schedule(1e-3))
  foam_jax.foam(jnp.asarray(1e-3), b1=jnp.asarray(0.9))


def test_bad_hyperparameter_under_inject_hyperparams_raises_at_init():
  tx = optax.inject_hyperparams(foam_jax.foam, static_args=("fold_level",))(
      learning_rate=1e-3, b2=1.2)
  with pytest.raises(ValueError, match="b2"):
    tx.init(PARAMS)


@pytest.mark.parametrize("bad_level", [-1, 1.0])
def test_fold_spec_fields_are_checked(bad_level):
  with pytest.raises((ValueError, TypeError), match="FoldSpec.level"):
    FoldSpec(axis=0, level=bad_level)
  with pytest.raises(TypeError, match="FoldSpec.axis"):
    FoldSpec(axis="in")


def test_axis_out_of_range_names_the_leaf():
  specs = {"layer": {"kernel": FoldSpec(axis=2), "bias": None}, "scale": None}
  tx = foam_jax.foam(1e-3, fold_spec=specs)
  with pytest.raises(ValueError, match=r"axis 2 is out of range.*\['layer'\]\['kernel'\]"):
    tx.init(PARAMS)


def test_spec_on_scalar_names_the_leaf():
  specs = {"layer": {"kernel": None, "bias": None}, "scale": FoldSpec(axis=0)}
  with pytest.raises(ValueError, match=r"scalar parameter at \['scale'\]"):
    foam_jax.foam(1e-3, fold_spec=specs).init(PARAMS)


def test_spec_tree_that_does_not_match_params():
  specs = {"layer": {"kernel": FoldSpec()}, "scale": None}
  with pytest.raises(ValueError, match="fold_spec does not match the params"):
    foam_jax.foam(1e-3, fold_spec=specs).init(PARAMS)


def test_spec_tree_with_wrong_leaf_type_names_the_leaf():
  specs = {"layer": {"kernel": True, "bias": None}, "scale": None}
  with pytest.raises(TypeError, match=r"\['layer'\]\['kernel'\] must be a FoldSpec"):
    foam_jax.foam(1e-3, fold_spec=specs).init(PARAMS)


def test_single_fold_spec_instead_of_tree_explains():
  with pytest.raises(TypeError, match="not a single FoldSpec"):
    foam_jax.foam(1e-3, fold_spec=FoldSpec()).init(PARAMS)


def test_callable_fold_spec_is_applied_to_params():
  def only_kernels(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, p: FoldSpec(axis=-1, level=1) if "kernel" in str(path) else None,
        params)

  state = foam_jax.foam(1e-3, fold_spec=only_kernels).init(PARAMS)
  assert state[0].mu["layer"]["kernel"].shape == (8, 2)
  assert state[0].mu["layer"]["bias"].shape == (4,)


def test_paper_schedule_arguments():
  with pytest.raises(ValueError, match="total_steps"):
    foam_jax.paper_schedule(1e-2, 0)
  with pytest.raises(ValueError, match="warmup_fraction"):
    foam_jax.paper_schedule(1e-2, 100, warmup_fraction=1.5)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
@pytest.mark.parametrize("make", [lambda: foam_jax.foam(1e-3), lambda: foam_jax.foam_lion(1e-3),
                                  lambda: foam_jax.foam_muon(1e-3)])
def test_integer_or_bool_weights_name_their_path(make, dtype):
  params = {"layer": {"kernel": jnp.zeros((8, 4)), "index": jnp.zeros((8, 4), dtype)}}
  with pytest.raises(TypeError, match=r"\['layer'\]\['index'\].*" + jnp.dtype(dtype).name):
    make().init(params)
