"""The optimizers the example compares, behind one ``make_optimizer`` call.

Every optimizer runs on the paper's schedule (linear warmup over the first
10% of steps, cosine decay to 0.1x the peak) with betas (0.9, 0.95) where it
has them, no weight decay and no clipping unless asked. Default peak
learning rates (``DEFAULT_LR``). ``foam`` and ``adamw`` were tuned on the
``tiny`` demo (300 steps of 16 x 128 bytes; final validation loss, lower is
better: foam 3e-3: 1.61, 1e-2: 1.30, 3e-2: 1.48; adamw 3e-4: 2.13, 1e-3:
1.57, 3e-3: 1.85, 1e-2: 2.00); the others are their papers' usual values,
not tuned here:

* ``foam``: the paper's recipe ``foam(lr, b2=0.95, alpha=0.25)``, level 2,
  lr ``1e-2`` (folded matrices move at ``alpha * lr = 2.5e-3``; embeddings,
  lm_head and norms at ``1e-2``).
* ``foam_mini``: the same with every matrix folded to one value per output
  feature (``foam_jax.foam_mini``), lr ``1e-2``.
* ``adamw``: ``optax.adamw``, lr ``1e-3``.
* ``adafactor``: ``optax.adafactor`` (factored second moment, relative step
  via ``multiply_by_parameter_scale``), lr ``1e-2``.
* ``lion``: ``optax.lion`` (b1 0.9, b2 0.99), lr ``3e-4`` (Lion wants a
  3-10x smaller lr than AdamW: its sign update has unit size per entry).
* ``muon``: ``optax.contrib.muon`` on the hidden matrices (lr ``2e-2``,
  Newton-Schulz orthogonalised Nesterov momentum, beta 0.95); embeddings,
  lm_head and 1-D leaves get AdamW at ``lr * 1e-3 / 2e-2`` (the ``adamw``
  default when lr is Muon's default). Left alone, Optax's Muon would apply
  Muon to every 2-D leaf, embeddings and lm_head included.
"""

from __future__ import annotations


import jax
import optax

import foam_jax

__all__ = ["DEFAULT_LR", "OPTIMIZERS", "make_optimizer"]

DEFAULT_LR: dict[str, float] = {
    "foam": 1e-2,
    "foam_mini": 1e-2,
    "adamw": 1e-3,
    "adafactor": 1e-2,
    "lion": 3e-4,
    "muon": 2e-2,
}
OPTIMIZERS = tuple(DEFAULT_LR)

# FOAM's alpha in the paper's recipe (scales the folded matrices' updates).
FOAM_ALPHA = 0.25


def _is_adam_leaf(path) -> bool:
  name = jax.tree_util.keystr(path).lower()
  return "embed" in name or "lm_head" in name


def _muon_dims(params):
  """Muon for 2-D hidden matrices; AdamW for embeddings, lm_head, vectors."""
  def choose(path, p):
    if getattr(p, "ndim", 0) != 2 or _is_adam_leaf(path):
      return None
    return optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=1)

  return jax.tree_util.tree_map_with_path(choose, params)


def schedule(peak: float, total_steps: int, warmup_fraction: float) -> optax.Schedule:
  """The example's learning-rate schedule: the paper's warmup + cosine to 0.1x.

  Examples:
    >>> round(float(schedule(1e-2, 100, 0.1)(10)), 6)
    0.01
  """
  return foam_jax.paper_schedule(peak, total_steps, warmup_fraction)


def make_optimizer(
    name: str,
    learning_rate: float | None,
    total_steps: int,
    *,
    warmup_fraction: float = 0.1,
    weight_decay: float = 0.0,
    clip: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.95,
) -> optax.GradientTransformation:
  """An optimizer by name, on the paper's warmup + cosine schedule.

  Args:
    name: one of ``foam, foam_mini, adamw, adafactor, lion, muon``.
    learning_rate: the peak learning rate; ``None`` takes ``DEFAULT_LR[name]``.
    total_steps: the run's length (the schedule's horizon).
    warmup_fraction: fraction of the steps spent in linear warmup.
    weight_decay: decoupled weight decay (0 in the paper's pre-training).
    clip: clip gradients to this global norm first; ``0`` disables.
    b1: first-moment decay (Lion's interpolation factor).
    b2: second-moment decay (ignored by adafactor; Lion uses 0.99).

  Returns:
    An ``optax.GradientTransformation``.

  Raises:
    ValueError: unknown name or invalid number.

  Examples:
    >>> import jax.numpy as jnp
    >>> tx = make_optimizer("foam", None, total_steps=100)
    >>> state = tx.init({"w": jnp.zeros((8, 4))})
  """
  if name not in DEFAULT_LR:
    raise ValueError(f"Unknown optimizer {name!r}; choose one of {OPTIMIZERS}.")
  lr = DEFAULT_LR[name] if learning_rate is None else learning_rate
  if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0:
    raise ValueError(f"learning_rate must be a positive number, got {lr!r}.")
  if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
    raise ValueError(f"total_steps must be a positive int, got {total_steps!r}.")
  if not 0.0 <= warmup_fraction <= 1.0:
    raise ValueError(f"warmup_fraction must be in [0, 1], got {warmup_fraction!r}.")
  if weight_decay < 0:
    raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}.")
  if clip < 0:
    raise ValueError(f"clip must be >= 0 (0 disables), got {clip!r}.")

  sched = schedule(lr, total_steps, warmup_fraction)
  if name == "foam":
    tx = foam_jax.foam(sched, b1=b1, b2=b2, weight_decay=weight_decay,
                       alpha=FOAM_ALPHA)
  elif name == "foam_mini":
    tx = foam_jax.foam_mini(sched, b1=b1, b2=b2, weight_decay=weight_decay,
                            alpha=FOAM_ALPHA)
  elif name == "adamw":
    tx = optax.adamw(sched, b1=b1, b2=b2, weight_decay=weight_decay)
  elif name == "adafactor":
    tx = optax.adafactor(sched, weight_decay_rate=weight_decay or None)
  elif name == "lion":
    tx = optax.lion(sched, b1=b1, b2=0.99, weight_decay=weight_decay)
  else:  # muon
    tx = optax.contrib.muon(
        sched,
        beta=0.95,
        weight_decay=weight_decay,
        adam_b1=b1,
        adam_b2=b2,
        adam_weight_decay=weight_decay,
        adam_learning_rate=schedule(
            lr * DEFAULT_LR["adamw"] / DEFAULT_LR["muon"], total_steps,
            warmup_fraction),
        muon_weight_dimension_numbers=_muon_dims,
    )
  if clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(clip), tx)
  return tx
