"""Timing machinery of the step-time benchmark: runners and interleaved repeats.

A runner owns its live arrays and a compiled, donated step; ``__call__``
takes one step. ``time_interleaved`` times several side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from benchmarks import common
from benchmarks import grid
from examples.llama import sharding
from examples.llama import state
from examples.llama import steps

__all__ = ["CopyRunner", "Runner", "TrainRunner", "compiled_memory", "make_step",
           "time_interleaved"]


def make_step(tx: optax.GradientTransformation) -> Callable[..., Any]:
  """The jitted optimizer step, params and state donated."""

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


def _copy(tree):
  return jax.tree.map(lambda x: x + jnp.ones((), x.dtype), tree)


COPY = jax.jit(_copy, donate_argnums=0)


def compiled_memory(compiled) -> dict[str, int]:
  """Compiled memory of an executable: argument, output, alias, temp bytes."""
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  return {
      "argument_bytes": int(stats.argument_size_in_bytes),
      "output_bytes": int(stats.output_size_in_bytes),
      "alias_bytes": int(stats.alias_size_in_bytes),
      "temp_bytes": int(stats.temp_size_in_bytes),
  }


class Runner:
  """One optimizer's live params/state and its jitted donated step."""

  def __init__(self, name, tx, params, grads):
    self.name = name
    self.params = jax.tree.map(jnp.copy, params)
    self.state = jax.jit(tx.init)(self.params)
    self.grads = grads
    self.step = make_step(tx).lower(self.params, self.state, grads).compile()
    self.memory = compiled_memory(self.step)
    self.state_bytes = common.tree_bytes(self.state)

  def __call__(self):
    self.params, self.state = self.step(self.params, self.state, self.grads)
    return self.params

  def release(self):
    self.params = self.state = self.grads = None


class CopyRunner:
  """The bandwidth floor: a jitted, donated ``x + 1`` over the params."""

  name = "copy"

  def __init__(self, params):
    self.params = jax.tree.map(jnp.copy, params)
    self.copy = COPY.lower(self.params).compile()
    self.memory = compiled_memory(self.copy)
    self.state_bytes = 0

  def __call__(self):
    self.params = self.copy(self.params)
    return self.params

  def release(self):
    self.params = None


def time_interleaved(runners, *, warmup: int, repeats: int, inner: int):
  """Median seconds per call of each runner, interleaved across repeats.

  Each repeat times ``inner`` back-to-back calls of every runner, in an
  order rotated from repeat to repeat.

  Returns:
    ``{name: [seconds per call, one per repeat]}``.
  """
  for r in runners:
    for _ in range(warmup):
      common.block(r())
  times = {r.name: [] for r in runners}
  for rep in range(repeats):
    shift = rep % len(runners)
    for r in runners[shift:] + runners[:shift]:
      common.block(r.params)
      start = time.perf_counter()
      for _ in range(inner):
        out = r()
      common.block(out)
      times[r.name].append((time.perf_counter() - start) / inner)
  return times


class TrainRunner:
  """The example's jitted, donated train step on one fixed batch."""

  def __init__(self, name, model_cfg, batch, total_steps=1000):
    mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
    tx = grid.make_optimizer(name, None, total_steps, hidden_size=model_cfg.hidden_size)
    graphdef, self.params, shardings = state.create_state(model_cfg, tx, mesh)
    batch_sharding = sharding.batch_sharding(mesh)
    self.batch = jax.device_put(batch, batch_sharding)
    step = steps.make_train_step(graphdef, shardings, batch_sharding)
    self.step = step.lower(self.params, self.batch).compile()
    self.memory = compiled_memory(self.step)
    self.name = name
  def __call__(self):
    self.params, loss = self.step(self.params, self.batch)
    return loss

  def release(self):
    self.params = self.batch = None


