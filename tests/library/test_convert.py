"""convert_state: block means of the source moments, counts kept, tx's tree."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import test_folded_optimizers
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from reference import np_fold
from reference import np_unfold

import foam_jax

SHAPES = test_folded_optimizers.SHAPES
FOLDED = ("divisible", "nondivisible", "stacked")  # FOAM's default policy.


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(rng.standard_normal(s), jnp.float32)
          for k, s in SHAPES.items()}


def _run(tx, params, steps=3):
  state = tx.init(params)
  for i in range(steps):
    grads = _params(seed=10 + i)
    _, state = tx.update(grads, state, params)
  return state


def _moment_states(state):
  is_moments = lambda x: hasattr(x, "mu") and hasattr(x, "count")
  return [x for x in jax.tree.leaves(state, is_leaf=is_moments)
          if is_moments(x)]


def _same_tree(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.sharding == b.sharding


def _counts(state):
  return [int(x) for x in jax.tree.leaves(state)
          if x.ndim == 0 and jnp.issubdtype(x.dtype, jnp.integer)]


def _expect(source_moment, name, k=4):
  x = np.asarray(source_moment, np.float64)
  return np_fold(x, -2, k) if name in FOLDED else x


@pytest.mark.single_device
def test_adamw_to_foam_block_means_exactly():
  params = _params()
  adam_state = _run(optax.adamw(1e-3), params)
  tx = foam_jax.foam(1e-3)
  new = foam_jax.convert_state(adam_state, tx, params)
  _same_tree(new, tx.init(params))
  for field in ("mu", "nu"):
    for name in SHAPES:
      want = _expect(getattr(adam_state[0], field)[name], name)
      np.testing.assert_allclose(getattr(new[0], field)[name], want,
                                 rtol=1e-6, atol=1e-7, err_msg=name)
  # Unfolded leaves keep Adam's moments bit for bit.
  np.testing.assert_array_equal(new[0].mu["bias"], adam_state[0].mu["bias"])
  assert int(new[0].count) == 3
  # And the converted state trains on with foam.
  updates, _ = jax.jit(tx.update)(params, new, params)
  assert all(np.isfinite(np.asarray(u)).all() for u in jax.tree.leaves(updates))


def test_every_count_carries_over_through_inject_hyperparams_and_schedules():
  params = _params()
  schedule = optax.linear_schedule(1e-3, 0.0, 100)
  source = optax.inject_hyperparams(optax.adamw)(learning_rate=schedule)
  state = _run(source, params, steps=5)
  tx = optax.inject_hyperparams(foam_jax.foam)(learning_rate=schedule)
  new = foam_jax.convert_state(state, tx, params)
  _same_tree(new, tx.init(params))
  assert _counts(new) == [5] * len(_counts(new)) and len(_counts(new)) == 3
  # A plain schedule's count (chain position 2) carries over too.
  plain = _run(optax.adamw(schedule), params, steps=4)
  new = foam_jax.convert_state(plain, foam_jax.foam(schedule), params)
  assert _counts(new) == [4, 4]


def test_muon_to_foam_muon_and_lion_to_foam_lion():
  params = _params()
  rule = foam_jax._src.muon.matrix_dimension_numbers  # pylint: disable=protected-access
  muon_state = _run(
      optax.contrib.muon(1e-3, muon_weight_dimension_numbers=rule), params)
  tx = foam_jax.foam_muon(1e-3)
  new = foam_jax.convert_state(muon_state, tx, params)
  _same_tree(new, tx.init(params))
  sources = _moment_states(muon_state)
  for target in _moment_states(new):
    assert int(target.count) == 3
    for name, m in target.mu.items():
      if isinstance(m, optax.MaskedNode):
        continue
      src = next(s.mu[name] for s in sources
                 if not isinstance(s.mu[name], optax.MaskedNode))
      np.testing.assert_allclose(m, _expect(src, name), rtol=1e-6, atol=1e-7)

  lion_state = _run(optax.lion(1e-3), params)
  tx = foam_jax.foam_lion(1e-3)
  new = foam_jax.convert_state(lion_state, tx, params)
  _same_tree(new, tx.init(params))
  for name in SHAPES:
    np.testing.assert_allclose(new[0].mu[name],
                               _expect(lion_state[0].mu[name], name),
                               rtol=1e-6, atol=1e-7)
  assert int(new[0].count) == 3


def test_adamw_to_foam_muon_fills_both_parts():
  params = _params()
  adam_state = _run(optax.adamw(1e-3), params)
  new = foam_jax.convert_state(adam_state, foam_jax.foam_muon(1e-3), params)
  for target in _moment_states(new):
    for name, m in target.mu.items():
      if not isinstance(m, optax.MaskedNode):
        np.testing.assert_allclose(
            m, _expect(adam_state[0].mu[name], name), rtol=1e-6, atol=1e-7)


def test_refold_to_another_level():
  params = _params()
  level1 = _run(foam_jax.foam(1e-3, fold_level=1), params)
  new = foam_jax.convert_state(level1, foam_jax.foam(1e-3), params)
  for name in FOLDED:
    m1 = np.asarray(level1[0].mu[name], np.float64)
    n = SHAPES[name][-2]
    want = np_fold(np_unfold(m1, -2, 2, n), -2, 4)
    np.testing.assert_allclose(new[0].mu[name], want, rtol=1e-6, atol=1e-7)
  # Another fold spec: the last axis instead.
  spec = lambda p: jax.tree.map(  # pylint: disable=g-long-lambda
      lambda x: foam_jax.FoldSpec(axis=-1, level=1) if x.ndim >= 2 else None, p)
  tx = foam_jax.foam(1e-3, fold_spec=spec)
  new = foam_jax.convert_state(level1, tx, params)
  _same_tree(new, tx.init(params))
  m1 = np.asarray(level1[0].mu["divisible"], np.float64)
  want = np_fold(np_unfold(m1, -2, 2, 16), -1, 2)
  np.testing.assert_allclose(new[0].mu["divisible"], want, rtol=1e-6, atol=1e-7)


def test_sharded_inputs_give_sharded_outputs():
  mesh = jax.make_mesh((8,), ("data",))
  shardings = {k: NamedSharding(mesh, P("data") if s[0] % 8 == 0 else P())
               for k, s in SHAPES.items()}
  params = jax.device_put(_params(), shardings)
  params["kernel"] = jax.device_put(
      jnp.ones((64, 32)), NamedSharding(mesh, P("data", None)))
  adamw = optax.adamw(1e-3)
  _, adam_state = adamw.update(params, adamw.init(params), params)
  assert adam_state[0].mu["kernel"].sharding.spec == P("data", None)
  tx = foam_jax.foam(1e-3)
  new = foam_jax.convert_state(adam_state, tx, params)
  want = tx.init(params)
  _same_tree(new, want)
  assert new[0].mu["kernel"].sharding.spec == P("data", None)
  assert new[0].mu["kernel"].shape == (16, 32)
  np.testing.assert_allclose(
      new[0].mu["kernel"], np_fold(np.asarray(adam_state[0].mu["kernel"]), -2, 4),
      rtol=1e-6, atol=1e-7)
  assert int(new[0].count) == 1


def test_unconvertible_states_say_what_they_hold():
  params = _params()
  with pytest.raises(ValueError, match="no convertible moments.*EmptyState"):
    foam_jax.convert_state(optax.sgd(1.0).init(params), foam_jax.foam(1e-3),
                           params)
  with pytest.raises(ValueError, match="nu.*ScaleByLionState.*second moments"):
    foam_jax.convert_state(optax.lion(1.0).init(params), foam_jax.foam(1e-3),
                           params)
  with pytest.raises(ValueError, match="tx holds none"):
    foam_jax.convert_state(optax.adam(1.0).init(params), optax.adam(1.0),
                           params)
  other = {"w": jnp.ones((4, 4))}
  with pytest.raises(ValueError, match="params"):
    foam_jax.convert_state(optax.adam(1.0).init(other), foam_jax.foam(1e-3),
                           params)
