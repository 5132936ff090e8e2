"""A state refuses gradients of shapes other than its parameters'.

A folded moment fits several parameter lengths (at level 2 a ``(2, 4)``
moment folds every length from 5 to 8), so a state made for ``(8, 4)``
weights accepted ``(5, 4)`` gradients; ``optax.scale_by_adam`` raises there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest

import foam_jax

MAKERS = {
    "foam": lambda: foam_jax.foam(1e-3),
    "foam_int8": lambda: foam_jax.foam(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "foam_mini": lambda: foam_jax.foam_mini(1e-3),
    "foam_lion": lambda: foam_jax.foam_lion(1e-3),
    "foam_muon": lambda: foam_jax.foam_muon(1e-3),
}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("shape, other", [((8, 4), (5, 4)), ((8, 3), (7, 3)), ((8, 4), (8, 5))])
def test_gradients_of_another_shape_raise_naming_the_leaf(name, shape, other, jit):
  tx = MAKERS[name]()
  params = {"layer": {"w": jnp.zeros(shape)}, "b": jnp.zeros(4)}
  state = tx.init(params)
  grads = {"layer": {"w": jnp.ones(other)}, "b": jnp.ones(4)}
  update = jax.jit(tx.update) if jit else tx.update
  with pytest.raises(ValueError, match=(
      rf"\['layer'\]\['w'\] has shape \({other[0]}, {other[1]}\).*"
      rf"parameter of shape \({shape[0]}, {shape[1]}\)")):
    update(grads, state, params)
  updates, _ = update(jax.tree.map(jnp.ones_like, params), state, params)  # Its own shapes pass.
  assert jax.tree.map(jnp.shape, updates) == jax.tree.map(jnp.shape, params)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_record_adds_no_state_leaf_and_survives_abstract_init_and_jit(name):
  tx = MAKERS[name]()
  params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros(4), "skip": None}
  state = tx.init(params)
  abstract = jax.eval_shape(tx.init, params)
  assert jax.tree.structure(abstract) == jax.tree.structure(state)
  _, new = jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), state, params)
  assert jax.tree.structure(new) == jax.tree.structure(state)
  # Every leaf is an array (the record is tree metadata, not a leaf).
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
  if name in ("foam", "foam_mini"):
    # As many leaves as Adam's state of the same tree.
    assert len(jax.tree.leaves(state)) == len(jax.tree.leaves(
        optax.adamw(1e-3).init(params)))


def test_the_record_reads_as_an_empty_named_tuple_to_hand_written_walkers():
  """Levanter's checkpoint paths walk NamedTuples by ``_asdict`` and count a
  node without leaves that is not one as a missing leaf."""
  rec = foam_jax.foam(1e-3).init({"w": jnp.zeros((8, 4))})[0].param_shapes
  assert type(rec).__bases__ == (tuple,) and rec._fields == () and len(rec) == 0
  rebuilt = type(rec)(**rec._asdict())
  assert jax.tree.leaves(rebuilt) == [] and rebuilt == rec
  assert rec.shapes == (("['w']", (8, 4)),)
