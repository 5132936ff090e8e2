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


# --- Leaves and masks as Optax takes them. ---


@pytest.mark.parametrize("make", [foam_jax.foam, foam_jax.foam_mini, foam_jax.foam_lion,
                                  foam_jax.foam_muon])
def test_python_number_and_list_leaves_are_accepted_as_optax_accepts_them(make):
  params = {"w": jnp.ones((8, 4)), "s": 1.0, "l": [0.5, 2.0]}
  grads = {"w": jnp.ones((8, 4)), "s": 1.0, "l": [1.0, -1.0]}
  tx, ref = make(1e-3), optax.adamw(1e-3)
  updates, _ = tx.update(grads, tx.init(params), params)
  ref_updates, _ = ref.update(grads, ref.init(params), params)
  assert jax.tree.structure(updates) == jax.tree.structure(ref_updates)
  for leaf in jax.tree.leaves(updates):
    assert bool(jnp.all(jnp.isfinite(leaf))) and leaf.dtype == jnp.float32


@pytest.mark.parametrize("make, name", [
    (lambda m: foam_jax.foam(1e-3, mask=m), "mask"),
    (lambda m: foam_jax.foam_lion(1e-3, mask=m), "mask"),
    (lambda m: foam_jax.foam_muon(1e-3, weight_decay_mask=m), "weight_decay_mask"),
])
def test_a_mask_of_the_wrong_structure_is_named(make, name):
  params = {"w": jnp.ones((8, 4))}
  with pytest.raises(ValueError, match=rf"{name} must be a pytree of bools.*'x'.*'w'"):
    make({"x": True}).init(params)


def test_a_mask_prefix_is_accepted():
  params = {"a": {"w": jnp.ones((8, 4)), "b": jnp.ones(4)}, "c": jnp.ones(3)}
  tx = foam_jax.foam(1e-3, weight_decay=0.1, mask={"a": True, "c": False})
  updates, _ = tx.update(params, tx.init(params), params)
  assert updates["c"].shape == (3,)


def test_b2_rounded_to_one_by_inject_hyperparams_says_what_to_do():
  params = {"w": jnp.ones((8, 4), jnp.bfloat16)}
  tx = optax.inject_hyperparams(foam_jax.foam)(learning_rate=1e-3)
  with pytest.raises(ValueError, match="hyperparam_dtype=jnp.float32"):
    tx.update(params, tx.init(params), params)
  tx = optax.inject_hyperparams(foam_jax.foam, hyperparam_dtype=jnp.float32)(
      learning_rate=1e-3)
  tx.update(params, tx.init(params), params)
