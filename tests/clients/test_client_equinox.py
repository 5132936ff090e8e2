"""Equinox as a client: its own idioms, with foam_jax in place of optax.adamw.

``tx.init(eqx.filter(model, eqx.is_inexact_array))`` hands the optimizer
``None`` for every non-array field; frozen layers through ``eqx.partition``
are ``None`` too. No adapter of ours is around any call.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import foam_jax

OPTIMIZERS = {
    "foam": lambda **kw: foam_jax.foam(1e-2, **kw),
    "foam_mini": lambda **kw: foam_jax.foam_mini(1e-2, **kw),
    "foam_muon": lambda **kw: foam_jax.foam_muon(2e-2, **kw),
    "foam_lion": lambda **kw: foam_jax.foam_lion(1e-3, **kw),
}
CASES = [(name, storage) for name in OPTIMIZERS for storage in ("float32", "int8")]


def _make(name, storage):
  if storage == "float32":
    return OPTIMIZERS[name]()
  if name in ("foam", "foam_mini"):
    return OPTIMIZERS[name](mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  return OPTIMIZERS[name](mu_dtype=jnp.int8)


def _data():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
  y = jnp.sin(x[:, :4]) + 0.5 * x[:, 4:8]
  return x, y


def _model():
  return eqx.nn.MLP(in_size=16, out_size=4, width_size=64, depth=2,
                    key=jax.random.PRNGKey(0))


def _loss(model, x, y):
  return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@pytest.mark.parametrize("name,storage", CASES)
def test_the_canonical_equinox_loop_trains(name, storage):
  model, (x, y) = _model(), _data()
  tx = _make(name, storage)
  opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))

  @eqx.filter_jit
  def step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), opt_state, loss

  losses = []
  for _ in range(30):
    model, opt_state, loss = step(model, opt_state, x, y)
    losses.append(float(loss))
  assert np.isfinite(losses).all() and losses[-1] < 0.7 * losses[0], losses
  assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(opt_state))


@pytest.mark.parametrize("name,storage", CASES)
def test_frozen_layers_through_partition_stay_put(name, storage):
  model, (x, y) = _model(), _data()
  # Train the last layer only: everything else is None in `trainable`.
  spec = jax.tree.map(lambda _: False, model)
  spec = eqx.tree_at(lambda m: m.layers[-1], spec,
                     replace=jax.tree.map(eqx.is_inexact_array, model.layers[-1]))
  trainable, frozen = eqx.partition(model, spec)
  tx = _make(name, storage)
  opt_state = tx.init(trainable)

  @eqx.filter_jit
  def step(trainable, opt_state):
    grads = eqx.filter_grad(lambda t: _loss(eqx.combine(t, frozen), x, y))(trainable)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    return eqx.apply_updates(trainable, updates), opt_state

  before = eqx.combine(trainable, frozen)
  for _ in range(3):
    trainable, opt_state = step(trainable, opt_state)
  after = eqx.combine(trainable, frozen)
  np.testing.assert_array_equal(after.layers[0].weight, before.layers[0].weight)
  assert np.any(np.asarray(after.layers[-1].weight) != np.asarray(before.layers[-1].weight))


@pytest.mark.parametrize("name,storage", CASES)
def test_the_state_round_trips_through_tree_serialise_leaves(name, storage, tmp_path):
  model, (x, y) = _model(), _data()
  tx = _make(name, storage)
  params = eqx.filter(model, eqx.is_inexact_array)
  opt_state = tx.init(params)
  grads = eqx.filter_grad(_loss)(model, x, y)
  for _ in range(2):
    _, opt_state = tx.update(grads, opt_state, params)
  path = tmp_path / "opt_state.eqx"
  eqx.tree_serialise_leaves(path, opt_state)
  restored = eqx.tree_deserialise_leaves(path, tx.init(params))
  assert jax.tree.structure(restored) == jax.tree.structure(opt_state)
  for a, b in zip(jax.tree.leaves(opt_state), jax.tree.leaves(restored)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The restored state trains on exactly as the saved one would.
  u1, _ = tx.update(grads, opt_state, params)
  u2, _ = tx.update(grads, restored, params)
  jax.tree.map(np.testing.assert_array_equal, u1, u2)
