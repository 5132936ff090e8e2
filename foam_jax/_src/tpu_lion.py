r"""Folded Lion's update on TPU: one Pallas (Mosaic) kernel per leaf.

With :mod:`~foam_jax._src.tpu_folded`'s pass over the tiles of a leaf folded
along axis -2 or -1 (:func:`foam_jax.scale_by_folded_lion`'s math):

.. math::

  u &= \operatorname{squash}\left(\beta_1 (U \tilde m + c R)
        + (1 - \beta_1) g\right) \\
  \tilde m &\leftarrow \beta_2 \tilde m + (1 - \beta_2) F g

reading the momentum as stored before this step's update, as Lion does. The
state format is the XLA path's, which stays the reference and every other
platform's program.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from foam_jax._src import tpu_folded

__all__ = ["coefficients", "folded_lion", "squash", "KERNEL_NAME"]

KERNEL_NAME = "foam_folded_lion"


def coefficients(*, b1: Any, b2: Any, residual_scale: Any, smooth_beta: Any) -> jax.Array:
  """float32 ``[b1, b2, 1 - b1, 1 - b2, c, smooth_beta]`` for the kernel.

  ``1 - b`` is taken before the rounding to float32, as the XLA path takes it.
  """
  return jnp.stack([jnp.asarray(x, jnp.float32)
                    for x in (b1, b2, 1.0 - b1, 1.0 - b2, residual_scale, smooth_beta)])


def _moments(coef, mean, square_mean, olds):
  del square_mean
  b2, one_minus_b2 = coef[1], coef[3]
  (mu,) = olds
  return (one_minus_b2 * mean + b2 * mu,)


def _sign(x: jax.Array) -> jax.Array:
  """``jnp.sign`` (NaN stays NaN, zeros keep their sign) from comparisons.

  Mosaic lowers ``sign`` by asking the attached TPU's generation, which a
  compile without a device does not have.
  """
  return jnp.where(x > 0, 1.0, jnp.where(x < 0, -1.0, x * 0.0))


def squash(x: jax.Array, mode: str, smooth_beta: Any, sign=jnp.sign) -> jax.Array:
  """Lion's sign (``mode="hard"``), ``tanh(smooth_beta * x)`` or the refined form.

  The one definition of :func:`foam_jax.scale_by_folded_lion`'s ``mode``,
  for the XLA path and the kernel (which passes a ``sign`` Mosaic lowers).
  """
  if mode == "hard":
    return sign(x)
  if mode == "smooth":
    return jnp.tanh(smooth_beta * x)
  return jnp.where(jnp.abs(x) < 1.0, x, sign(x))


def _update(mode: str):
  def update(coef, part, mean, olds, news):
    del news
    b1, one_minus_b1, c, beta = coef[0], coef[2], coef[4], coef[5]
    (mu,) = olds
    x = one_minus_b1 * part + b1 * (mu + c * (part - mean))
    return squash(x, mode, beta, sign=_sign)
  return update


def folded_lion(g: jax.Array, mu: jax.Array, coefs: jax.Array, *, level: int, mode: str,
                axis: int = -2, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """One leaf's update ``u`` and new momentum, in one pass over its tiles.

  Args:
    g: the gradient, folded along ``axis`` (-2 or -1;
      :func:`~foam_jax._src.tpu_folded.covers` must cover it).
    mu: the stored folded momentum (float); overwritten in place where
      donated.
    coefs: :func:`coefficients`.
    level: the fold level.
    mode: ``"hard"`` (sign), ``"smooth"`` or ``"refined"``, as
      :func:`foam_jax.scale_by_folded_lion`.
    axis: the fold axis.
    interpret: run the kernel in Pallas's interpreter (any backend).

  Returns:
    ``(u, mu)``: ``u`` in ``g``'s dtype, the momentum in its own.

  Examples:
    >>> import jax.numpy as jnp
    >>> coefs = coefficients(b1=0.9, b2=0.99, residual_scale=1.0, smooth_beta=1.0)
    >>> u, mu = folded_lion(jnp.ones((64, 128)), jnp.zeros((16, 128)), coefs, level=2,
    ...                     mode="hard", interpret=True)
    >>> float(u[0, 0]), round(float(mu[0, 0]), 4)
    (1.0, 0.01)
  """
  u, mu = tpu_folded.call(_moments, _update(mode), g, (mu,), coefs, axis=axis, level=level,
                          name=KERNEL_NAME, interpret=interpret)
  return u, mu
