"""Orbax checkpoints of the training state, with a JSON record beside it.

A checkpoint holds ``nnx.to_pure_dict(state)`` and ``meta`` (step, tokens
seen, what the data stream and the run were). Restoring targets the live
state's shapes, dtypes and shardings, so a checkpoint lands on any mesh.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

__all__ = ["RestoreError", "holds_old_int8_moments", "manager", "restore", "save"]


class RestoreError(ValueError):
  """A checkpoint that cannot continue this run (other model, optimizer or data)."""


def manager(directory: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  """A synchronous ``CheckpointManager`` over ``directory`` (created if needed)."""
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      item_handlers={"state": ocp.StandardCheckpointHandler(),
                     "meta": ocp.JsonCheckpointHandler()},
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
      ),
  )


def save(mngr: ocp.CheckpointManager, step: int, state: nnx.State,
         meta: dict[str, Any]) -> None:
  """Saves ``state`` and ``meta`` as checkpoint ``step``."""
  mngr.save(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(nnx.to_pure_dict(state)),
          meta=ocp.args.JsonSave(meta),
      ),
      force=True,
  )


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """``{"0/layers/0/mlp/...": shape}`` for the arrays of a pure-dict tree."""
  key = lambda k: str(getattr(k, "key", getattr(k, "idx", k)))
  return {"/".join(key(k) for k in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _mismatch(stored: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]]) -> str:
  """The first difference between two shape maps, in words ("" if none)."""
  for name in sorted(set(stored) | set(wanted)):
    if stored.get(name) != wanted.get(name):
      return (f"{name} is {stored.get(name, 'absent')} in the checkpoint, "
              f"{wanted.get(name, 'absent')} in this run")
  return ""


def holds_old_int8_moments(stored: dict[str, tuple[int, ...]]) -> bool:
  """Whether a checkpoint's arrays hold int8 moments in foam_jax 0.2's layout.

  0.2 kept a ``codes``/``scales`` pair at each weight's place
  (``.../mu/<weight>/codes``); 0.3 keeps a tree of codes and a tree of
  scales (``.../mu/codes/<weight>``).

  Examples:
    >>> holds_old_int8_moments({"1/0/mu/up/kernel/codes": (4, 8)})
    True
    >>> holds_old_int8_moments({"1/0/mu/codes/up/kernel": (4, 8)})
    False
  """
  return any(name.rsplit("/", 1)[-1].lstrip(".") in ("codes", "scales") for name in stored)


def restore(mngr: ocp.CheckpointManager, step: int,
            state: nnx.State) -> tuple[nnx.State, dict[str, Any]]:
  """Checkpoint ``step`` restored onto ``state``'s shapes and shardings.

  Returns:
    ``(state, meta)``; ``state`` is updated in place.

  Raises:
    RestoreError: the checkpoint's arrays do not fit this run's state
      (another model or optimizer): the message names the step and the
      directory.

  Examples:
    >>> import tempfile, optax
    >>> from examples.llama import configs, sharding, state
    >>> mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
    >>> cfg = configs.get_config("tiny", num_layers=1)
    >>> _, st, _ = state.create_state(cfg, optax.adam(1e-3), mesh, seed=0)
    >>> mngr = manager(tempfile.mkdtemp())
    >>> save(mngr, 7, st, {"step": 7})
    >>> _, fresh, _ = state.create_state(cfg, optax.adam(1e-3), mesh, seed=1)
    >>> fresh, meta = restore(mngr, 7, fresh)
    >>> meta, bool((fresh[0]["lm_head"]["kernel"][...] == st[0]["lm_head"]["kernel"][...]).all())
    ({'step': 7}, True)
  """
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(state))
  stored = _shapes(mngr.item_metadata(step)["state"])
  if holds_old_int8_moments(stored):
    raise RestoreError(
        f"Checkpoint {step} in {mngr.directory} holds int8 optimizer moments in "
        "foam_jax 0.2's layout (a codes/scales pair per weight), which this version "
        "cannot read. To keep the run, resume it with foam_jax 0.2 and float moments "
        "(--mu-dtype float32 --nu-dtype float32 converts the state), then resume "
        "that with this version and int8 again; or start fresh with another --out.")
  problem = _mismatch(stored, _shapes(target))
  if problem:  # Checked before reading, so no read is left running.
    raise RestoreError(
        f"Checkpoint {step} in {mngr.directory} does not fit this run's model "
        f"and optimizer state (written with other settings, or by a version "
        f"whose optimizer state is laid out differently?): {problem}.")
  restored = mngr.restore(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
      ),
  )
  nnx.replace_by_pure_dict(state, restored["state"])
  return state, restored["meta"]
