"""The loss and the jitted train and eval steps, shared by every caller.

A step works on ``state = nnx.state((model, optimizer))`` (see
``examples.llama.state``): ``nnx.merge`` gives the model and its
``nnx.Optimizer`` back inside ``jit``, so the example, the benchmarks and the
tests compile the same computation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
from flax import nnx

__all__ = ["loss_fn", "make_eval_step", "make_train_step"]

Batch = dict[str, jax.Array]


def loss_fn(model: nnx.Module, batch: Batch) -> jax.Array:
  """Mean next-token cross-entropy in nats: ``batch`` has ``inputs`` and ``targets``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from examples.llama import configs, model
    >>> with nnx.use_eager_sharding(False):
    ...   llama = model.Llama(configs.get_config("tiny", num_layers=1), rngs=nnx.Rngs(0))
    >>> tokens = jnp.zeros((2, 8), jnp.int32)
    >>> loss = loss_fn(llama, {"inputs": tokens, "targets": tokens})
    >>> 5 < float(loss) < 6  # about ln 256 before training
    True
  """
  logits_BTV = model(batch["inputs"])
  return optax.softmax_cross_entropy_with_integer_labels(
      logits_BTV, batch["targets"]
  ).mean()


def make_train_step(
    graphdef: nnx.GraphDef,
    state_shardings: Any = None,
    batch_sharding: Any = None,
) -> Callable[..., tuple[nnx.State, jax.Array]]:
  """A jitted ``(state, batch, **update_args) -> (state, loss)``; state donated.

  Args:
    graphdef: of ``(model, optimizer)``, from ``state.create_state``.
    state_shardings: the state's shardings (kept fixed across steps).
    batch_sharding: the batch's sharding.

  Returns:
    The step. ``update_args`` go to the optimizer's ``update`` (extra
    arguments of an ``optax.GradientTransformationExtraArgs``). Time it
    after one warm-up call (the compile).

  Examples:
    >>> import jax.numpy as jnp
    >>> from examples.llama import configs, sharding, state
    >>> mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
    >>> cfg = configs.get_config("tiny", num_layers=1)
    >>> graphdef, st, _ = state.create_state(cfg, optax.adam(1e-2), mesh)
    >>> step = make_train_step(graphdef)
    >>> batch = {"inputs": jnp.zeros((2, 8), jnp.int32), "targets": jnp.ones((2, 8), jnp.int32)}
    >>> st, first = step(st, batch)
    >>> st, second = step(st, batch)
    >>> bool(second < first)
    True
  """

  def train_step(state, batch, **update_args):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads, **update_args)
    return nnx.state((model, optimizer)), loss

  if state_shardings is None:
    return jax.jit(train_step, donate_argnums=0)
  return jax.jit(
      train_step,
      in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, None),
      donate_argnums=0,
  )


def make_eval_step(
    graphdef: nnx.GraphDef, state_shardings: Any = None, batch_sharding: Any = None,
    *, stacked: bool = False,
) -> Callable[[nnx.State, Batch], jax.Array]:
  """A jitted ``(state, batch) -> loss`` (no donation, no update).

  With ``stacked``, ``batch`` holds a leading axis of batches and the step
  returns the mean of their losses (one call for a whole validation set).

  Examples:
    >>> import jax.numpy as jnp
    >>> from examples.llama import configs, sharding, state
    >>> mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
    >>> graphdef, st, _ = state.create_state(
    ...     configs.get_config("tiny", num_layers=1), optax.sgd(0.1), mesh)
    >>> batch = {"inputs": jnp.zeros((2, 8), jnp.int32), "targets": jnp.zeros((2, 8), jnp.int32)}
    >>> one = make_eval_step(graphdef)(st, batch)
    >>> two = make_eval_step(graphdef, stacked=True)(
    ...     st, jax.tree.map(lambda x: jnp.stack([x, x]), batch))
    >>> bool(jnp.allclose(one, two))
    True
  """

  def eval_step(state, batch):
    model, _ = nnx.merge(graphdef, state)
    if stacked:
      return jax.vmap(lambda b: loss_fn(model, b))(batch).mean()
    return loss_fn(model, batch)

  if state_shardings is None:
    return jax.jit(eval_step)
  return jax.jit(eval_step, in_shardings=(state_shardings, batch_sharding))

