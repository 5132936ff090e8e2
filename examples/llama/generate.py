"""Text generation from a trained model: greedy or with a temperature."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["generate"]


def generate(
    model: nnx.Module,
    prompt_ids,
    num_tokens: int,
    *,
    window: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
  """Extends ``prompt_ids`` by ``num_tokens`` tokens, one forward pass each.

  The model sees the last ``window`` tokens (a fixed shape, so one compile).

  Args:
    model: maps ``(1, window)`` int tokens to ``(1, window, V)`` logits.
    prompt_ids: 1-D token ids (at least one).
    num_tokens: how many tokens to generate.
    window: context length fed to the model.
    temperature: ``0`` is greedy; otherwise sample from ``softmax(logits/T)``.
    seed: seed of the sampling key.

  Returns:
    The generated ids (without the prompt), shape ``(num_tokens,)``.
  """
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature!r}.")
  ids = [int(i) for i in np.asarray(prompt_ids).ravel()]
  if not ids:
    raise ValueError("prompt_ids must hold at least one token.")
  graphdef, state = nnx.split(model)

  @jax.jit
  def next_token(state, tokens_1W, last, key):
    logits_V = nnx.merge(graphdef, state)(tokens_1W)[0, last]
    if temperature == 0:
      return jnp.argmax(logits_V)
    return jax.random.categorical(key, logits_V / temperature)

  key = jax.random.key(seed)
  out = []
  for _ in range(num_tokens):
    context = ids[-window:]
    tokens = np.zeros((1, window), np.int32)
    tokens[0, : len(context)] = context
    key, sub = jax.random.split(key)
    token = int(next_token(state, jnp.asarray(tokens), len(context) - 1, sub))
    ids.append(token)
    out.append(token)
  return np.asarray(out, np.int32)
