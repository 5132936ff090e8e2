"""``--resume`` onto another optimizer: the checkpoint's state, converted.

A checkpoint records the run that wrote it (``meta["run"]``: optimizer, lr,
steps, settings). When ``--resume`` names another ``--optimizer``, the
checkpoint is restored with the *old* optimizer's state as the target (built
from the registry with those recorded settings), then turned into the new
optimizer's state by ``foam_jax.convert_state``: folded moments are block
means of the old moments, unfolded ones copies, and every step count carries
over (the schedules' too, so the lr continues where it was). The result lands
on the live state's shardings. A switch ``convert_state`` cannot make
(``adamw -> muon``, ``lion -> foam``: no second moments, ``foam -> adamw``)
ends in a :class:`~examples.llama.checkpoints.RestoreError` naming both
optimizers and the way out.
"""

from __future__ import annotations

from typing import Any
from typing import TYPE_CHECKING

import jax
import optax
import orbax.checkpoint as ocp
from flax import nnx

import foam_jax
from examples.llama import checkpoints
from examples.llama import optimizers as optimizers_lib
from examples.llama import state as state_lib

if TYPE_CHECKING:
  from examples.llama.trainer import Trainer

__all__ = ["checkpoint_optimizer", "old_optimizer", "read_meta", "restore_switched",
           "step_counts"]


def read_meta(mngr: ocp.CheckpointManager, step: int) -> dict[str, Any]:
  """The JSON record saved beside checkpoint ``step`` (no array is read)."""
  return mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def checkpoint_optimizer(meta: dict[str, Any]) -> str | None:
  """The optimizer family that wrote a checkpoint (``None``: not recorded).

  Examples:
    >>> checkpoint_optimizer({"run": {"optimizer": "foam"}}), checkpoint_optimizer({})
    ('foam', None)
  """
  return meta.get("run", {}).get("optimizer")


def old_optimizer(run: dict[str, Any]) -> optax.GradientTransformation:
  """The optimizer a checkpoint was written with, from its ``meta["run"]`` record.

  Built as ``Trainer.setup`` builds it, so its state has the checkpoint's tree.

  Examples:
    >>> run = {"optimizer": "adamw", "lr": 1e-3, "steps": 10, "warmup": 0.1,
    ...        "weight_decay": 0.0, "clip": 0.0, "b1": 0.9, "b2": 0.95,
    ...        "model": {"hidden_size": 64}}
    >>> import jax.numpy as jnp
    >>> type(old_optimizer(run).init({"w": jnp.zeros(2)})[0]).__name__
    'ScaleByAdamState'
  """
  return optimizers_lib.make_optimizer(
      run["optimizer"], run["lr"], run["steps"], warmup_fraction=run["warmup"],
      clip=run["clip"], hidden_size=run["model"]["hidden_size"],
      weight_decay=run["weight_decay"], b1=run["b1"], b2=run["b2"],
      **optimizer_settings(run))


SETTINGS = ("mu_dtype", "nu_dtype", "fold_level", "fold_axis")


def optimizer_settings(run: dict[str, Any]) -> dict[str, Any]:
  """The ``--mu-dtype``, ``--nu-dtype``, ``--fold-level`` and ``--fold-axis``
  a run record names (those not given are absent).

  Examples:
    >>> optimizer_settings({"optimizer": "foam", "mu_dtype": "int8", "fold_level": 3})
    {'mu_dtype': 'int8', 'fold_level': 3}
  """
  return {k: run[k] for k in SETTINGS if run.get(k) is not None}


def _label(name: str, settings: dict[str, Any]) -> str:
  """``foam``, or ``foam --mu-dtype int8`` when a setting was given."""
  return " ".join([name] + [f"--{k.replace('_', '-')} {v}"
                            for k, v in sorted(settings.items())])


def needs_conversion(meta: dict[str, Any], optimizer: str,
                     settings: dict[str, Any]) -> bool:
  """Whether a checkpoint's optimizer state must be converted for this run.

  True when the checkpoint names its optimizer and it, or its settings
  (moment storage, fold level and axis), differ from this run's.

  Examples:
    >>> meta = {"run": {"optimizer": "adamw"}}
    >>> needs_conversion(meta, "adamw", {}), needs_conversion(meta, "foam", {})
    (False, True)
    >>> needs_conversion({"run": {"optimizer": "foam"}}, "foam", {"mu_dtype": "int8"})
    True
  """
  old = checkpoint_optimizer(meta)
  if old is None:
    return False
  return old != optimizer or optimizer_settings(meta.get("run", {})) != settings


def step_counts(opt_state: Any) -> dict[str, int]:
  """``{path: value}`` of every step count (a scalar ``count`` field) in a state.

  Examples:
    >>> import jax.numpy as jnp
    >>> step_counts(optax.adamw(optax.linear_schedule(1.0, 0.0, 9)).init({"w": jnp.zeros(2)}))
    {'[0].count': 0, '[2].count': 0}
  """
  leaves = jax.tree_util.tree_flatten_with_path(opt_state)[0]
  return {jax.tree_util.keystr(path): int(leaf) for path, leaf in leaves
          if path and getattr(path[-1], "name", None) == "count"
          and getattr(leaf, "ndim", 1) == 0}


def _zero_moments(converted: Any, fresh: Any) -> Any:
  """``fresh`` (zero moments) with ``converted``'s step counts."""

  def pick(path, new, zero):
    is_count = path and getattr(path[-1], "name", None) == "count" and new.ndim == 0
    return new if is_count else zero

  return jax.tree_util.tree_map_with_path(pick, converted, fresh)


def _moments_summary(opt_state: Any, params: Any) -> str:
  """"mu, nu: block means for 28 folded weights, copies for 11 others"."""
  folded, copied, fields = 0, 0, []
  is_moments = lambda x: hasattr(x, "_fields") and "mu" in x._fields
  for node in jax.tree.leaves(opt_state, is_leaf=is_moments):
    if not is_moments(node):
      continue
    fields += [f for f in ("mu", "nu") if f in node._fields and f not in fields]
    # Per weight (mu only: nu, where there is one, is folded alike; int8
    # moments by their codes' shapes).
    mu = node.mu.codes if isinstance(node.mu, foam_jax.QuantizedMoments) else node.mu
    same = jax.tree.map(
        lambda p, m: None if isinstance(m, optax.MaskedNode)
        else tuple(m.shape) == tuple(p.shape),
        params, mu, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
    flags = jax.tree.leaves(same)
    copied += sum(flags)
    folded += len(flags) - sum(flags)
  return f"{', '.join(fields)}: block means for {folded} folded weights, copies for {copied} others"


def restore_switched(run: Trainer, step: int, meta: dict[str, Any], *,
                     zero_moments: bool = False) -> tuple[nnx.State, dict[str, Any]]:
  """Checkpoint ``step``, written by another optimizer, converted to ``run``'s.

  Args:
    run: a ``Trainer`` after ``create_state`` (its ``tx``, ``graphdef`` and
      live ``state`` are the new optimizer's; the state is replaced).
    step: the checkpoint to restore from ``run.manager``.
    meta: its JSON record (:func:`read_meta`), whose ``run`` names the old
      optimizer and its settings.
    zero_moments: keep the weights and every step count but start the new
      optimizer's moments from zero (a benchmark's control, not a flag).

  Returns:
    ``(state, meta)`` as ``checkpoints.restore`` returns them.

  Raises:
    RestoreError: ``convert_state`` cannot turn the old state into the new
      one, or the checkpoint does not fit the old optimizer's state.
  """
  old_name = _label(checkpoint_optimizer(meta), optimizer_settings(meta.get("run", {})))
  new_name = _label(run.cfg.optimizer, run.cfg.optimizer_settings())
  where = f"Checkpoint {step} in {run.manager.directory}"
  refuse = (f"{where} was written by --optimizer {old_name}; its optimizer state "
            f"does not fit --optimizer {new_name}")
  advice = (f"resume with --optimizer {old_name}, or start {new_name} fresh with "
            "another --out")
  try:
    old_tx = old_optimizer(meta["run"])
  except (KeyError, ValueError) as e:
    raise checkpoints.RestoreError(
        f"{refuse}, and its record of the run is incomplete ({e!r}); {advice}.") from None
  # The restore target: the old optimizer's state on this run's mesh.
  old_graphdef, old_state, _ = state_lib.create_state(
      run.model_cfg, old_tx, run.mesh, run.cfg.seed)
  old_state, meta = checkpoints.restore(run.manager, step, old_state)
  model, old_opt = nnx.merge(old_graphdef, old_state)
  params = nnx.as_pure(nnx.state(model, nnx.Param))
  try:
    with jax.set_mesh(run.mesh):
      converted = foam_jax.convert_state(nnx.as_pure(old_opt.opt_state), run.tx, params)
  except ValueError as e:
    raise checkpoints.RestoreError(
        f"{refuse} and cannot be converted to it ({e}); {advice}.") from None
  if zero_moments:
    with jax.set_mesh(run.mesh):
      converted = _zero_moments(converted, run.tx.init(params))

  # The live objects take the restored weights and converted state, then the
  # whole state goes onto the live state's shardings (the compiled steps').
  shardings = jax.tree.map(lambda x: x.sharding, run.state)
  live_model, live_opt = nnx.merge(run.graphdef, run.state)
  nnx.update(live_model, nnx.state(model))
  nnx.update(live_opt.opt_state, nnx.state(converted))
  live_opt.step[...] = old_opt.step[...]
  state = jax.device_put(nnx.state((live_model, live_opt)), shardings)
  counts = step_counts(converted)
  what = ("moments zeroed" if zero_moments
          else "moments " + _moments_summary(converted, params))
  print(f"--resume: switched the optimizer from {old_name} to {new_name} at step {step} "
        f"(foam_jax.convert_state): {what}; {len(counts)} step counts carried "
        f"({sorted(set(counts.values()))}), the schedules' included.")
  return state, meta
