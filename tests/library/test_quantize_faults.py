"""int8 and 16-bit moments under faults: huge, infinite and NaN gradient entries.

The comparator is the float path on the same gradients (float32 moments):
8-bit moments may round, but one bad entry must not cost more than it costs
a float moment. Float moments keep a non-finite value in its own entry (a
second moment whose square overflowed is infinite and freezes its entry; a
NaN stays NaN), so the int8 path must too: its update stays within 1.5x of
the float path's ``max |u|`` plus 1e-3 of the learning rate, and loses
(non-finite or frozen at zero) no entry the float path keeps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import foam_jax
from foam_jax._src import quantize

LR = 1e-3
LEVELS = [0, 1, 2, 3, 4]
# Entries whose square overflows float32 (above about 1.8e19) up to its maximum.
HUGE = [2e19, 1e21, 1e30, 3.4e38]
INT8 = {"mu": {"mu_dtype": jnp.int8}, "nu": {"nu_dtype": jnp.int8},
        "both": {"nu_dtype": jnp.int8, "mu_dtype": jnp.int8}}


@functools.cache
def _optimizer(factory, **kwargs):
  """``factory(LR, weight_decay=0.0, **kwargs)`` and its jitted update, built
  once per module: the tests that share an optimizer share its compilations."""
  tx = factory(LR, weight_decay=0.0, **kwargs)
  return tx, jax.jit(tx.update)


def _run_side_by_side(make, params, bad, steps=6, seed=0):
  """Float and int8 optimizers on the same gradients; ``bad`` set at entry 0 of step 0.

  ``make(int8)`` gives an optimizer and its jitted update. Yields, per step
  and leaf, the float and int8 updates as NumPy arrays.
  """
  txs, update = zip(*(make(False), make(True)))
  states = [tx.init(params) for tx in txs]
  rng = np.random.default_rng(seed)
  for t in range(steps):
    grads = {k: jnp.asarray(rng.standard_normal(v.shape), v.dtype) for k, v in params.items()}
    if t == 0:
      grads = {k: g.at[(0,) * g.ndim].set(bad) for k, g in grads.items()}
    outs = [u(grads, s, params) for u, s in zip(update, states)]
    states = [s for _, s in outs]
    for k in params:
      yield t, k, np.asarray(outs[0][0][k]), np.asarray(outs[1][0][k])


def _assert_no_worse(t, k, float_u, int8_u, zeros_lost=True):
  """No entry lost (non-finite, or zero if ``zeros_lost``) that the float path
  keeps, and ``max |u|`` within 1.5x of the float path's plus 1e-3 of the lr."""
  lost_float = ~np.isfinite(float_u) | (zeros_lost & (float_u == 0))
  lost_int8 = ~np.isfinite(int8_u) | (zeros_lost & (int8_u == 0))
  assert not (lost_int8 & ~lost_float).any(), (t, k, np.argwhere(lost_int8 & ~lost_float)[:4])
  kept = ~lost_float
  assert np.abs(int8_u[kept]).max() <= 1.5 * np.abs(float_u[kept]).max() + 1e-3 * LR, (t, k)


PARAMS = {"w": jnp.zeros((16, 300)), "b": jnp.zeros((300,))}


@pytest.mark.parametrize("huge", HUGE)
@pytest.mark.parametrize("moments", sorted(INT8))
@pytest.mark.parametrize("level", LEVELS)
def test_one_huge_gradient_entry_costs_no_more_than_with_float_moments(level, moments, huge):
  """An entry whose square overflows: the float second moment is infinite
  there (the entry freezes, as Adam's does); the int8 one freezes that entry
  too and no other, and nothing else grows (they grew to ~5e16, then to 1e6
  times the lr: a saturated block scale)."""
  def make(int8):
    return _optimizer(foam_jax.foam, fold_level=level, **(INT8[moments] if int8 else {}))

  for t, k, float_u, int8_u in _run_side_by_side(make, PARAMS, huge):
    _assert_no_worse(t, k, float_u, int8_u)


@pytest.mark.parametrize("second_moment", ["mean_of_squares", "square_of_mean"])
@pytest.mark.parametrize("level", [0, 2])
def test_the_block_of_a_huge_entry_keeps_its_int8_momentum(level, second_moment):
  """Beside an entry that Adam freezes (its square overflows), an int8 first
  moment keeps the other entries' momentum, so their steps follow the float
  path's over many steps (a first moment's code spans 16 binades below its
  block's scale: a scale raised to the huge entry dropped them to zero)."""
  def make(int8):
    return _optimizer(foam_jax.foam, fold_level=level, second_moment=second_moment,
                      **({"mu_dtype": jnp.int8} if int8 else {}))

  params = {"w": jnp.zeros((8, 64))}
  for t, k, float_u, int8_u in _run_side_by_side(make, params, 3e38, steps=12):
    _assert_no_worse(t, k, float_u, int8_u)
    kept = (float_u != 0) & np.isfinite(float_u)
    # Momentum kept: the steps agree as closely as 8-bit rounding allows.
    np.testing.assert_allclose(int8_u[kept], float_u[kept], rtol=0.2, atol=0.05 * LR,
                               err_msg=f"step {t}")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("moments", sorted(INT8))
@pytest.mark.parametrize("level", LEVELS)
def test_a_nan_or_inf_entry_loses_only_what_float_moments_lose(level, moments, bad):
  """A NaN spread to 4, then 24 of 96 entries of a (16, 6) leaf (the block's
  scale became NaN); float moments lose the entry's fold block."""
  def make(int8):
    return _optimizer(foam_jax.foam, fold_level=level, **(INT8[moments] if int8 else {}))

  params = {"w": jnp.zeros((16, 6)), "b": jnp.zeros((6,))}
  for t, k, float_u, int8_u in _run_side_by_side(make, params, bad):
    assert (np.isfinite(int8_u) == np.isfinite(float_u)).all(), (t, k)
    _assert_no_worse(t, k, float_u, int8_u)


@pytest.mark.parametrize("bad", [3e38, np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("level", [0, 2])
def test_folded_lion_int8_momentum_loses_only_what_float_loses(level, bad):
  def make(int8):
    return _optimizer(foam_jax.foam_lion, fold_level=level,
                      mu_dtype=jnp.int8 if int8 else None)

  for t, k, float_u, int8_u in _run_side_by_side(make, PARAMS, bad):
    np.testing.assert_array_equal(np.isfinite(int8_u), np.isfinite(float_u))
    _assert_no_worse(t, k, float_u, int8_u)
    if not np.isfinite(bad):
      # Lion's update is a sign: equal wherever the momentum's sign is not
      # rounded away. (A huge finite entry rounds its block's small momenta
      # to zero, 16 binades below it, where the sign is then the gradient's.)
      both = np.isfinite(float_u)
      assert (int8_u[both] == float_u[both]).mean() > 0.99, (t, k)


@pytest.mark.parametrize("level", LEVELS)
def test_skipped_step_under_apply_if_finite_keeps_int8_state_bit_identical(level):
  tx = optax.apply_if_finite(foam_jax.foam(1e-2, fold_level=level, mu_dtype=jnp.int8,
                                           nu_dtype=jnp.int8), 3)
  params = {"w": jnp.ones((8, 256)), "b": jnp.ones((256,))}
  state = tx.init(params)
  g = {"w": jnp.full((8, 256), 0.3), "b": jnp.full((256,), -0.2)}
  _, state = tx.update(g, state, params)
  before = jax.tree.map(np.asarray, state.inner_state)
  for bad in (np.nan, np.inf):
    _, state = tx.update({k: v.at[(0,) * v.ndim].set(bad) for k, v in g.items()}, state, params)
    jax.tree.map(np.testing.assert_array_equal, before,
                 jax.tree.map(np.asarray, state.inner_state))
  assert int(state.notfinite_count) == 2


@pytest.mark.parametrize("signed", [False, True])
def test_non_finite_entries_are_stored_per_entry(signed):
  """float64 reference: finite entries within the code's 2^-3 relative gap
  (below the block's 32 or 16 binades: the smallest code or zero), a
  non-finite entry as itself (NaN as +inf in the unsigned code), and the
  scale the bound of the finite entries (stored as -2 s when marked)."""
  rng = np.random.default_rng(0)
  x = 10.0 ** rng.uniform(-3, 0, size=(3, 512))
  if signed:
    x = x * rng.choice([-1.0, 1.0], size=x.shape)
  x[0, 5], x[1, 300], x[2, 7] = np.inf, np.nan, -np.inf if signed else 1e-30
  q = quantize.quantize(jnp.asarray(x, jnp.float32),
                        quantize.zeros(x.shape, None, signed=signed))
  y = np.asarray(quantize.dequantize(q), np.float64)
  want = x.copy()
  if not signed:
    want[1, 300] = np.inf
  nonfinite = ~np.isfinite(want)
  np.testing.assert_array_equal(y[nonfinite], want[nonfinite])
  finite = ~nonfinite & (np.abs(x) > 1e-4)
  assert (np.abs(y[finite] - x[finite]) <= np.abs(x[finite]) / 8 * 1.0001).all()
  marked = np.array([[True, False], [False, True], [signed, False]])
  bounds = np.abs(np.where(np.isfinite(x), x, 0)).reshape(3, 2, 256).max(-1)
  np.testing.assert_array_equal(np.asarray(q.nonfinite), marked)
  np.testing.assert_allclose(np.asarray(q.bounds), bounds, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(q.scales), np.where(marked, -2, 1) * bounds, rtol=1e-6)


@pytest.mark.parametrize("name", ["mu_dtype", "nu_dtype"])
def test_float16_storage_is_refused_naming_the_argument(name):
  with pytest.raises(TypeError, match=f"{name}=float16.*bfloat16"):
    foam_jax.foam(LR, **{name: jnp.float16})


@pytest.mark.parametrize("huge", [300.0, 6e4, np.inf])
@pytest.mark.parametrize("level", [0, 2])
def test_float16_params_store_bfloat16_moments_within_the_bound(level, huge):
  """float16 moments froze an entry above 256 and made updates NaN above
  6.6e5; float16 params now store bfloat16 moments (float32's range)."""
  params = {"w": jnp.zeros((16, 300), jnp.float16), "b": jnp.zeros((300,), jnp.float16)}
  state = foam_jax.foam(LR, fold_level=level).init(params)
  assert {x.dtype for x in jax.tree.leaves((state[0].mu, state[0].nu))} == {
      jnp.dtype(jnp.bfloat16)}

  def make(bf16):
    return _optimizer(foam_jax.foam, fold_level=level,
                      **({} if bf16 else {"mu_dtype": jnp.float32, "nu_dtype": jnp.float32}))

  for t, k, float_u, low_u in _run_side_by_side(make, params, huge):
    assert low_u.dtype == np.float16
    float_u, low_u = float_u.astype(np.float32), low_u.astype(np.float32)
    # Non-finite where the float32 moments' update is (a rounded-away first
    # moment may zero an entry: rounding, not a fault).
    np.testing.assert_array_equal(np.isfinite(low_u), np.isfinite(float_u))
    _assert_no_worse(t, k, float_u, low_u, zeros_lost=False)
