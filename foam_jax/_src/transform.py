"""``scale_by_foam``: Adam with folded moments, as an Optax transformation."""

from __future__ import annotations

from typing import Any
from typing import Literal
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from foam_jax._src import folding
from foam_jax._src import moment
from foam_jax._src import placement
from foam_jax._src import quantize
from foam_jax._src import specs as specs_lib
from foam_jax._src import validation as _validation

__all__ = ["ScaleByFoamState", "scale_by_foam"]

SecondMoment = Literal["mean_of_squares", "square_of_mean"]
_SECOND_MOMENTS = ("mean_of_squares", "square_of_mean")



class ScaleByFoamState(NamedTuple):
  """State of :func:`scale_by_foam`.

  Attributes:
    count: number of updates applied so far (``int32``).
    mu: first moments. A folded leaf's moment has the parameter's rank with
      the fold axis shrunk to ``ceil(n / 2**level)``; other leaves have the
      parameter's shape.
    nu: second moments, shaped like ``mu``.
  """

  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_foam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    *,
    fold_level: int | None = None,
    alpha: float = 1.0,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
    second_moment: SecondMoment = "mean_of_squares",
    nu_dtype: Any | None = None,
    nesterov: bool = False,
) -> optax.GradientTransformation:
  r"""Rescales updates with FOAM: Adam whose moments are stored folded.

  For a folded leaf with fold operator :math:`F` (block means of
  :math:`k = 2^l` entries along one axis) and its broadcast back :math:`U`,
  at step :math:`t`:

  .. math::

    \tilde m_t &= \beta_1 \tilde m_{t-1} + (1 - \beta_1) F(g_t) \\
    \tilde v_t &= \beta_2 \tilde v_{t-1} + (1 - \beta_2) F(|g_t|^2) \\
    R_t &= g_t - U F(g_t) \\
    M_t &= U \tilde m_t + c R_t, \qquad V_t = U \tilde v_t + c^2 |R_t|^2 \\
    u_t &= \alpha \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}
           \frac{M_t}{\sqrt{V_t + \epsilon_{root} (1 - \beta_2^t)} + \epsilon}

  Only :math:`\tilde m, \tilde v` are stored, ``k`` times smaller along the
  fold axis than Adam's; the residual :math:`R_t` is recomputed every step.
  Leaves that are not folded get Adam in the same form with no
  :math:`\alpha`. With ``second_moment="square_of_mean"`` the second moment
  is fed :math:`|F(g_t)|^2` (the paper's text) instead of :math:`F(|g_t|^2)`
  (the authors' code, the default).

  Bias correction is applied to the step size, with :math:`\epsilon` added to
  the uncorrected :math:`\sqrt{V}`, as in the authors' code (and Hugging
  Face's ``AdamW``). It equals ``optax.scale_by_adam`` with the same
  ``eps_root`` and :math:`\epsilon_t = \epsilon / \sqrt{1 - \beta_2^t}`; with
  ``fold_level=0`` and ``alpha=1``, FOAM *is* that Adam. With
  ``nesterov=True`` the first moment :math:`M_t` is replaced, as in
  ``optax.scale_by_adam(nesterov=True)``, by
  :math:`\frac{\beta_1 M_t}{1 - \beta_1^{t+1}} + \frac{(1 - \beta_1)
  g_t}{1 - \beta_1^t}` (times :math:`1 - \beta_1^t`, which the step size
  divides out again).

  Complex parameters are supported as by ``optax.scale_by_adam``: the fold
  of a complex gradient is its complex block mean, and squares are
  :math:`|\cdot|^2`. The second moment is real: by default it is stored in
  the real dtype of the parameter's precision (``float32`` for
  ``complex64``).

  Args:
    b1: decay of the first moment, in ``[0, 1)``.
    b2: decay of the second moment, in ``[0, 1)``.
    eps: added to the denominator, ``>= 0``.
    eps_root: added to the second moment inside the square root (bias
      corrected, as ``optax.scale_by_adam``'s), ``>= 0``.
    mu_dtype: dtype to store the first moments in (default: the param's).
      Arithmetic is float32 or wider, and the update reads the new moments
      as stored (rounded), like the authors' in-place code. A floating or
      complex dtype of 16 bits or more, or ``jnp.int8`` (or ``"int8"``):
      blockwise-quantized 8-bit storage, int8 codes plus one float32 scale
      per 256 entries of the last axis (:class:`foam_jax.QuantizedMoment`),
      dequantized, updated and requantized in one pass; the update reads
      the new moment before requantization. Other integer and 8-bit float
      dtypes are refused.
    fold_level: the level ``l`` of the default policy (blocks of ``2**l``
      entries) and of ``FoldSpec(level=None)`` entries; ``None`` is ``2``.
      ``0`` is plain Adam. A Python int: under ``optax.inject_hyperparams``
      an explicitly passed level needs ``static_args=("fold_level",)``.
    alpha: scale of the update of folded leaves only (the paper's "scale";
      its recipe uses ``0.25`` with learning rate ``1e-2``).
    residual_scale: ``c`` above; ``0`` drops the residual.
    fold_spec: ``None`` for the default policy (fold ``ndim >= 2`` leaves
      along axis ``-2`` except paths containing ``embed``/``lm_head``), a
      pytree of :class:`FoldSpec` ``| None`` shaped like the params, or a
      callable ``params -> such a pytree``.
    second_moment: ``"mean_of_squares"`` or ``"square_of_mean"``.
    nu_dtype: dtype to store the second moments in (default: the real dtype
      of the param's precision); a real floating dtype of 16 bits or more,
      or ``jnp.int8`` (blockwise-quantized, as ``mu_dtype``).
    nesterov: use Nesterov momentum, as ``optax.scale_by_adam``.

  Returns:
    An ``optax.GradientTransformation`` with state :class:`ScaleByFoamState`.
    Its updates have the gradients' dtype.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, foam_jax
    >>> params = {"w": jnp.ones((8, 4)), "b": jnp.zeros((4,))}
    >>> tx = optax.chain(foam_jax.scale_by_foam(), optax.scale(-1e-2))
    >>> state = tx.init(params)
    >>> state[0].mu["w"].shape  # folded 4x along axis -2
    (2, 4)
    >>> grads = jax.tree.map(jnp.ones_like, params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  b1, b2, eps, eps_root, alpha, residual_scale = _validation.adam_hyperparameters(
      b1, b2, eps, eps_root, alpha, residual_scale)
  fold_level = _validation.fold_level_or_default(fold_level)
  if second_moment not in _SECOND_MOMENTS:
    raise ValueError(
        f"second_moment must be one of {_SECOND_MOMENTS}, got {second_moment!r}."
    )
  mu_dtype = _validation.storage_dtype("mu_dtype", mu_dtype)
  nu_dtype = _validation.storage_dtype("nu_dtype", nu_dtype, real=True)

  def init_fn(params):
    specs = specs_lib.resolve_fold_specs(params, fold_spec, fold_level)

    def moments(spec, p):
      if isinstance(p, optax.MaskedNode):
        return p, p
      return (moment.zeros(spec, p, mu_dtype or p.dtype),
              moment.zeros(spec, p, nu_dtype or moment.real_dtype(p.dtype),
                           second=True))

    mu, nu = moment.map_leaves(moments, specs, params, outputs=2)
    return ScaleByFoamState(count=placement.count_zeros(params), mu=mu, nu=nu)

  def update_fn(updates, state, params=None):
    del params
    specs = specs_lib.resolve_fold_specs(updates, fold_spec, fold_level)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    # Bias correction on the step size (authors' code / HF AdamW form):
    # u = sqrt(1 - b2^t) * (a M + b g) / (sqrt(V + eps_root (1 - b2^t)) + eps)
    # with a = 1 / (1 - b1^t), b = 0; Nesterov: a = b1 / (1 - b1^(t+1)),
    # b = (1 - b1) / (1 - b1^t) (optax.scale_by_adam's nesterov form).
    root_step = jnp.sqrt(1.0 - b2**t)
    if nesterov:
      a = b1 / (1.0 - b1 ** (t + 1.0))
      b = (1.0 - b1) / (1.0 - b1**t)
    else:
      a, b = 1.0 / (1.0 - b1**t), None
    no_eps_root = isinstance(eps_root, (int, float)) and eps_root == 0

    def direction(m, v, g, scale):
      """The step direction from the (unfolded) moments and the gradient."""
      if not no_eps_root:
        v = v + eps_root * (1.0 - b2**t)
      den = jnp.sqrt(v) + eps
      if b is None:
        return (scale * root_step * a) * m / den
      return (scale * root_step) * (a * m + b * g) / den

    def leaf_update(spec, g, mu, nu):
      if isinstance(g, optax.MaskedNode):
        return g, mu, nu
      out_dtype = g.dtype
      compute = jnp.promote_types(g.dtype, jnp.float32)
      real = moment.real_dtype(compute)  # Of the second moment.
      # The blocked view of g (g itself for a leaf that is not folded): block
      # sums are slices + adds and unfold is a broadcast, so XLA fuses a leaf
      # into three loops, each reading g once, with no temporaries.
      geom = moment.geometry(spec, g.shape, mu.shape)
      gate = gates.next()
      fg = moment.FoldedGradient(g, geom, compute_dtype=compute,
                                 residual_scale=residual_scale,
                                 count_dtype=real, gate=gate,
                                 quantized=quantize.is_quantized(mu, nu))
      if second_moment == "mean_of_squares" or geom is None:
        g_sq_mean = fg.mean_of_squares()
      else:
        g_sq_mean = folding.abs_sq(fg.mean)
      # The update reads float moments as stored (rounded to mu_dtype/
      # nu_dtype), as the authors' in-place PyTorch code does: then XLA can
      # overwrite low-precision states in place instead of keeping float32
      # copies. 8-bit moments are read before requantization (moment.ema).
      mu_max, nu_max = moment.gradient_maxima(fg.mean, geom, mu, nu)
      folded_gate = None if geom is None else gate
      mu_step = moment.ema(mu, fg.mean, b1, compute, step=count,
                           target_max=mu_max, gate=folded_gate)
      nu_step = moment.ema(nu, g_sq_mean, b2, real, step=count,
                           target_max=nu_max, gate=folded_gate)
      u_blocks = direction(fg.read(mu_step.read), fg.read_energy(nu_step.read),
                           fg.blocks, 1.0 if geom is None else alpha)
      mu_new, nu_new = mu_step.store(u_blocks), nu_step.store(u_blocks)
      gates.done(mu_new)
      return fg.unblock(u_blocks).astype(out_dtype), mu_new, nu_new

    # On XLA:CPU some leaves compute their block statistics in a pass of
    # their own, one leaf after another (moment.FoldedGradient).
    gates = moment.GateChain(count)
    updates, mu, nu = moment.map_leaves(
        leaf_update, specs, updates, state.mu, state.nu, outputs=3)
    return updates, ScaleByFoamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)
