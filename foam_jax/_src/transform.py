"""``scale_by_foam``: Adam with folded moments, as an Optax transformation."""

from __future__ import annotations

import functools
from typing import Any
from typing import Literal
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from foam_jax._src import folded_moments
from foam_jax._src import moment
from foam_jax._src import named_scales
from foam_jax._src import param_shapes as param_shapes_lib
from foam_jax._src import placement
from foam_jax._src import specs as specs_lib
from foam_jax._src import tpu_adam
from foam_jax._src import tpu_dispatch
from foam_jax._src import validation as _validation

__all__ = ["ScaleByFoamState", "scale_by_foam"]

SecondMoment = Literal["mean_of_squares", "square_of_mean"]
_SECOND_MOMENTS = ("mean_of_squares", "square_of_mean")
BiasCorrection = Literal["step_size", "moments", "folded_moments"]
_BIAS_CORRECTIONS = ("step_size", "moments", "folded_moments")


class ScaleByFoamState(NamedTuple):
  """State of :func:`scale_by_foam`.

  Attributes:
    count: number of updates applied so far (``int32``).
    mu: first moments, a tree like the params. A folded leaf's moment has
      the parameter's rank with the fold axis shrunk to
      ``ceil(n / 2**level)``; other leaves have the parameter's shape.
      Stored in 8 bits (``mu_dtype=jnp.int8``), a
      :class:`foam_jax.QuantizedMoments` of two such trees (codes, scales).
    nu: second moments, as ``mu``.
    param_shapes: each parameter's shape at ``init``, as tree metadata (no
      array leaf; see :class:`~foam_jax._src.param_shapes.ParamShapes`):
      ``update`` refuses gradients of other shapes.
  """

  count: jax.Array  # type: ignore[assignment]  # (tuple.count; Optax's name)
  mu: optax.Updates
  nu: optax.Updates
  param_shapes: param_shapes_lib.ParamShapes = param_shapes_lib.ParamShapes()


def scale_by_foam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    *,
    fold_level: specs_lib.Level | None = None,
    alpha: float = 1.0,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
    second_moment: SecondMoment = "mean_of_squares",
    nu_dtype: Any | None = None,
    nesterov: bool = False,
    bias_correction: BiasCorrection = "step_size",
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

  Bias correction (``bias_correction``):

  * ``"step_size"`` (default): applied to the step size, with
    :math:`\epsilon` added to the uncorrected :math:`\sqrt{V}`, as in the
    authors' code (and Hugging Face's ``AdamW``), the formula above. It
    equals ``optax.scale_by_adam`` with the same ``eps_root`` and
    :math:`\epsilon_t = \epsilon / \sqrt{1 - \beta_2^t}`.
  * ``"moments"``: each moment is corrected, as ``optax.scale_by_adam``
    does, operation for operation:

    .. math::

      u_t = \alpha \frac{M_t / (1 - \beta_1^t)}
            {\sqrt{V_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon}

    so that with ``fold_level=0`` and ``alpha=1`` it equals
    ``optax.scale_by_adam`` bit for bit (folded Muon's AdamW part uses it).
  * ``"folded_moments"``: the folded moments are corrected before the
    residual is added, so that the residual's share is not divided by the
    correction (in the two forms above, while the folded moments warm up,
    an update that is mostly residual is about :math:`\sqrt{1 -
    \beta_2^t}` of Adam's: a LoRA adapter that starts at zero):

    .. math::

      u_t = \alpha \frac{U \tilde m_t / (1 - \beta_1^t) + c R_t}
            {\sqrt{U \tilde v_t / (1 - \beta_2^t) + c^2 |R_t|^2
                    + \epsilon_{root}} + \epsilon}

    With Nesterov, :math:`U \tilde m_t / (1 - \beta_1^t)` becomes
    :math:`\frac{\beta_1 U \tilde m_t}{1 - \beta_1^{t+1}} + \frac{(1 -
    \beta_1) U F(g_t)}{1 - \beta_1^t}`. Leaves that are not folded get
    ``optax.scale_by_adam``'s update (to float32 rounding).

  With ``fold_level=0`` and ``alpha=1``, FOAM *is* Adam in either form.
  With ``nesterov=True`` the first moment :math:`M_t / (1 - \beta_1^t)` is
  replaced, as in ``optax.scale_by_adam(nesterov=True)``, by
  :math:`\frac{\beta_1 M_t}{1 - \beta_1^{t+1}} + \frac{(1 - \beta_1)
  g_t}{1 - \beta_1^t}`.

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
    mu_dtype: dtype to store the first moments in (default: the param's;
      bfloat16 for float16 params).
      Arithmetic is float32 or wider, and the update reads the new moments
      as stored (rounded), like the authors' in-place code. A floating or
      complex dtype of 16 bits or more, or ``jnp.int8`` (or ``"int8"``):
      blockwise-quantized 8-bit storage, int8 codes plus one float32 scale
      per 256 entries of the last axis (:class:`foam_jax.QuantizedMoments`),
      dequantized, updated and requantized; the update reads the new moment
      before requantization. Other integer and 8-bit float dtypes are
      refused.
    fold_level: the level ``l`` of the default policy (blocks of ``2**l``
      entries) and of ``FoldSpec(level=None)`` entries; ``None`` is ``2``,
      ``0`` is plain Adam, ``"whole_axis"`` folds each fold axis into one
      block (FOAM-Mini). Under ``optax.inject_hyperparams`` an explicitly
      passed level needs ``static_args=("fold_level",)``.
    alpha: scale of the update of folded leaves only (the paper's "scale";
      its recipe uses ``0.25`` with learning rate ``1e-2``). A leaf whose
      fold axis has length 0 or 1 folds nothing and is Adam's (no ``alpha``).
    residual_scale: ``c`` above; ``0`` drops the residual.
    fold_spec: ``None`` for the default policy (each weight matrix folds
      along its input-feature axis, read from axis names, module types or
      shapes; embeddings, heads and vectors keep Adam's moments; see
      :class:`foam_jax.FoldPolicy`), a :class:`foam_jax.FoldPolicy` with
      other options, a pytree of :class:`FoldSpec` ``| None`` shaped like
      the params, or a callable ``params -> such a pytree``.
    second_moment: ``"mean_of_squares"`` or ``"square_of_mean"``.
    nu_dtype: dtype to store the second moments in (default: the real dtype
      of the param's precision; bfloat16 for float16 params); a real
      floating dtype of 16 bits or more with float32's range (bfloat16,
      float32, float64: float16 is refused, it overflows at 65504), or
      ``jnp.int8`` (blockwise-quantized, as ``mu_dtype``).
    nesterov: use Nesterov momentum, as ``optax.scale_by_adam``.
    bias_correction: ``"step_size"`` (the authors' form), ``"moments"``
      (``optax.scale_by_adam``'s) or ``"folded_moments"`` (the folded
      moments corrected, the residual not), see above.

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
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014

    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  b1, b2, eps, eps_root, alpha, residual_scale = _validation.adam_hyperparameters(
      b1, b2, eps, eps_root, alpha, residual_scale)
  fold_level = _validation.fold_level_or_default(fold_level)
  _validation.check_bool("nesterov", nesterov)
  _validation.check_choice("second_moment", second_moment, _SECOND_MOMENTS)
  _validation.check_choice("bias_correction", bias_correction, _BIAS_CORRECTIONS)
  mu_dtype = _validation.storage_dtype("mu_dtype", mu_dtype)
  nu_dtype = _validation.storage_dtype("nu_dtype", nu_dtype, real=True)
  # Optax's forms also take Optax's operand order in the EMAs (folded_moments.ema).
  optax_form = bias_correction != "step_size"

  def init_fn(params):
    params = _validation.as_arrays(params)
    _validation.check_inexact_leaves(params)
    specs = specs_lib.resolve_fold_specs(params, fold_spec, fold_level)

    def moments(spec, p):
      if moment.is_absent(p):
        return p, p
      return (moment.zeros(spec, p, mu_dtype),
              moment.zeros(spec, p, nu_dtype, second=True))

    mu, nu = moment.map_leaves(moments, specs, params, outputs=2)
    return ScaleByFoamState(count=placement.count_zeros(params),
                            mu=named_scales.stored(params, mu),
                            nu=named_scales.stored(params, nu),
                            param_shapes=param_shapes_lib.record(params))

  def update_fn(updates, state, params=None):
    del params
    updates = _validation.as_arrays(updates)
    param_shapes_lib.check(state.param_shapes, updates)
    specs = specs_lib.resolve_fold_specs(updates, fold_spec, fold_level)
    count = optax.safe_increment(state.count)

    def step_size_scalars():
      """``(sqrt(1 - b2^t), a, b, eps_root (1 - b2^t))`` of the authors' form.

      ``u = sqrt(1 - b2^t) (a M + b g) / (sqrt(V + eps_root (1 - b2^t)) + eps)``
      with ``a = 1 / (1 - b1^t)``, ``b = 0``; Nesterov: ``a = b1 / (1 -
      b1^(t+1))``, ``b = (1 - b1) / (1 - b1^t)`` (``optax.scale_by_adam``'s).
      """
      t = count.astype(jnp.float32)
      if nesterov:
        a, b = b1 / (1.0 - b1 ** (t + 1.0)), (1.0 - b1) / (1.0 - b1**t)
      else:
        a, b = 1.0 / (1.0 - b1**t), None
      no_eps_root = isinstance(eps_root, (int, float)) and eps_root == 0
      return (jnp.sqrt(1.0 - b2**t), a, b,
              None if no_eps_root else eps_root * (1.0 - b2**t))

    def step_size_direction(m, v, g, scale, scalars):
      """``u`` with the bias correction on the step size (authors' form)."""
      root_step, a, b, v_floor = scalars
      if v_floor is not None:
        v = v + v_floor
      den = jnp.sqrt(v) + eps
      if b is None:
        return (scale * root_step * a) * m / den
      return (scale * root_step) * (a * m + b * g) / den

    def folded_leaf(lm, g):
      """``u`` with the folded moments corrected before the residual is added."""
      fg = lm.gradient
      mu_read, nu_read = lm.unfolded
      t = count.astype(jnp.float32)
      mean = fg.blocks if fg.geom is None else fg.unfolded_mean
      if nesterov:
        m = (b1 / (1.0 - b1 ** (t + 1.0))) * mu_read + ((1.0 - b1) / (1.0 - b1**t)) * mean
      else:
        m = mu_read / (1.0 - b1**t)
      m = fg.read(m, unfolded=True)
      v = fg.read_energy(nu_read / (1.0 - b2**t), unfolded=True)
      scale = 1.0 if fg.geom is None else alpha
      u = scale * (m / (jnp.sqrt(v + eps_root) + eps))
      return fg.unblock(u).astype(g.dtype)

    mu_target = "mean"
    nu_target = ("mean_of_squares" if second_moment == "mean_of_squares"
                 else "square_of_mean")

    def xla_update(updates, mu_stored, nu_stored, specs=specs):
      """The update and the new moments, as XLA computes them on every platform."""
      leaves, (mu, nu) = folded_moments.update_moments(
          updates, specs,
          [folded_moments.MomentUpdate(mu_stored, b1, mu_target, "mu"),
           folded_moments.MomentUpdate(nu_stored, b2, nu_target, "nu")],
          count=count, residual_scale=residual_scale, optax_order=optax_form)

      def reads(lm):
        """``M``, ``V`` (blocked view) and the leaf's scale."""
        fg = lm.gradient
        mu_read, nu_read = lm.unfolded
        return (fg.read(mu_read, unfolded=True), fg.read_energy(nu_read, unfolded=True),
                1.0 if fg.geom is None else alpha)

      if bias_correction == "folded_moments":
        return folded_moments.leaf_map(folded_leaf, specs, leaves, updates), mu, nu

      if not optax_form:
        scalars = step_size_scalars()  # Once per step, shared by every leaf.

        def step_size_leaf(lm, g):
          m, v, scale = reads(lm)
          fg = lm.gradient
          u = fg.unblock(step_size_direction(m, v, fg.blocks, scale, scalars))
          return u.astype(g.dtype)

        return folded_moments.leaf_map(step_size_leaf, specs, leaves, updates), mu, nu

      def moments_leaf(lm):
        m, v, scale = reads(lm)
        return lm.gradient.unblock(m), lm.gradient.unblock(v), scale

      m, v, scale = moment.map_leaves(
          lambda _, lm: ((lm,) * 3 if not isinstance(lm, folded_moments.LeafMoments)
                         else moments_leaf(lm)), specs, leaves, outputs=3)
      # From here on optax.scale_by_adam on the reads, tree by tree as Optax
      # does it (its tree functions are jitted over the whole tree, so the
      # same calls give the same bits).
      g = jax.tree.map(lambda x, y: x.astype(y.dtype), updates, m)
      m_hat = moment.first_moment_hat(m, g, b1, count, nesterov)
      v_hat = optax.tree.bias_correction(v, b2, count)
      updates = jax.tree.map(
          lambda m, v, a, g: (a * (m / (jnp.sqrt(v + eps_root) + eps))
                              ).astype(g.dtype),
          m_hat, v_hat, scale, updates)
      return updates, mu, nu

    # On TPU the leaves tpu_folded.covers covers take the kernel; the rest, and
    # every other platform, XLA's.
    updates, mu, nu = tpu_dispatch.folded_update(
        xla_update,
        functools.partial(tpu_adam.folded_adam,
                          mean_of_squares=second_moment == "mean_of_squares"),
        lambda: tpu_adam.coefficients(
            bias_correction, nesterov, count, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
            alpha=alpha, residual_scale=residual_scale),
        updates, state.mu, state.nu)
    return updates, ScaleByFoamState(count=count, mu=mu, nu=nu, param_shapes=state.param_shapes)

  return optax.GradientTransformation(init_fn, update_fn)
