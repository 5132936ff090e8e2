"""Folded Adam in Optax's form: ``optax.scale_by_adam`` with folded moments.

FOAM's own :func:`foam_jax.scale_by_foam` corrects the bias on the step size
(the authors' form); the AdamW part of :func:`foam_jax.foam_muon` must equal
``optax.contrib.muon``'s ``optax.adamw`` at ``fold_level=0``, so it corrects
each moment as ``optax.scale_by_adam`` does.
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from foam_jax._src import moment
from foam_jax._src import placement
from foam_jax._src import specs as specs_lib
from foam_jax._src import validation as _validation

__all__ = ["ScaleByFoldedAdamState", "scale_by_folded_adam"]



class ScaleByFoldedAdamState(NamedTuple):
  """State of :func:`scale_by_folded_adam` (``optax.ScaleByAdamState``'s tree).

  Attributes:
    count: number of updates applied so far (``int32``).
    mu: first moments, folded like :class:`foam_jax.ScaleByFoamState`'s.
    nu: second moments (real), shaped like ``mu``.
  """

  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_folded_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
    fold_level: int | None = None,
    alpha: float = 1.0,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
) -> optax.GradientTransformation:
  r"""``optax.scale_by_adam`` whose moments are stored folded.

  With :math:`M_t = U \tilde m_t + c R_t` and
  :math:`V_t = U \tilde v_t + c^2 |R_t|^2` the folded moments read back with
  the gradient's residual (:mod:`foam_jax._src.moment`):

  .. math::

    u_t = \alpha \frac{M_t / (1 - \beta_1^t)}
          {\sqrt{V_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon}

  (Nesterov as Optax's). :math:`\alpha` scales folded leaves only. With
  ``fold_level=0`` and ``alpha=1`` it is ``optax.scale_by_adam``.

  Args:
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to the denominator.
    eps_root: added to the bias-corrected second moment inside the root.
    mu_dtype: storage dtype of the first moments (default: the param's);
      ``jnp.int8`` (or ``"int8"``) stores it blockwise-quantized in 8 bits
      (codes plus one float32 scale per 256 entries, see
      :class:`foam_jax.QuantizedMoment`).
    nesterov: Nesterov momentum, as ``optax.scale_by_adam``.
    fold_level: level of the default policy; ``None`` is ``2``.
    alpha: scale of the folded leaves' updates.
    residual_scale: ``c`` above.
    fold_spec: which leaves to fold how; see :func:`foam_jax.scale_by_foam`.

  Returns:
    An ``optax.GradientTransformation`` with state
    :class:`ScaleByFoldedAdamState`.

  Examples:
    >>> import jax.numpy as jnp
    >>> tx = scale_by_folded_adam()
    >>> tx.init({"w": jnp.ones((8, 4))}).nu["w"].shape
    (2, 4)

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014

    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  b1, b2, eps, eps_root, alpha, residual_scale = _validation.adam_hyperparameters(
      b1, b2, eps, eps_root, alpha, residual_scale)
  fold_level = _validation.fold_level_or_default(fold_level)
  mu_dtype = _validation.storage_dtype("mu_dtype", mu_dtype)

  def init_fn(params):
    specs = specs_lib.resolve_fold_specs(params, fold_spec, fold_level)

    def moments(spec, p):
      if isinstance(p, optax.MaskedNode):
        return p, p
      return (moment.zeros(spec, p, mu_dtype or p.dtype),
              moment.zeros(spec, p, moment.real_dtype(p.dtype), second=True))

    mu, nu = moment.map_leaves(moments, specs, params, outputs=2)
    return ScaleByFoldedAdamState(
        count=placement.count_zeros(params), mu=mu, nu=nu)

  def update_fn(updates, state, params=None):
    del params
    specs = specs_lib.resolve_fold_specs(updates, fold_spec, fold_level)
    count = optax.safe_increment(state.count)

    def read(spec, g, mu, nu):
      """New folded moments and their read-backs ``M``, ``V``, whole."""
      if isinstance(g, optax.MaskedNode):
        return g, g, g, mu, nu
      compute = jnp.promote_types(g.dtype, jnp.float32)
      real = moment.real_dtype(compute)
      geom = moment.geometry(spec, g.shape, mu.shape)
      fg = moment.FoldedGradient(g.astype(compute), geom,
                                 residual_scale=residual_scale,
                                 count_dtype=real)
      mu_max, nu_max = moment.gradient_maxima(fg.mean, geom, mu, nu)
      mu_step = moment.ema(mu, fg.mean, b1, compute, optax_order=True,
                           step=count, target_max=mu_max)
      nu_step = moment.ema(nu, fg.mean_of_squares(), b2, real,
                           optax_order=True, step=count, target_max=nu_max)
      m = fg.unblock(fg.read(mu_step.read))
      v = fg.unblock(fg.read_energy(nu_step.read))
      mu_new, nu_new = mu_step.store(m), nu_step.store(m)
      return m, v, 1.0 if geom is None else alpha, mu_new, nu_new

    m, v, scale, mu, nu = moment.map_leaves(
        read, specs, updates, state.mu, state.nu, outputs=5)
    # From here on, Optax's scale_by_adam on the read-back moments, tree by
    # tree as Optax does it (so that level 0 is Optax's to the last bit).
    g = jax.tree.map(lambda x, y: x.astype(y.dtype), updates, m)
    m_hat = moment.first_moment_hat(m, g, b1, count, nesterov)
    v_hat = optax.tree.bias_correction(v, b2, count)
    updates = jax.tree.map(
        lambda m, v, a, g: (a * (m / (jnp.sqrt(v + eps_root) + eps))
                            ).astype(g.dtype),
        m_hat, v_hat, scale, updates)
    return updates, ScaleByFoldedAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)
