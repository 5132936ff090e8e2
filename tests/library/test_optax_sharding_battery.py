"""Optax's sharding battery (``optax/_src/sharding_test.py``), run over foam_jax.

What Optax checks of every optimizer it ships, written here for ours: ``init``
on an abstract input; under an 8-device mesh with explicit axes, a float16
``(2, 8, 4)`` parameter sharded ``P(None, "x")``, the state's sharding types
are the same after ``init`` and after ``update``, and the same eagerly and
under ``jax.jit``. Every public optimizer, 8-bit moments included. (Optax's
microbatching test there is about ``optax.MultiSteps``, not an optimizer.)
"""

import jax
import jax.numpy as jnp
import pytest
from optax.contrib import MuonDimensionNumbers

import foam_jax

OPTIMIZERS = {
    "foam": lambda: foam_jax.foam(1.0),
    "foam_mini": lambda: foam_jax.foam_mini(1.0),
    "foam_int8": lambda: foam_jax.foam(1.0, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "foam_muon": lambda: foam_jax.foam_muon(1.0),
    "foam_muon_int8": lambda: foam_jax.foam_muon(1.0, mu_dtype=jnp.int8),
    "foam_muon_aol": lambda: foam_jax.foam_muon(1.0, preconditioning="aol"),
    "foam_lion": lambda: foam_jax.foam_lion(1.0),
    "scale_by_foam": lambda: foam_jax.scale_by_foam(),
    # As optax.contrib.scale_by_muon, it needs dimension numbers for 3-D leaves.
    "scale_by_folded_muon": lambda: foam_jax.scale_by_folded_muon(
        weight_dimension_numbers=lambda p: jax.tree.map(
            lambda _: MuonDimensionNumbers(-2, -1), p)),
    "scale_by_folded_lion": lambda: foam_jax.scale_by_folded_lion(),
}


def _types(tree):
  return jax.tree.map(jax.typeof, tree)


def _sharded_params(mesh):
  sharding = jax.sharding.NamedSharding(mesh, jax.P(None, "x"))
  return jnp.zeros((2, 8, 4), dtype=jnp.float16, out_sharding=sharding)


def _mesh():
  return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_init_with_abstract_input(name):
  params = jax.ShapeDtypeStruct(shape=(2, 4, 8), dtype=jnp.float32)
  assert OPTIMIZERS[name]().init(params) is not None


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_state_sharding_type_init_match_update(name):
  tx, mesh = OPTIMIZERS[name](), _mesh()
  with jax.set_mesh(mesh):
    params = _sharded_params(mesh)
    state0 = tx.init(params)
    assert _types(state0) == _types(tx.update(params, state0, params)[1])


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_state_sharding_type_preserved_with_jit(name):
  tx, mesh = OPTIMIZERS[name](), _mesh()
  with jax.set_mesh(mesh):
    params = _sharded_params(mesh)
    state0 = tx.init(params)
    assert _types(state0) == _types(jax.jit(tx.init)(params))
    eager = tx.update(params, state0, params)[1]
    assert _types(eager) == _types(jax.jit(tx.update)(params, state0, params)[1])
