"""Leaves with a dimension of size 0: every optimizer and storage dtype takes them.

They raised ``ZeroDivisionError`` with int8 moments (a reshape that infers a
size from an empty array) and in ``foam_muon`` (Muon's ``fan_out / fan_in``
for an empty matrix); ``optax.contrib.muon`` still raises on ``(0, 4)`` and
``(0, 0)``, ``optax.adamw`` and ``optax.lion`` take every shape below.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import foam_jax

SHAPES = [(0, 4), (4, 0), (3, 0, 5), (0, 0), (0,), (2, 0, 0, 3)]
OPTIMIZERS = {
    "foam": lambda: foam_jax.foam(1e-2),
    "foam int8": lambda: foam_jax.foam(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "foam bf16 moments": lambda: foam_jax.foam(1e-2, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16),
    "foam_mini": lambda: foam_jax.foam_mini(1e-2),
    "foam_muon": lambda: foam_jax.foam_muon(1e-2),
    "foam_muon int8": lambda: foam_jax.foam_muon(1e-2, mu_dtype=jnp.int8),
    "foam_lion": lambda: foam_jax.foam_lion(1e-2),
    "foam_lion int8": lambda: foam_jax.foam_lion(1e-2, mu_dtype=jnp.int8),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_empty_leaf_trains_beside_a_full_one(name, shape):
  tx = OPTIMIZERS[name]()
  full = jnp.linspace(-1.0, 1.0, 8 * 12).reshape(8, 12)
  with_empty = {"empty": jnp.zeros(shape), "w": full}
  alone = {"w": full}
  grads = lambda p: jax.tree.map(lambda x: 0.1 * x + 0.05, p)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  s1, s2 = tx.init(with_empty), tx.init(alone)
  for _ in range(3):
    u1, s1 = step(grads(with_empty), s1, with_empty)
    u2, s2 = step(grads(alone), s2, alone)
    assert u1["empty"].shape == shape
    # The empty leaf changes nothing for the others.
    np.testing.assert_array_equal(np.asarray(u1["w"]), np.asarray(u2["w"]))
    with_empty = optax.apply_updates(with_empty, u1)
    alone = optax.apply_updates(alone, u2)
  assert all(hasattr(x, "shape") for x in jax.tree.leaves(s1))

