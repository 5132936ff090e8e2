"""The example's optimizers: families a user picks, with the settings they choose.

One name per optimizer family (``make_optimizer(name, ...)``), built the way
Optax's ``alias.py`` builds optimizers, with the settings a user would pass:

* ``foam``: ``foam_jax.foam`` with the paper's recipe (``alpha=0.25``, betas
  0.9/0.95, no weight decay); ``fold_level`` (default: the library's, 2)
  and ``fold_axis`` (default ``-2``, Flax's input axis; ``-1`` folds the
  last axis of the leaves the default policy folds).
* ``foam_mini``: ``foam_jax.foam_mini``, each fold axis one block;
  ``fold_axis`` as for ``foam``.
* ``foam_muon``, ``foam_lion``: ``foam_jax.foam_muon`` and
  ``foam_jax.foam_lion``, Muon's and Lion's momentum folded at
  ``fold_level`` (default 2), with ``muon``'s and ``lion``'s settings.
* ``adamw``, ``adafactor``, ``lion``: Optax's.
* ``muon``: ``optax.contrib.muon`` on the hidden matrices; embeddings,
  ``lm_head`` and 1-D leaves get its AdamW, at ``adam_lr_ratio`` times the
  peak lr (default ``1e-3 / 2e-2``: the ``adamw`` default when lr is Muon's).
* ``galore``: ``optax.contrib.galore`` on the same matrices, the GaLore
  paper's recipe (rank ``hidden_size / 4``, scale 0.25, Adam in the
  subspace, projection refreshed every quarter of the run).

Moment storage (``mu_dtype=``, ``nu_dtype=``; ``MOMENT_DTYPES`` lists what
each family takes): ``float32``, ``bfloat16`` or ``int8`` (blockwise 8-bit,
``foam_jax.QuantizedMoments``) for FOAM, FOAM-Mini, folded Muon and folded
Lion; ``float32`` or ``bfloat16`` for the first moment of Optax's AdamW, Lion
and Muon; none for Adafactor and GaLore. ``FOLD_SETTINGS`` lists which
families take ``fold_level`` and ``fold_axis``.

"Hidden matrices" are one rule for all: the leaves FOAM's default policy
folds (``foam_jax.default_fold_specs``), which for Muon and GaLore must also
be 2-D. Defaults follow the paper's pre-training (betas 0.9/0.95, no weight
decay, the warmup + cosine ``foam_jax.paper_schedule``); callers override any
setting by keyword. ``DEFAULT_LR``: ``foam`` and ``adamw`` were tuned on the
``tiny`` demo (300 steps of 16 x 128 bytes, final validation loss; foam 3e-3:
1.61, 1e-2: 1.30, 3e-2: 1.48; adamw 3e-4: 2.13, 1e-3: 1.57, 3e-3: 1.85,
1e-2: 2.00); the others are their papers' usual values, not tuned here. Lion
wants a 3-10x smaller lr than AdamW (its sign update has unit size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
from optax import contrib as optax_contrib

import foam_jax

__all__ = [
    "DEFAULT_LR",
    "FOAM_ALPHA",
    "FOLD_SETTINGS",
    "MOMENT_DTYPES",
    "OPTIMIZERS",
    "check_fold_settings",
    "check_moment_dtypes",
    "fold_along",
    "hidden_matrices",
    "make_optimizer",
    "schedule",
]

# FOAM's alpha in the paper's recipe (scales the folded matrices' updates).
FOAM_ALPHA = 0.25

Schedule = Callable[[float], optax.ScalarOrSchedule]


def hidden_matrices(params: Any) -> Any:
  """``True`` for the 2-D leaves FOAM's default policy folds, else ``False``.

  Examples:
    >>> import jax.numpy as jnp
    >>> hidden_matrices({"q_proj": jnp.zeros((8, 8)),
    ...                  "embed_tokens": jnp.zeros((8, 8)), "norm": jnp.zeros(8)})
    {'embed_tokens': False, 'norm': False, 'q_proj': True}
  """
  specs = foam_jax.default_fold_specs(params)
  return jax.tree.map(
      lambda spec, p: spec is not None and len(p.shape) == 2,
      specs, params, is_leaf=lambda x: x is None)


def _dimension_numbers(make: Callable[[int, int], Any]) -> Callable[[Any], Any]:
  """Muon/GaLore dimension numbers: ``make(0, 1)`` on hidden matrices only."""

  def fn(params):
    return jax.tree.map(lambda is_matrix: make(0, 1) if is_matrix else None,
                        hidden_matrices(params))

  return fn


def schedule(peak: float, total_steps: int | None,
             warmup_fraction: float = 0.1) -> optax.ScalarOrSchedule:
  """The paper's warmup + cosine to 0.1x; a constant ``peak`` without steps.

  Examples:
    >>> round(float(schedule(1e-2, 100, 0.1)(10)), 6)
    0.01
    >>> schedule(1e-3, None)
    0.001
  """
  if total_steps is None:
    return peak
  return foam_jax.paper_schedule(peak, total_steps, warmup_fraction)


# ----------------------------------------------------------------------------
# Builders: (peak lr, lr -> schedule, settings) -> GradientTransformation.


def _foam(lr, sched: Schedule, *, b1=0.9, b2=0.95, weight_decay=0.0, fold_level=None,
          fold_axis=-2, alpha=FOAM_ALPHA, **foam_kwargs):
  # No fold_level: the library's default policy (level 2, lowered where a
  # shard is too small for a block).
  if fold_axis != -2:
    foam_kwargs["fold_spec"] = fold_along(fold_axis, 2 if fold_level is None else fold_level)
  elif fold_level is not None:
    foam_kwargs["fold_level"] = fold_level
  return foam_jax.foam(sched(lr), b1=b1, b2=b2, weight_decay=weight_decay, alpha=alpha,
                       **foam_kwargs)


def fold_along(axis: int, level: int | str | None) -> Callable[[Any], Any]:
  """A fold-spec callable: the default policy's leaves, folded along ``axis``.

  ``level=None`` leaves each spec's level to the optimizer's ``fold_level``.
  """

  def specs(params):
    return jax.tree.map(
        lambda s: None if s is None else foam_jax.FoldSpec(axis=axis, level=level),
        foam_jax.default_fold_specs(params),
        is_leaf=lambda x: x is None or isinstance(x, foam_jax.FoldSpec))

  return specs


def _foam_mini(lr, sched: Schedule, *, b1=0.9, b2=0.95, weight_decay=0.0,
               fold_axis=-2, alpha=FOAM_ALPHA, **foam_kwargs):
  if fold_axis != -2:
    foam_kwargs["fold_spec"] = fold_along(fold_axis, "whole_axis")
  return foam_jax.foam_mini(sched(lr), b1=b1, b2=b2, weight_decay=weight_decay,
                            alpha=alpha, **foam_kwargs)


def _adamw(lr, sched: Schedule, *, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0,
           mu_dtype=None):
  return optax.adamw(sched(lr), b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                     mu_dtype=mu_dtype)


def _adafactor(lr, sched: Schedule, *, weight_decay=0.0):
  return optax.adafactor(sched(lr), weight_decay_rate=weight_decay or None)


def _lion(lr, sched: Schedule, *, b1=0.9, b2=0.99, weight_decay=0.0, mu_dtype=None):
  return optax.lion(sched(lr), b1=b1, b2=b2, weight_decay=weight_decay, mu_dtype=mu_dtype)


def _muon(lr, sched: Schedule, *, b1=0.9, b2=0.95, weight_decay=0.0, beta=0.95,
          adam_lr_ratio=None, mu_dtype=None, adam_weight_decay=None):
  # Default: AdamW's default lr when lr is Muon's (written so, not as a
  # rounded ratio, to keep the numbers of runs made before the registry).
  adam_lr = (lr * DEFAULT_LR["adamw"] / DEFAULT_LR["muon"] if adam_lr_ratio is None
             else lr * adam_lr_ratio)
  return optax_contrib.muon(
      sched(lr), beta=beta, weight_decay=weight_decay, mu_dtype=mu_dtype, adam_b1=b1,
      adam_b2=b2, adam_learning_rate=sched(adam_lr),
      adam_weight_decay=weight_decay if adam_weight_decay is None else adam_weight_decay,
      muon_weight_dimension_numbers=_dimension_numbers(
          optax_contrib.MuonDimensionNumbers))


def _foam_lion(lr, sched: Schedule, *, b1=0.9, b2=0.99, weight_decay=0.0, fold_level=None,
               mu_dtype=None):
  return foam_jax.foam_lion(sched(lr), b1=b1, b2=b2, weight_decay=weight_decay,
                            fold_level=fold_level, mu_dtype=mu_dtype)


def _foam_muon(lr, sched: Schedule, *, b1=0.9, b2=0.95, weight_decay=0.0, beta=0.95,
               adam_lr_ratio=None, fold_level=None, mu_dtype=None, adam_weight_decay=None):
  # As _muon; the hidden matrices are the library's default (FOAM's) policy.
  adam_lr = lr * (DEFAULT_LR["adamw"] / DEFAULT_LR["muon"] if adam_lr_ratio is None
                  else adam_lr_ratio)
  return foam_jax.foam_muon(
      sched(lr), beta=beta, weight_decay=weight_decay, mu_dtype=mu_dtype, adam_b1=b1,
      adam_b2=b2, adam_learning_rate=sched(adam_lr),
      adam_weight_decay=weight_decay if adam_weight_decay is None else adam_weight_decay,
      fold_level=fold_level)


def _galore(lr, sched: Schedule, *, rank: int, update_proj_gap: int, b1=0.9, b2=0.95,
            eps=1e-8, scale=0.25, weight_decay=0.0):
  return optax_contrib.galore(
      sched(lr), rank=rank, update_proj_gap=update_proj_gap, scale=scale,
      weight_decay=weight_decay,
      base_optimizer=optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      weight_dimension_numbers=_dimension_numbers(optax_contrib.GaLoreDimensionNumbers))


_BUILDERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "adamw": _adamw,
    "foam": _foam,
    "foam_mini": _foam_mini,
    "foam_muon": _foam_muon,
    "foam_lion": _foam_lion,
    "lion": _lion,
    "muon": _muon,
    "adafactor": _adafactor,
    "galore": _galore,
}
OPTIMIZERS = tuple(_BUILDERS)

DEFAULT_LR: dict[str, float] = {
    "adamw": 1e-3,
    "foam": 1e-2,
    "foam_mini": 1e-2,
    # Folded Muon and Lion take their unfolded optimizer's lr (not tuned here).
    "foam_muon": 2e-2,
    "foam_lion": 3e-4,
    "lion": 3e-4,
    "muon": 2e-2,
    "adafactor": 1e-2,
    "galore": 1e-2,
}

_FLOAT_DTYPES = ("float32", "bfloat16")
_ALL_DTYPES = (*_FLOAT_DTYPES, "int8")

# Per family, the moment-storage settings it takes and their values.
MOMENT_DTYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "adamw": {"mu_dtype": _FLOAT_DTYPES},
    "foam": {"mu_dtype": _ALL_DTYPES, "nu_dtype": _ALL_DTYPES},
    "foam_mini": {"mu_dtype": _ALL_DTYPES, "nu_dtype": _ALL_DTYPES},
    "foam_muon": {"mu_dtype": _ALL_DTYPES},
    "foam_lion": {"mu_dtype": _ALL_DTYPES},
    "lion": {"mu_dtype": _FLOAT_DTYPES},
    "muon": {"mu_dtype": _FLOAT_DTYPES},
    "adafactor": {},
    "galore": {},
}

# Per family, the fold settings it takes.
FOLD_SETTINGS: dict[str, tuple[str, ...]] = {
    "foam": ("fold_level", "fold_axis"),
    "foam_mini": ("fold_axis",),
    "foam_muon": ("fold_level",),
    "foam_lion": ("fold_level",),
}
FOLD_AXES = (-2, -1)


def check_fold_settings(name: str, **settings: Any) -> None:
  """Raises unless family ``name`` takes these ``fold_level``/``fold_axis`` values.

  ``None`` (the default) is always accepted.

  Raises:
    ValueError: naming the setting, the value and the optimizer.

  Examples:
    >>> check_fold_settings("foam", fold_level=3, fold_axis=-1)
    >>> check_fold_settings("foam_mini", fold_level=3)
    Traceback (most recent call last):
    ...
    ValueError: optimizer 'foam_mini' has no fold_level setting (it takes: fold_axis).
  """
  allowed = FOLD_SETTINGS.get(name, ())
  for key, value in settings.items():
    if value is None:
      continue
    if key not in allowed:
      takes = ", ".join(allowed) or "none"
      raise ValueError(f"optimizer {name!r} has no {key} setting (it takes: {takes}).")
    if key == "fold_level" and (isinstance(value, bool) or not isinstance(value, int)
                                or value < 0):
      raise ValueError(f"fold_level must be an int >= 0, got {value!r}.")
    if key == "fold_axis" and value not in FOLD_AXES:
      raise ValueError(f"fold_axis must be one of {FOLD_AXES}, got {value!r}.")


def check_moment_dtypes(name: str, **dtypes: str | None) -> None:
  """Raises unless optimizer ``name`` takes these ``mu_dtype``/``nu_dtype`` values.

  ``None`` (the default: the params' dtype) is always accepted.

  Raises:
    ValueError: naming the setting, the value and the optimizer.

  Examples:
    >>> check_moment_dtypes("foam", mu_dtype="int8", nu_dtype=None)
    >>> check_moment_dtypes("adamw", nu_dtype="bfloat16")
    Traceback (most recent call last):
    ...
    ValueError: optimizer 'adamw' has no nu_dtype setting (it takes: mu_dtype).
  """
  allowed = MOMENT_DTYPES.get(name, {})
  for key, value in dtypes.items():
    if value is None:
      continue
    if key not in allowed:
      takes = ", ".join(allowed) or "none"
      raise ValueError(
          f"optimizer {name!r} has no {key} setting (it takes: {takes}).")
    if value not in allowed[key]:
      raise ValueError(
          f"optimizer {name!r} takes {key} in {allowed[key]}, got {value!r}.")


def make_optimizer(
    name: str,
    learning_rate: float | None = None,
    total_steps: int | None = None,
    *,
    warmup_fraction: float = 0.1,
    clip: float = 0.0,
    hidden_size: int | None = None,
    **settings: Any,
) -> optax.GradientTransformation:
  """An optimizer of the registry by name.

  Args:
    name: one of ``OPTIMIZERS`` (a family).
    learning_rate: the peak learning rate; ``None`` takes ``DEFAULT_LR[name]``.
    total_steps: the run's length: the lr follows ``foam_jax.paper_schedule``
      over it; ``None`` keeps the lr constant.
    warmup_fraction: fraction of the steps spent in linear warmup.
    clip: clip gradients to this global norm first; ``0`` disables.
    hidden_size: the model's width; GaLore's rank is a quarter of it.
    **settings: the builder's other settings (``b1``, ``b2``, ``weight_decay``,
      FOAM's ``alpha``, ``residual_scale``, ..., Muon's ``adam_lr_ratio``,
      ``mu_dtype``/``nu_dtype`` as names, see ``MOMENT_DTYPES``;
      ``fold_level``/``fold_axis``, see ``FOLD_SETTINGS``; ``None`` values
      are the defaults).

  Returns:
    An ``optax.GradientTransformation``.

  Raises:
    ValueError: unknown name, invalid number, or a moment dtype the optimizer
      does not take.

  Examples:
    >>> import jax.numpy as jnp
    >>> tx = make_optimizer("foam", total_steps=100)
    >>> tx.init({"w": jnp.zeros((8, 4))})[0].mu["w"].shape
    (2, 4)
    >>> tx = make_optimizer("foam", fold_level=1, fold_axis=-1, mu_dtype="bfloat16")
    >>> tx.init({"w": jnp.zeros((8, 4))})[0].mu["w"].shape
    (8, 2)
  """
  if name not in _BUILDERS:
    raise ValueError(f"Unknown optimizer {name!r}; choose one of {OPTIMIZERS}.")
  lr = DEFAULT_LR[name] if learning_rate is None else learning_rate
  if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0:
    raise ValueError(f"learning_rate must be a positive number, got {lr!r}.")
  if total_steps is not None and (
      isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1):
    raise ValueError(f"total_steps must be a positive int, got {total_steps!r}.")
  if not 0.0 <= warmup_fraction <= 1.0:
    raise ValueError(f"warmup_fraction must be in [0, 1], got {warmup_fraction!r}.")
  if settings.get("weight_decay", 0.0) < 0:
    raise ValueError(f"weight_decay must be >= 0, got {settings['weight_decay']!r}.")
  if clip < 0:
    raise ValueError(f"clip must be >= 0 (0 disables), got {clip!r}.")
  settings = {k: v for k, v in settings.items() if v is not None}
  check_moment_dtypes(name, **{k: settings[k] for k in ("mu_dtype", "nu_dtype")
                               if k in settings})
  check_fold_settings(name, **{k: settings[k] for k in ("fold_level", "fold_axis")
                               if k in settings})
  if name == "galore":
    if hidden_size is None and "rank" not in settings:
      raise ValueError("galore needs hidden_size (its rank is hidden_size // 4).")
    settings.setdefault("rank", max(1, (hidden_size or 0) // 4))
    # Optax's 200 steps would fix one subspace for a whole short run.
    settings.setdefault("update_proj_gap", max(1, total_steps // 4) if total_steps else 200)

  tx = _BUILDERS[name](lr, lambda peak: schedule(peak, total_steps, warmup_fraction),
                       **settings)
  if clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(clip), tx)
  return tx
