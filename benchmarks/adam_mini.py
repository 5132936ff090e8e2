"""Adam-mini for the benchmarks, written from its paper.

Adam-mini (Zhang et al., "Adam-mini: Use Fewer Learning Rates To Gain
More", arXiv 2406.16793, Algorithm 1 and Section 2) keeps Adam's first
moment and replaces the second moment by one number per block of a
partition chosen from the Hessian's block structure:

    m_t = b1 m_{t-1} + (1 - b1) g_t                       (every entry)
    v_t = b2 v_{t-1} + (1 - b2) mean_{block}(g_t ** 2)     (one per block)
    u_t = -lr * [ (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)
                  + weight_decay * p ]

The partition for the example's LLaMA (kernels stored ``(fan_in, fan_out)``):
query and key projections, one block per attention head (the head's
columns); the embedding and the output head keep one entry per block (Adam),
as the authors' release does by default; every other matrix, one block per
output neuron (a column); a vector (a norm's scale), one block. No
maintained JAX package provides Adam-mini; this one serves the benchmarks
and is tested against a float64 NumPy reference
(``tests/benchmarks/test_equal_tuning.py``).

Examples:
  >>> import jax.numpy as jnp
  >>> params = {"q_proj": {"kernel": jnp.zeros((8, 8))}, "norm": {"scale": jnp.ones(8)}}
  >>> tx = adam_mini(1e-3, num_heads=2)
  >>> state = tx.init(params)
  >>> state[0].nu["q_proj"]["kernel"].shape, state[0].nu["norm"]["scale"].shape
  ((1, 2, 1), (1,))
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["AdamMiniState", "Block", "adam_mini", "llama_blocks", "scale_by_adam_mini"]


class Block(NamedTuple):
  """A leaf's partition: reshape to ``view``, one block per index outside ``axes``."""

  view: tuple[int, ...]
  axes: tuple[int, ...]


class AdamMiniState(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def _path_names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def llama_blocks(params: Any, num_heads: int, num_kv_heads: int | None = None) -> Any:
  """The example LLaMA's partition: a :class:`Block` per leaf, ``None`` for Adam's.

  Keys have ``num_kv_heads`` heads (``num_heads`` when ``None``).
  """

  def block(path, p):
    names = _path_names(path)
    if any(n.startswith("embed") for n in names) or "lm_head" in names or p.ndim == 0:
      return None
    if p.ndim == 1:
      return Block(tuple(p.shape), (0,))
    if p.ndim != 2:
      raise ValueError(f"adam_mini: no partition for the rank-{p.ndim} leaf "
                       f"{jax.tree_util.keystr(path)}.")
    fan_in, fan_out = p.shape
    if "q_proj" in names or "k_proj" in names:
      heads = num_heads if "q_proj" in names else (num_kv_heads or num_heads)
      if fan_out % heads:
        raise ValueError(f"adam_mini: {jax.tree_util.keystr(path)} has {fan_out} "
                         f"columns, not a multiple of its {heads} heads.")
      return Block((fan_in, heads, fan_out // heads), (0, 2))
    return Block((fan_in, fan_out), (0,))

  return jax.tree_util.tree_map_with_path(block, params)


def _block_mean(x: jax.Array, block: Block | None) -> jax.Array:
  if block is None:
    return x
  return jnp.mean(x.reshape(block.view), axis=block.axes, keepdims=True)


def _spread(v: jax.Array, block: Block | None, shape: tuple[int, ...]) -> jax.Array:
  if block is None:
    return v
  return jnp.broadcast_to(v, block.view).reshape(shape)


def scale_by_adam_mini(num_heads: int, b1: float = 0.9, b2: float = 0.95,
                       eps: float = 1e-8, num_kv_heads: int | None = None
                       ) -> optax.GradientTransformation:
  """Adam-mini's preconditioned step (no learning rate, no weight decay)."""
  is_block = lambda x: x is None or isinstance(x, Block)

  def init(params):
    blocks = llama_blocks(params, num_heads, num_kv_heads)
    nu = jax.tree.map(
        lambda b, p: jnp.zeros_like(_block_mean(p, b), dtype=jnp.float32),
        blocks, params, is_leaf=is_block)
    mu = jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), params)
    return AdamMiniState(jnp.zeros([], jnp.int32), mu, nu)

  def update(updates, state, params=None):
    del params
    blocks = llama_blocks(updates, num_heads, num_kv_heads)
    count = optax.safe_increment(state.count)
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32),
                      state.mu, updates)
    nu = jax.tree.map(
        lambda b, v, g: b2 * v + (1 - b2) * _block_mean(jnp.square(g.astype(jnp.float32)), b),
        blocks, state.nu, updates, is_leaf=is_block)
    c1 = 1 - b1 ** count.astype(jnp.float32)
    c2 = 1 - b2 ** count.astype(jnp.float32)
    out = jax.tree.map(
        lambda b, m, v, g: ((m / c1) / (jnp.sqrt(_spread(v / c2, b, g.shape)) + eps)
                            ).astype(g.dtype),
        blocks, mu, nu, updates, is_leaf=is_block)
    return out, AdamMiniState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def adam_mini(learning_rate: optax.ScalarOrSchedule, *, num_heads: int, b1: float = 0.9,
              b2: float = 0.95, eps: float = 1e-8, weight_decay: float = 0.0,
              num_kv_heads: int | None = None) -> optax.GradientTransformation:
  """Adam-mini with decoupled weight decay, as ``optax.adamw`` chains its parts."""
  return optax.chain(scale_by_adam_mini(num_heads, b1, b2, eps, num_kv_heads),
                     optax.add_decayed_weights(weight_decay),
                     optax.scale_by_learning_rate(learning_rate))
