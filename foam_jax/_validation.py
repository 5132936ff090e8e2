"""Argument checks shared by the transform and the aliases.

Hyperparameters may arrive as Python numbers, concrete arrays, tracers (under
``optax.inject_hyperparams`` inside ``jit``) or schedules. Only values that
are known now are checked; the others are checked wherever they are concrete.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import numpy as np


def concrete_number(value: Any) -> float | None:
  """The value as a float when it is a known scalar, else ``None``."""
  if isinstance(value, numbers.Real):
    return float(value)
  if isinstance(value, (np.ndarray, np.generic)) and np.size(value) == 1:
    return float(np.asarray(value).reshape(()))
  if (
      isinstance(value, jax.Array)
      and not isinstance(value, jax.core.Tracer)
      and value.size == 1
  ):
    return float(value.reshape(()))
  return None


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    high_inclusive: bool = True,
    allow_callable: bool = False,
) -> None:
  """Raises if ``value`` is a known number outside ``[low, high]``.

  Args:
    name: the argument's name, used in the message.
    value: the argument.
    low: inclusive lower bound, or ``None``.
    high: upper bound, or ``None``.
    high_inclusive: whether ``high`` itself is allowed.
    allow_callable: whether a callable (a schedule) is accepted unchecked.

  Raises:
    TypeError: ``value`` is not a number, an array or (if allowed) callable.
    ValueError: ``value`` is a known number outside the bounds, or NaN.
  """
  if allow_callable and callable(value):
    return
  if isinstance(value, (str, bytes)) or value is None:
    raise TypeError(f"{name} must be a number, got {value!r}.")
  number = concrete_number(value)
  if number is None:
    if not isinstance(value, (jax.Array, np.ndarray, np.generic)):
      kind = "a number or a schedule" if allow_callable else "a number"
      raise TypeError(f"{name} must be {kind}, got {value!r}.")
    return
  if number != number:
    raise ValueError(f"{name} must not be NaN.")
  if low is not None and number < low:
    raise ValueError(f"{name} must be >= {low}, got {number}.")
  if high is not None:
    if number > high or (not high_inclusive and number == high):
      bound = "<=" if high_inclusive else "<"
      raise ValueError(f"{name} must be {bound} {high}, got {number}.")


def check_level(name: str, value: Any) -> None:
  """Raises unless ``value`` is a non-negative Python ``int``."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(
        f"{name} must be a non-negative Python int, got {value!r}. (With "
        f"optax.inject_hyperparams, pass static_args=('{name}',).)"
    )
  if value < 0:
    raise ValueError(f"{name} must be >= 0, got {value}.")
