"""haliax ``NamedArray`` models (Levanter's), with ``marin-haliax`` alone.

Levanter hands an optimizer ``eqx.filter(model, is_inexact_arrayish)``:
``NamedArray`` leaves, ``None`` for absent fields (no bias, no norm bias).
Its checkpointer keeps the leaves that are arrays (``eqx.is_array``): every
state leaf must be one, int8 moments included, or a save drops it silently.
"""

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import foam_jax

Batch = hax.Axis("batch", 32)
Embed = hax.Axis("embed", 64)
Mlp = hax.Axis("mlp", 256)

OPTIMIZERS = {
    "foam": lambda: foam_jax.foam(1e-2),
    "foam_int8": lambda: foam_jax.foam(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "foam_mini_int8": lambda: foam_jax.foam_mini(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "foam_lion_int8": lambda: foam_jax.foam_lion(1e-3, mu_dtype=jnp.int8),
    "foam_muon_int8": lambda: foam_jax.foam_muon(2e-2, mu_dtype=jnp.int8),
}


class Block(eqx.Module):
  """A Levanter-style MLP block: no biases (absent fields), a norm without bias."""

  norm: hnn.RmsNorm
  up: hnn.Linear
  down: hnn.Linear

  @staticmethod
  def init(key):
    k_up, k_down = jax.random.split(key)
    return Block(hnn.RmsNorm.init(Embed, use_bias=False),
                 hnn.Linear.init(In=Embed, Out=Mlp, key=k_up, use_bias=False),
                 hnn.Linear.init(In=Mlp, Out=Embed, key=k_down, use_bias=False))

  def __call__(self, x):
    return self.down(hnn.relu(self.up(self.norm(x))))


def _data():
  x = hax.random.normal(jax.random.PRNGKey(1), (Batch, Embed))
  return x, hax.sin(x)


def _loss(model, x, y):
  return hax.mean((model(x) - y) ** 2).scalar()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_named_array_model_trains_and_every_state_leaf_is_an_array(name):
  model = Block.init(jax.random.PRNGKey(0))
  params = eqx.filter(model, eqx.is_inexact_array)
  assert model.up.bias is None  # Absent fields reach the optimizer as None.
  tx = OPTIMIZERS[name]()
  opt_state = tx.init(params)
  leaves = jax.tree.leaves(opt_state)
  assert leaves and all(eqx.is_array(x) for x in leaves)
  # What Levanter's checkpointer keeps: the array leaves. Nothing is left out.
  _, rest = eqx.partition(opt_state, eqx.is_array)
  assert jax.tree.leaves(rest) == []
  x, y = _data()

  @eqx.filter_jit
  def step(model, opt_state):
    loss, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), opt_state, loss

  losses = []
  for _ in range(20):
    model, opt_state, loss = step(model, opt_state)
    losses.append(float(loss))
  assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
  assert all(eqx.is_array(x) for x in jax.tree.leaves(opt_state))


@pytest.mark.parametrize("name", ["foam_int8", "foam_muon_int8"])
def test_a_serialised_state_restores_every_leaf(name, tmp_path):
  model = Block.init(jax.random.PRNGKey(0))
  params = eqx.filter(model, eqx.is_inexact_array)
  tx = OPTIMIZERS[name]()
  opt_state = tx.init(params)
  x, y = _data()
  grads = eqx.filter_grad(_loss)(model, x, y)
  _, opt_state = tx.update(grads, opt_state, params)
  eqx.tree_serialise_leaves(tmp_path / "state.eqx", opt_state)
  restored = eqx.tree_deserialise_leaves(tmp_path / "state.eqx", tx.init(params))
  for a, b in zip(jax.tree.leaves(opt_state), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(x.dtype == jnp.int8 for x in jax.tree.leaves(restored))
