r"""FOAM's folded Adam update on TPU: one Pallas (Mosaic) kernel per leaf.

With :mod:`~foam_jax._src.tpu_folded`'s pass over the tiles of a leaf
folded along axis -2 (or :mod:`~foam_jax._src.tpu_lanes`'s, along axis -1):

.. math::

  \tilde m &\leftarrow \beta_1 \tilde m + (1 - \beta_1) F g, \qquad
  \tilde v \leftarrow \beta_2 \tilde v + (1 - \beta_2) T,
  \qquad T = F(g^2) \text{ or } (F g)^2 \\
  u &= s_u \frac{a_m U \tilde m + b_m U F g + c_m R}
                {\sqrt{a_v U \tilde v + c_v R^2 + v_f} + \epsilon}

with the moments read as stored, and :func:`coefficients` giving
:math:`(a_m, b_m, c_m, a_v, c_v, s_u, v_f)` for each bias-correction form of
:func:`foam_jax.scale_by_foam` (with Nesterov's momentum). The state format
is the XLA path's, which stays the reference and every other platform's
program; :mod:`foam_jax._src.tpu_dispatch` chooses between them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from foam_jax._src import tpu_folded

__all__ = ["coefficients", "folded_adam", "KERNEL_NAME"]

KERNEL_NAME = "foam_folded_adam"
_COEFFICIENTS = ("b1", "b2", "1-b1", "1-b2", "am", "bm", "cm", "av", "cv", "su", "vf", "eps")


def coefficients(form: str, nesterov: bool, count: jax.Array, *, b1: Any, b2: Any,
                 eps: Any, eps_root: Any, alpha: Any, residual_scale: Any) -> jax.Array:
  r"""The kernel's scalars for step ``count`` of one bias-correction form.

  With :math:`M = U \tilde m + c R` and :math:`V = U \tilde v + c^2 R^2` the
  reads, :math:`t` the count, :math:`a = 1 / (1 - \beta_1^t)`:

  * ``"step_size"``: :math:`u = \alpha \sqrt{1 - \beta_2^t}\, a M /
    (\sqrt{V + \epsilon_r (1 - \beta_2^t)} + \epsilon)`;
  * ``"moments"``: :math:`u = \alpha\, a M / (\sqrt{V / (1 - \beta_2^t) +
    \epsilon_r} + \epsilon)`;
  * ``"folded_moments"``: :math:`u = \alpha (a U \tilde m + c R) /
    (\sqrt{U \tilde v / (1 - \beta_2^t) + c^2 R^2 + \epsilon_r} + \epsilon)`.

  With Nesterov's momentum the first moment's part is
  :math:`\beta_1 X / (1 - \beta_1^{t+1}) + (1 - \beta_1) g / (1 - \beta_1^t)`
  for its read :math:`X` (``optax.scale_by_adam``'s), where
  :math:`g = U F g + R`.

  Returns:
    float32 ``[b1, b2, 1 - b1, 1 - b2, am, bm, cm, av, cv, su, vf, eps]``;
    ``1 - b`` is taken before the rounding to float32, as the XLA path's
    moment update takes it.
  """
  f32 = jnp.float32
  decays = [jnp.asarray(1.0 - b, f32) for b in (b1, b2)]
  b1, b2, eps, eps_root, alpha, c = (jnp.asarray(x, f32) for x in (
      b1, b2, eps, eps_root, alpha, residual_scale))
  t = count.astype(f32)
  one = jnp.ones((), f32)
  zero = jnp.zeros((), f32)
  if nesterov:
    # X's weight and g's weight; g = U F g + R.
    x_w, g_w = b1 / (1.0 - b1 ** (t + 1.0)), (1.0 - b1) / (1.0 - b1**t)
  else:
    x_w, g_w = 1.0 / (1.0 - b1**t), zero
  if form == "step_size":
    root = jnp.sqrt(1.0 - b2**t)
    am, bm, cm = x_w, g_w, x_w * c + g_w
    av, cv, su, vf = one, c * c, alpha * root, eps_root * (1.0 - b2**t)
  elif form == "moments":
    am, bm, cm = x_w, g_w, x_w * c + g_w
    av = 1.0 / (1.0 - b2**t)
    cv, su, vf = c * c * av, alpha, eps_root
  elif form == "folded_moments":
    # The folded moments are corrected, then the residual c R is added.
    am, bm, cm = x_w, g_w, c
    av, cv, su, vf = 1.0 / (1.0 - b2**t), c * c, alpha, eps_root
  else:
    raise ValueError(f"form must be step_size, moments or folded_moments, got {form!r}.")
  return jnp.stack([b1, b2, *decays, am, bm, cm, av, cv, su, vf, eps])


def _moments(mean_of_squares: bool):
  def moments(coef, mean, square_mean, olds):
    b1, b2, one_minus_b1, one_minus_b2 = (coef[i] for i in range(4))
    target = square_mean() if mean_of_squares else mean * mean
    mu, nu = olds
    return b1 * mu + one_minus_b1 * mean, b2 * nu + one_minus_b2 * target
  return moments


def _update(coef, part, mean, olds, news):
  del olds
  am, bm, cm, av, cv, su, vf, eps = (coef[i] for i in range(4, len(_COEFFICIENTS)))
  mu, nu = news
  res = part - mean
  return su * (am * mu + bm * mean + cm * res) / (jnp.sqrt(av * nu + vf + cv * res * res) + eps)


def folded_adam(g: jax.Array, mu: jax.Array, nu: jax.Array, coefs: jax.Array, *,
                level: int, mean_of_squares: bool, axis: int = -2, interpret: bool = False
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One leaf's update ``u`` and new moments, in one pass over its tiles.

  Args:
    g: the gradient, folded along ``axis`` (-2 or -1;
      :func:`~foam_jax._src.tpu_folded.covers` must cover it).
    mu, nu: the stored folded moments (float); overwritten in place where
      donated.
    coefs: :func:`coefficients`.
    level: the fold level.
    mean_of_squares: the second moment averages :math:`F(g^2)` (else
      :math:`(F g)^2`).
    axis: the fold axis.
    interpret: run the kernel in Pallas's interpreter (any backend).

  Returns:
    ``(u, mu, nu)``: ``u`` in ``g``'s dtype, the moments in theirs.

  Examples:
    >>> import jax.numpy as jnp
    >>> g = jnp.ones((64, 128))
    >>> coefs = coefficients("step_size", False, jnp.array(1), b1=0.9, b2=0.999,
    ...                      eps=1e-8, eps_root=0.0, alpha=1.0, residual_scale=1.0)
    >>> u, mu, nu = folded_adam(g, jnp.zeros((16, 128)), jnp.zeros((16, 128)), coefs,
    ...                         level=2, mean_of_squares=True, interpret=True)
    >>> round(float(u[0, 0]), 4), round(float(mu[0, 0]), 4)  # Adam's first step: 1
    (1.0, 0.1)
  """
  u, mu, nu = tpu_folded.call(_moments(mean_of_squares), _update, g, (mu, nu), coefs,
                              axis=axis, level=level, name=KERNEL_NAME, interpret=interpret)
  return u, mu, nu
