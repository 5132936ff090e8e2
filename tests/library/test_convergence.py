"""FOAM solves Optax's own test problems (``optax/_src/alias_test.py``).

The parabola and Rosenbrock objectives are Optax's; besides their 1-D form
(where FOAM's default policy falls back to Adam) each is also posed on a
matrix that FOAM folds, so the folded path has to converge too.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import foam_jax
from foam_jax import FoldSpec


def _minimize(objective, params, tx, steps):
  state = tx.init(params)

  def body(carry, _):
    params, state = carry
    grads = jax.grad(objective)(params)
    updates, state = tx.update(grads, state, params)
    return (optax.apply_updates(params, updates), state), None

  (params, _), _ = jax.lax.scan(body, (params, state), None, length=steps)
  return params


def _parabola(target):
  return lambda p: jnp.sum((p - target) ** 2)


def _rosenbrock(p, a=1.0, b=100.0):
  x, y = p[..., 0], p[..., 1]
  return jnp.sum((a - x) ** 2 + b * (y - x**2) ** 2)


def test_parabola_1d():
  # Optax's parabola: start [-1, 10, 1], minimum [1, -1, 1].
  target = jnp.array([1.0, -1.0, 1.0])
  got = _minimize(_parabola(target), jnp.array([-1.0, 10.0, 1.0]),
                  foam_jax.foam(1e-1, weight_decay=0.0), steps=2000)
  np.testing.assert_allclose(got, target, atol=1e-2)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_parabola_on_a_folded_matrix(level):
  rng = np.random.default_rng(0)
  target = jnp.asarray(rng.uniform(-2, 2, (16, 4)), jnp.float32)
  start = jnp.asarray(rng.uniform(-5, 5, (16, 4)), jnp.float32)
  tx = foam_jax.foam(optax.cosine_decay_schedule(1e-1, 3000, alpha=1e-3),
                     fold_level=level, weight_decay=0.0)
  assert tx.init(start)[0].mu.shape == (16 // 2**level, 4)
  got = _minimize(_parabola(target), start, tx, steps=3000)
  np.testing.assert_allclose(got, target, atol=1e-2)


def test_rosenbrock_1d():
  # Optax's Rosenbrock: start [0, 0], minimum [a, a^2] = [1, 1].
  got = _minimize(_rosenbrock, jnp.zeros(2), foam_jax.foam(1e-2, weight_decay=0.0), steps=10000)
  np.testing.assert_allclose(got, [1.0, 1.0], atol=2e-2)


def test_rosenbrock_on_a_folded_matrix():
  # Eight independent Rosenbrock problems, rows of an (8, 2) matrix whose
  # moments are folded over blocks of 4 rows.
  tx = foam_jax.foam(optax.cosine_decay_schedule(1e-2, 10000, alpha=1e-2),
                     fold_spec={"w": FoldSpec(axis=0, level=2)}, weight_decay=0.0)
  assert tx.init({"w": jnp.zeros((8, 2))})[0].mu["w"].shape == (2, 2)
  start = {"w": jnp.asarray(np.random.default_rng(1).uniform(-1, 0.5, (8, 2)), jnp.float32)}
  got = _minimize(lambda p: _rosenbrock(p["w"]), start, tx, steps=10000)
  np.testing.assert_allclose(got["w"], np.ones((8, 2)), atol=2e-2)
