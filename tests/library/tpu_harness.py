"""What the TPU kernels' tests share: leaves, gradients, and a run against the reference.

A test file describes its leaves as ``{name: (shape, level or None, covered)}``
(``None``: a leaf that is not folded; ``covered``: a kernel updates it) and
folds them along one axis.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import reference
from reference import LeafRule

from foam_jax import FoldSpec
from foam_jax._src import tpu_dispatch


class Leaves:
  """A test's leaves folded along ``axis``: their shapes, fold specs and reference rules."""

  def __init__(self, leaves: dict, axis: int):
    self.leaves, self.axis = leaves, axis
    self.shapes = {k: v[0] for k, v in leaves.items()}
    self.rules = {k: LeafRule() if lv is None else LeafRule(axis=axis, k=2**lv)
                  for k, (_, lv, _) in leaves.items()}
    self.covered = sum(c for _, _, c in leaves.values())

  def fold_spec(self, params):
    return {k: None if self.leaves[k][1] is None else FoldSpec(axis=self.axis,
                                                               level=self.leaves[k][1])
            for k in params}

  def grads(self, rng, params):
    """Gradients whose scale varies along the last axis, correlated with the weights."""
    return {k: (rng.standard_normal(s) * np.linspace(0.2, 3.0, s[-1])
                + 0.1 * np.asarray(params[k])).astype(np.float32)
            for k, s in self.shapes.items()}


def kernel_calls(tx, params, state, name):
  """How many times ``update``'s jaxpr calls the kernel ``name``."""
  jaxpr = jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(params, state, params)
  return str(jaxpr).count(f"name={name}")


def run_against_reference(tx, ref, leaves: Leaves, name: str, steps: int, seed: int = 0):
  """``steps`` kernel steps (in the interpreter) and the float64 reference's, compared."""
  rng = np.random.default_rng(seed)
  params = {k: rng.standard_normal(s).astype(np.float32) for k, s in leaves.shapes.items()}
  ref.init(params)
  ref_params = {k: reference.wide(v) for k, v in params.items()}
  params = jax.tree.map(jnp.asarray, params)
  with tpu_dispatch.interpret():
    state = tx.init(params)
    assert kernel_calls(tx, params, state, name) == leaves.covered
    step = jax.jit(lambda g, s, p: tx.update(g, s, p))
    for _ in range(steps):
      grads = leaves.grads(rng, params)
      updates, state = step(jax.tree.map(jnp.asarray, grads), state, params)
      params = optax.apply_updates(params, updates)
      ref_params = ref.step(ref_params, {k: reference.wide(g) for k, g in grads.items()})
  for k in leaves.shapes:
    np.testing.assert_allclose(np.asarray(params[k]), ref_params[k], rtol=1e-5, atol=1e-5,
                               err_msg=k)
  return params, state


def check_bfloat16_against_xla(tx, leaves: Leaves, seed: int = 2):
  """bfloat16 weights (and so moments): one step on either path agrees."""
  rng = np.random.default_rng(seed)
  params = {k: jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for k, s in leaves.shapes.items()}
  state = tx.init(params)
  grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
  u_xla, s_xla = jax.jit(tx.update)(grads, state, params)
  with tpu_dispatch.interpret():
    u, s = jax.jit(tx.update)(grads, state, params)
  for k in leaves.shapes:
    assert s[0].mu[k].dtype == jnp.bfloat16 or leaves.leaves[k][1] is None, k
    assert u[k].dtype == jnp.bfloat16 and s[0].mu[k].dtype == s_xla[0].mu[k].dtype
    np.testing.assert_allclose(np.asarray(u[k], np.float32), np.asarray(u_xla[k], np.float32),
                               rtol=2e-2, atol=2e-5, err_msg=k)
    np.testing.assert_allclose(np.asarray(s[0].nu[k], np.float32),
                               np.asarray(s_xla[0].nu[k], np.float32), rtol=1e-2, err_msg=k)


def steps(update, params, state, grads):
  """``update`` then ``optax.apply_updates`` for each gradient in turn."""
  for g in grads:
    u, state = update(g, state, params)
    params = optax.apply_updates(params, u)
  return params, state
