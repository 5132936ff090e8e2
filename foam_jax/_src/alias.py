"""Ready-made FOAM optimizers: ``foam``, ``foam_mini`` and the paper's schedule."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import optax

from foam_jax._src import folding
from foam_jax._src import specs as specs_lib
from foam_jax._src import transform
from foam_jax._src import validation as _validation

__all__ = ["foam", "foam_mini", "paper_schedule"]


def foam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    weight_decay: optax.ScalarOrSchedule = 1e-4,
    mask: Any | Callable[[optax.Params], Any] | None = None,
    *,
    nesterov: bool = False,
    fold_level: specs_lib.Level | None = None,
    alpha: float = 1.0,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
    second_moment: transform.SecondMoment = "mean_of_squares",
    nu_dtype: Any | None = None,
    bias_correction: transform.BiasCorrection = "step_size",
) -> optax.GradientTransformationExtraArgs:
  r"""FOAM: a drop-in replacement for ``optax.adamw`` with folded moments.

  ``optax.chain(scale_by_foam(...), add_decayed_weights(weight_decay, mask),
  scale_by_learning_rate(learning_rate))``, so each parameter ``W`` moves by

  .. math::

    W \leftarrow W - \eta_t \left(u_t + \lambda_t W\right)

  with :math:`u_t` the FOAM direction of :func:`scale_by_foam` (Adam whose
  moments are block means of ``2**fold_level`` entries along one axis, plus
  the current gradient's residual). Weight matrices, folded along their
  input-feature axis (:class:`foam_jax.FoldPolicy`), keep ``1/2**fold_level``
  of Adam's state; embeddings, output heads and vectors keep Adam's.

  The positional parameters are ``optax.adamw``'s, in its order and with its
  defaults (``weight_decay=1e-4`` included), as is its keyword-only
  ``nesterov``: ``foam(lr)`` is ``adamw(lr)`` with folded moments. FOAM's
  own options follow, keyword-only. The paper's recipe for LLaMA
  pre-training is one line::

    foam_jax.foam(foam_jax.paper_schedule(1e-2, total_steps), b2=0.95,
                  weight_decay=0.0, alpha=0.25)  # fold_level 2, eps 1e-8

  Args:
    learning_rate: a float or an Optax schedule (non-negative).
    b1: first-moment decay, in ``[0, 1)``.
    b2: second-moment decay, in ``[0, 1)``.
    eps: denominator term, ``>= 0``, added outside the bias correction (see
      :func:`scale_by_foam`).
    eps_root: added to the second moment inside the square root, ``>= 0``.
    mu_dtype: storage dtype of the first moments (default: the param's;
      bfloat16 for float16 params);
      ``jnp.int8`` (or ``"int8"``) stores it blockwise-quantized in 8 bits
      (codes plus one float32 scale per 256 entries, see
      :class:`foam_jax.QuantizedMoments`).
    weight_decay: decoupled weight decay ``lambda >= 0`` (AdamW's), a float
      or an Optax schedule.
    mask: which leaves get weight decay (a pytree of bools or a callable),
      as in ``optax.adamw``.
    nesterov: Nesterov momentum, as in ``optax.adamw``.
    fold_level: blocks hold ``2**fold_level`` entries (``0`` is Adam);
      ``None`` is the default, ``2``; ``"whole_axis"`` folds each fold axis
      into one block (:func:`foam_mini`). An explicit level under
      ``optax.inject_hyperparams`` needs ``static_args=("fold_level",)``.
    alpha: extra scale of the folded leaves' updates.
    residual_scale: weight of the gradient residual (``0`` drops it).
    fold_spec: which leaves to fold how; see :func:`scale_by_foam`.
    second_moment: ``"mean_of_squares"`` (authors' code) or
      ``"square_of_mean"`` (paper's text).
    nu_dtype: storage dtype of the second moments (default: the real dtype
      of the param's precision); ``jnp.int8`` (or ``"int8"``) stores it
      blockwise-quantized in 8 bits (codes plus one float32 scale per 256
      entries, see :class:`foam_jax.QuantizedMoments`).
    bias_correction: ``"step_size"`` (the authors' form), ``"moments"``
      (``optax.adamw``'s) or ``"folded_moments"`` (the folded moments
      corrected before the residual is added); see :func:`scale_by_foam`.

  Returns:
    An ``optax.GradientTransformationExtraArgs``.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, foam_jax
    >>> params = {"w": jnp.ones((16, 4)), "b": jnp.zeros((4,))}
    >>> tx = optax.chain(optax.clip_by_global_norm(1.0), foam_jax.foam(1e-3))
    >>> state = tx.init(params)
    >>> loss = lambda p: jnp.sum((p["w"] @ jnp.ones(4) - 1.0) ** 2)
    >>> grads = jax.grad(loss)(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  _validation.check_number(
      "learning_rate", learning_rate, low=0.0, allow_callable=True
  )
  _validation.check_number(
      "weight_decay", weight_decay, low=0.0, allow_callable=True
  )
  return optax.chain(
      transform.scale_by_foam(
          b1,
          b2,
          eps,
          eps_root,
          mu_dtype,
          nesterov=nesterov,
          fold_level=fold_level,
          alpha=alpha,
          residual_scale=residual_scale,
          fold_spec=fold_spec,
          second_moment=second_moment,
          nu_dtype=nu_dtype,
          bias_correction=bias_correction,
      ),
      optax.add_decayed_weights(weight_decay, _validation.checked_mask(mask)),
      optax.scale_by_learning_rate(learning_rate),
  )


def _fixed_level_variant(level: specs_lib.Level, name: str, doc: str):
  """``foam`` with ``fold_level`` fixed and removed from its signature.

  Like ``functools.partial(foam, fold_level=level)`` (Optax's way to make
  variants), except that passing ``fold_level`` is an error instead of
  silently giving another optimizer.
  """
  signature = inspect.signature(foam)

  @functools.wraps(foam)
  def variant(*args, **kwargs):
    if "fold_level" in kwargs:
      raise TypeError(
          f"{name}() takes no fold_level (its level is fixed); use "
          "foam_jax.foam(..., fold_level=...) for another level."
      )
    return foam(*args, fold_level=level, **kwargs)

  variant.__name__ = variant.__qualname__ = name
  variant.__doc__ = doc
  variant.__signature__ = signature.replace(parameters=[  # type: ignore[attr-defined]
      p for p in signature.parameters.values() if p.name != "fold_level"
  ])
  del variant.__wrapped__
  return variant


foam_mini = _fixed_level_variant(folding.WHOLE_AXIS, "foam_mini", r"""
  FOAM-Mini: every folded matrix keeps one moment per output feature.

  The paper's smallest point: ``foam(..., fold_level="whole_axis")``, each
  fold axis one block, so a Dense kernel ``(in, out)`` keeps ``2 * out``
  state values instead of Adam's ``2 * in * out``; embeddings, output heads
  and vectors keep Adam's. Takes every argument of :func:`foam` except
  ``fold_level``. In a ``fold_spec``, ``FoldSpec(level=None)`` means a
  whole-axis block and an explicit level wins.

  Examples:
    >>> import jax.numpy as jnp, foam_jax
    >>> tx = foam_jax.foam_mini(1e-3)
    >>> tx.init({"kernel": jnp.zeros((512, 64))})[0].mu["kernel"].shape
    (1, 64)
  """)


def paper_schedule(
    peak_value: float,
    total_steps: int,
    warmup_fraction: float = 0.1,
    final_fraction: float = 0.1,
) -> optax.Schedule:
  """The paper's learning-rate schedule: linear warmup, cosine to 0.1x peak.

  ``optax.warmup_cosine_decay_schedule`` from 0 to ``peak_value`` over the
  first ``warmup_fraction`` of ``total_steps``, then cosine decay to
  ``final_fraction * peak_value`` at ``total_steps``.

  Args:
    peak_value: the peak learning rate (the paper's FOAM recipe: ``1e-2``).
    total_steps: length of the run in optimizer steps.
    warmup_fraction: fraction of steps spent warming up (paper: 10%).
    final_fraction: final learning rate as a fraction of the peak (paper: 0.1).

  Returns:
    An Optax schedule.

  Examples:
    >>> import foam_jax
    >>> sched = foam_jax.paper_schedule(1e-2, 1000)
    >>> [round(float(sched(s)), 6) for s in (0, 100, 1000)]
    [0.0, 0.01, 0.001]
  """
  _validation.check_number("peak_value", peak_value, low=0.0)
  if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
    raise ValueError(f"total_steps must be a positive int, got {total_steps!r}.")
  _validation.check_number("warmup_fraction", warmup_fraction, low=0.0, high=1.0)
  _validation.check_number("final_fraction", final_fraction, low=0.0)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=peak_value,
      warmup_steps=int(round(warmup_fraction * total_steps)),
      decay_steps=total_steps,
      end_value=final_fraction * peak_value,
  )
