"""Argument checks shared by the transform and the aliases.

Hyperparameters may arrive as Python numbers, concrete arrays, tracers (under
``optax.inject_hyperparams`` inside ``jit``) or schedules. Only values that
are known now are checked; the others are checked wherever they are concrete.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from foam_jax._src import folding


def concrete_number(value: Any) -> float | None:
  """The value as a float when it is a known scalar, else ``None``.

  A complex scalar (``optax.inject_hyperparams`` casts hyperparameters to
  complex params' dtype) counts by its real part; a nonzero imaginary part
  is a ``ValueError``.
  """
  if isinstance(value, numbers.Real):
    return float(value)
  if isinstance(value, (np.ndarray, np.generic)) and np.size(value) == 1:
    number = complex(np.asarray(value).reshape(()))
  elif (
      isinstance(value, jax.Array)
      and not isinstance(value, jax.core.Tracer)
      and value.size == 1
  ):
    number = complex(value.reshape(()))
  else:
    return None
  if number.imag:
    raise ValueError(f"a hyperparameter must be real, got {number}.")
  return number.real


def real_part(value: Any) -> Any:
  """``value`` with a complex array's (zero) imaginary part dropped.

  Hyperparameters injected by ``optax.inject_hyperparams`` arrive in the
  params' dtype, complex for complex params; the moments' decay rates and
  scales are real.
  """
  if hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jnp.complexfloating):
    return jnp.real(value)
  return value


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
  if number in (float("inf"), float("-inf")):
    raise ValueError(f"{name} must be finite, got {number}.")
  if low is not None and number < low:
    raise ValueError(f"{name} must be >= {low}, got {number}.")
  if high is not None:
    if number > high or (not high_inclusive and number == high):
      bound = "<=" if high_inclusive else "<"
      hint = ""
      if number == high == 1.0 and getattr(value, "dtype", None) is not None and (
          jnp.finfo(value.dtype).bits < 32):
        hint = (f" A {name} such as 0.999 rounds to 1.0 in {jnp.dtype(value.dtype).name}:"
                " under optax.inject_hyperparams with 16-bit params, pass "
                "hyperparam_dtype=jnp.float32.")
      raise ValueError(f"{name} must be {bound} {high}, got {number}.{hint}")


def check_level(name: str, value: Any) -> None:
  """Raises unless ``value`` is a non-negative Python ``int``."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(
        f"{name} must be a non-negative Python int or {folding.WHOLE_AXIS!r}, "
        f"got {value!r}. (With "
        f"optax.inject_hyperparams, pass static_args=('{name}',).)"
    )
  if value < 0:
    raise ValueError(f"{name} must be >= 0, got {value}.")


def storage_dtype(name: str, value: Any, *, real: bool = False) -> jnp.dtype | None:
  """Checks a moment storage dtype (``mu_dtype``/``nu_dtype``); ``None`` passes.

  Moments need a floating dtype (or a complex one, unless ``real``) of at
  least 16 bits and float32's range (not float16), or ``int8``, which
  means blockwise-quantized 8-bit storage
  (:mod:`foam_jax._src.quantize`). Other integer and bool storage would
  truncate them, and unscaled 8-bit floats underflow second moments, so
  training would silently stall.

  Raises:
    TypeError: ``value`` is not a dtype, or not one moments can be stored in.
  """
  if value is None:
    return None
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    raise TypeError(f"{name} must be a dtype, got {value!r}.") from None
  if dtype == jnp.int8:
    return dtype  # Blockwise-quantized storage, see foam_jax._src.quantize.
  allowed = (jnp.floating,) if real else (jnp.floating, jnp.complexfloating)
  if not any(jnp.issubdtype(dtype, kind) for kind in allowed):
    what = "a real floating" if real else "a floating or complex"
    raise TypeError(
        f"{name}={dtype.name} is not supported: optimizer moments need {what} "
        "dtype (bfloat16, float32, float64) or int8 (blockwise-quantized); "
        "other integer and bool storage would truncate them."
    )
  if dtype.itemsize < 2:
    raise TypeError(
        f"{name}={dtype.name} is not supported: 8-bit float storage underflows "
        "unscaled second moments; use int8 (blockwise-quantized), bfloat16 or "
        "float32."
    )
  if dtype == jnp.float16:
    raise TypeError(
        f"{name}=float16 is not supported: float16 overflows at 65504, so one "
        "gradient entry above 256 makes a second moment infinite (its entry "
        "freezes) and one above 6.6e5 makes the update NaN. Use bfloat16 (the same "
        "bytes with float32's range), int8 (blockwise-quantized) or float32; "
        "float16 parameters store their moments in bfloat16 by default."
    )
  return dtype


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
  """Raises ``ValueError`` unless ``value`` is one of ``choices``."""
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}.")


def fold_level_or_default(value: Any) -> int | str:
  """``value`` checked as a fold level; ``None`` is the default level 2.

  A level is a non-negative Python ``int`` or ``"whole_axis"``.
  """
  if value is None:
    return folding.DEFAULT_FOLD_LEVEL
  if isinstance(value, str) and value == folding.WHOLE_AXIS:
    return value
  check_level("fold_level", value)
  return int(value)  # A NumPy integer works as the Python int it equals.


def check_bool(name: str, value: Any) -> None:
  """Raises ``TypeError`` unless ``value`` is a ``bool`` (NumPy's included)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r}.")


def check_count(name: str, value: Any, *, low: int = 1) -> None:
  """Raises unless ``value`` is an integer of at least ``low``.

  A Python or NumPy ``int``, or an integer array (``optax.inject_hyperparams``
  passes one, traced: its value is checked when it is known).
  """
  if isinstance(value, (jax.Array, np.ndarray)) and jnp.issubdtype(value.dtype, jnp.integer):
    number = concrete_number(value)
    if number is not None and number < low:
      raise ValueError(f"{name} must be >= {low}, got {int(number)}.")
    return
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {value!r}.")
  if value < low:
    raise ValueError(f"{name} must be >= {low}, got {value}.")


def adam_hyperparameters(b1, b2, eps, eps_root, alpha, residual_scale) -> tuple:
  """Checks a folded Adam's hyperparameters; returns them with real parts.

  Raises:
    ValueError: ``b1``/``b2`` outside ``[0, 1)``; a negative or infinite
      ``eps``, ``eps_root``, ``alpha`` or ``residual_scale``.
  """
  check_number("b1", b1, low=0.0, high=1.0, high_inclusive=False)
  check_number("b2", b2, low=0.0, high=1.0, high_inclusive=False)
  check_number("eps", eps, low=0.0)
  check_number("eps_root", eps_root, low=0.0)
  check_number("alpha", alpha, low=0.0)
  check_number("residual_scale", residual_scale, low=0.0)
  return tuple(map(real_part, (b1, b2, eps, eps_root, alpha, residual_scale)))


def as_arrays(tree: Any) -> Any:
  """``tree`` with Python-number and NumPy leaves as JAX arrays, as Optax takes them.

  Other leaves (arrays, ``jax.ShapeDtypeStruct``, ``None``, ``optax.MaskedNode``)
  stay as they are.

  Examples:
    >>> as_arrays({"w": 1.0, "b": None})["w"].dtype
    dtype('float32')
  """
  absent = lambda x: x is None or type(x).__name__ == "MaskedNode"
  number = (int, float, complex, np.ndarray, np.generic)
  convert = lambda x: jnp.asarray(x) if isinstance(x, number) else x
  return jax.tree.map(convert, tree, is_leaf=absent)


def checked_mask(mask: Any, name: str = "mask") -> Any:
  """``mask`` (a pytree of bools) as a callable that names a mismatch with the params.

  ``None`` and callables are returned as they are.
  """
  if mask is None or callable(mask):
    return mask

  def for_params(params):
    try:
      jax.tree.map(lambda *_: None, mask, params, is_leaf=lambda x: x is None)
    except (ValueError, TypeError) as error:
      raise ValueError(
          f"{name} must be a pytree of bools with the params' structure (or a prefix "
          f"of it): {name} is {jax.tree.structure(mask)}, the params are "
          f"{jax.tree.structure(params)}.") from error
    return mask

  return for_params


def check_inexact_leaves(params: Any) -> None:
  """Raises ``TypeError`` naming the first parameter that is not a float or complex.

  Moments of integer or bool weights are not defined (``optax.adam`` fails
  on them too, without saying where).
  """
  absent = lambda x: x is None or type(x).__name__ == "MaskedNode"
  for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=absent)[0]:
    dtype = getattr(leaf, "dtype", None)
    if absent(leaf) or dtype is None:
      continue
    if not jnp.issubdtype(dtype, jnp.inexact):
      raise TypeError(
          f"The parameter at {jax.tree_util.keystr(path)} has dtype "
          f"{jnp.dtype(dtype).name}: optimizer moments need floating or complex "
          "parameters (train integer or bool leaves with another optimizer, e.g. "
          "optax.set_to_zero() under optax.partition, or keep them out of the "
          "optimized tree).")
