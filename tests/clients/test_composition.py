"""foam() inside the Optax and Flax machinery users already have."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import foam_jax


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {
      "dense": {"kernel": jnp.asarray(rng.standard_normal((16, 8)), jnp.float32),
                "bias": jnp.asarray(rng.standard_normal(8), jnp.float32)},
      "embed_tokens": jnp.asarray(rng.standard_normal((10, 16)), jnp.float32),
  }


def _grads(params, seed=1):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)


def _nonzero(tree):
  return any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(tree))


def test_inject_hyperparams_learning_rate_change_takes_effect():
  tx = optax.inject_hyperparams(foam_jax.foam, static_args=("fold_level",))(
      learning_rate=1e-2, fold_level=1, weight_decay=0.1)
  params = _params()
  state = tx.init(params)
  step = jax.jit(tx.update)
  u1, state = step(_grads(params), state, params)
  assert _nonzero(u1)
  state.hyperparams["learning_rate"] = jnp.asarray(0.0)
  u2, state = step(_grads(params), state, params)
  assert not _nonzero(u2)
  state.hyperparams["learning_rate"] = jnp.asarray(2e-2)
  u3, state = step(_grads(params), state, params)
  assert _nonzero(u3)
  # fold_level stayed static: the state is folded at level 1.
  assert state.inner_state[0].mu["dense"]["kernel"].shape == (8, 8)


def test_inject_hyperparams_without_static_fold_level_explains():
  with pytest.raises(TypeError, match="static_args"):
    optax.inject_hyperparams(foam_jax.foam)(learning_rate=1e-2, fold_level=2).init(_params())


def test_schedule_scales_the_step():
  params = _params()
  grads = _grads(params)
  sched = optax.linear_schedule(1.0, 0.0, transition_steps=4)
  tx_s = foam_jax.foam(sched, weight_decay=0.0)
  tx_c = foam_jax.foam(1.0, weight_decay=0.0)
  s_s, s_c = tx_s.init(params), tx_c.init(params)
  for t in range(5):
    u_s, s_s = tx_s.update(grads, s_s, params)
    u_c, s_c = tx_c.update(grads, s_c, params)
    factor = float(sched(t))
    chex.assert_trees_all_close(u_s, jax.tree.map(lambda u, f=factor: f * u, u_c),
                                rtol=1e-6, atol=1e-7)


def test_chain_with_clipping_and_extra_args():
  params = _params()
  tx = optax.chain(optax.clip_by_global_norm(1e-3), foam_jax.foam(1e-2, weight_decay=0.0))
  state = tx.init(params)
  big = jax.tree.map(lambda g: 1e6 * g, _grads(params))
  updates, state = tx.update(big, state, params, value=jnp.asarray(1.0), extra=3)
  assert all(bool(jnp.isfinite(u).all()) for u in jax.tree.leaves(updates))
  assert isinstance(foam_jax.foam(1e-3, weight_decay=0.0), optax.GradientTransformationExtraArgs)


def test_multisteps_accumulates_then_applies():
  params = _params()
  tx = optax.MultiSteps(foam_jax.foam(1e-2, weight_decay=0.0), every_k_schedule=2)
  ref = foam_jax.foam(1e-2, weight_decay=0.0)
  state, ref_state = tx.init(params), ref.init(params)
  g1, g2 = _grads(params, 1), _grads(params, 2)
  u1, state = tx.update(g1, state, params)
  assert not _nonzero(u1)
  u2, state = tx.update(g2, state, params)
  mean = jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)
  want, _ = ref.update(mean, ref_state, params)
  chex.assert_trees_all_close(u2, want, rtol=1e-5, atol=1e-7)


def test_masked_hands_masked_nodes_and_leaves_them_alone():
  params = _params()
  mask = {"dense": {"kernel": True, "bias": False}, "embed_tokens": False}
  tx = optax.masked(foam_jax.foam(1e-2, weight_decay=0.0), mask)
  state = tx.init(params)
  inner = state.inner_state[0]
  assert isinstance(inner.mu["dense"]["bias"], optax.MaskedNode)
  assert inner.mu["dense"]["kernel"].shape == (4, 8)
  grads = _grads(params)
  updates, state = jax.jit(tx.update)(grads, state, params)
  chex.assert_trees_all_equal(updates["dense"]["bias"], grads["dense"]["bias"])
  assert _nonzero(updates["dense"]["kernel"])


def test_masked_with_explicit_spec_tree():
  params = _params()
  specs = {"dense": {"kernel": foam_jax.FoldSpec(axis=-1, level=3), "bias": None},
           "embed_tokens": None}
  mask = {"dense": {"kernel": True, "bias": True}, "embed_tokens": False}
  tx = optax.masked(foam_jax.scale_by_foam(fold_spec=specs), mask)
  state = tx.init(params)
  assert state.inner_state.mu["dense"]["kernel"].shape == (16, 1)
  tx.update(_grads(params), state, params)


def test_partition_foam_and_sgd():
  params = _params()
  labels = {"dense": {"kernel": "foam", "bias": "sgd"}, "embed_tokens": "sgd"}
  tx = optax.partition(
      {"foam": foam_jax.foam(1e-2, weight_decay=0.0), "sgd": optax.sgd(1e-2)}, labels)
  state = tx.init(params)
  grads = _grads(params)
  updates, state = jax.jit(tx.update)(grads, state, params)
  chex.assert_trees_all_close(updates["embed_tokens"], -1e-2 * grads["embed_tokens"])
  assert _nonzero(updates["dense"]["kernel"])


def test_apply_if_finite_skips_nan_steps():
  params = _params()
  tx = optax.apply_if_finite(foam_jax.foam(1e-2, weight_decay=0.0), max_consecutive_errors=3)
  state = tx.init(params)
  _, state = tx.update(_grads(params), state, params)
  bad = jax.tree.map(lambda g: g.at[0].set(jnp.nan), _grads(params, 5))
  updates, new_state = tx.update(bad, state, params)
  assert not _nonzero(updates)
  chex.assert_trees_all_equal(new_state.inner_state, state.inner_state)
  assert int(new_state.notfinite_count) == 1


def test_no_recompilation_across_steps():
  params = _params()
  tx = foam_jax.foam(optax.cosine_decay_schedule(1e-2, 100), weight_decay=0.1)
  traces = []

  @jax.jit
  def step(params, state, grads):
    traces.append(1)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  for i in range(5):
    params, state = step(params, state, _grads(params, i))
  assert len(traces) == 1


def test_donated_jit_step():
  params = _params()
  tx = foam_jax.foam(1e-2, weight_decay=0.0)
  state = tx.init(params)

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(step, donate_argnums=(0, 1))
  for i in range(3):
    params, state = step(params, state, _grads(params, i))
  assert int(state[0].count) == 3


class _TinyLM(nnx.Module):

  def __init__(self, rngs):
    self.embed_tokens = nnx.Embed(12, 16, rngs=rngs)
    self.mlp = nnx.Linear(16, 32, rngs=rngs)
    self.lm_head = nnx.Linear(32, 12, rngs=rngs)

  def __call__(self, x):
    return self.lm_head(jax.nn.gelu(self.mlp(self.embed_tokens(x))))


def test_nnx_optimizer_trains_and_folds_the_right_leaves():
  model = _TinyLM(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, foam_jax.foam(3e-2, weight_decay=0.0), wrt=nnx.Param)
  mu = optimizer.opt_state[0].mu
  assert mu["mlp"]["kernel"][...].shape == (4, 32)
  assert mu["embed_tokens"]["embedding"][...].shape == (12, 16)
  assert mu["lm_head"]["kernel"][...].shape == (32, 12)

  tokens = jnp.arange(12) % 12
  targets = (tokens + 1) % 12

  @nnx.jit
  def train_step(model, optimizer):
    def loss_fn(model):
      logits = model(tokens)
      return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  first = float(train_step(model, optimizer))
  for _ in range(40):
    last = float(train_step(model, optimizer))
  assert last < 0.2 * first


def test_bf16_params_train():
  params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), _params())
  tx = foam_jax.foam(1e-2, mu_dtype=jnp.float32, weight_decay=0.0)
  state = tx.init(params)
  assert state[0].mu["dense"]["kernel"].dtype == jnp.float32
  assert state[0].nu["dense"]["kernel"].dtype == jnp.bfloat16
  updates, state = jax.jit(tx.update)(_grads(params), state, params)
  assert {u.dtype for u in jax.tree.leaves(updates)} == {jnp.dtype(jnp.bfloat16)}
  new = optax.apply_updates(params, updates)
  assert {p.dtype for p in jax.tree.leaves(new)} == {jnp.dtype(jnp.bfloat16)}
