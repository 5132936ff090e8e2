"""Folded Lion: ``optax.lion`` whose momentum is stored folded."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from typing import Literal
from typing import NamedTuple

import jax
import optax

from foam_jax._src import folded_moments
from foam_jax._src import moment
from foam_jax._src import named_scales
from foam_jax._src import param_shapes as param_shapes_lib
from foam_jax._src import placement
from foam_jax._src import specs as specs_lib
from foam_jax._src import tpu_dispatch
from foam_jax._src import tpu_lion
from foam_jax._src import validation as _validation

__all__ = ["ScaleByFoldedLionState", "scale_by_folded_lion", "foam_lion"]

_MODES = ("hard", "smooth", "refined")


class ScaleByFoldedLionState(NamedTuple):
  """State of :func:`scale_by_folded_lion` (``optax.ScaleByLionState``'s tree).

  Attributes:
    count: number of updates applied so far (``int32``).
    mu: the momentum; a folded leaf's has the parameter's rank with the fold
      axis shrunk to ``ceil(n / 2**level)``.
    param_shapes: each parameter's shape at ``init``, as tree metadata (no
      array leaf): ``update`` refuses gradients of other shapes.
  """

  count: jax.Array  # type: ignore[assignment]  # (tuple.count; Optax's name)
  mu: optax.Updates
  param_shapes: param_shapes_lib.ParamShapes = param_shapes_lib.ParamShapes()


def scale_by_folded_lion(
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any | None = None,
    *,
    mode: Literal["hard", "smooth", "refined"] = "hard",
    smooth_beta: float = 1.0,
    fold_level: specs_lib.Level | None = None,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
) -> optax.GradientTransformation:
  r"""Rescales updates with Lion, its momentum stored folded.

  ``optax.scale_by_lion`` with the momentum kept as block means (see
  :func:`foam_jax.scale_by_foam`) and read back with the current gradient's
  residual :math:`R_t = g_t - U F(g_t)`:

  .. math::

    M_t &= U \tilde m_{t-1} + c R_t \\
    u_t &= \operatorname{sign}\left(\beta_1 M_t + (1 - \beta_1) g_t\right) \\
    \tilde m_t &= \beta_2 \tilde m_{t-1} + (1 - \beta_2) F(g_t)

  With ``fold_level=0`` it is ``optax.scale_by_lion``. The update is
  elementwise plus block-local, so on sharded params it needs no
  communication (with blocks inside shards, as the default policy ensures).
  ``mode="smooth"`` / ``"refined"`` replace the sign as in Optax.

  Args:
    b1: rate combining the momentum and the current gradient.
    b2: decay of the momentum.
    mu_dtype: storage dtype of the momentum (default: the param's; bfloat16 for float16 params); the
      update reads it as stored. ``jnp.int8`` (or ``"int8"``) stores it
      blockwise-quantized in 8 bits (codes plus one float32 scale per 256
      entries, see :class:`foam_jax.QuantizedMoments`).
    mode: ``"hard"`` (sign), ``"smooth"`` (``tanh(smooth_beta * x)``) or
      ``"refined"`` (linear inside ``[-1, 1]``, sign outside).
    smooth_beta: the slope of ``"smooth"``.
    fold_level: level of the default policy and of ``FoldSpec(level=None)``;
      ``None`` is ``2``; ``0`` is ``optax.scale_by_lion``.
    residual_scale: ``c`` above; ``0`` drops the residual.
    fold_spec: which leaves to fold how, as in :func:`foam_jax.scale_by_foam`
      (default: FOAM's policy).

  Returns:
    An ``optax.GradientTransformation`` with state
    :class:`ScaleByFoldedLionState`.

  Examples:
    >>> import jax.numpy as jnp, optax, foam_jax
    >>> params = {"w": jnp.ones((8, 4)), "b": jnp.zeros((4,))}
    >>> tx = foam_jax.scale_by_folded_lion()
    >>> state = tx.init(params)
    >>> state.mu["w"].shape, state.mu["b"].shape
    ((2, 4), (4,))
    >>> updates, state = tx.update(params, state)
    >>> updates["w"][0]
    Array([1., 1., 1., 1.], dtype=float32)

  References:
    Chen et al., `Symbolic Discovery of Optimization Algorithms
    <https://arxiv.org/abs/2302.06675>`_, 2023

    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  _validation.check_number("b1", b1, low=0.0, high=1.0)
  _validation.check_number("b2", b2, low=0.0, high=1.0)
  _validation.check_choice("mode", mode, _MODES)
  _validation.check_number("smooth_beta", smooth_beta)
  fold_level = _validation.fold_level_or_default(fold_level)
  _validation.check_number("residual_scale", residual_scale, low=0.0)
  b1, b2, residual_scale = map(_validation.real_part, (b1, b2, residual_scale))
  mu_dtype = _validation.storage_dtype("mu_dtype", mu_dtype)

  squash = functools.partial(tpu_lion.squash, mode=mode, smooth_beta=smooth_beta)

  def init_fn(params):
    params = _validation.as_arrays(params)
    _validation.check_inexact_leaves(params)
    specs = specs_lib.resolve_fold_specs(params, fold_spec, fold_level)
    (mu,) = moment.map_leaves(
        lambda spec, p: (moment.zeros(spec, p, mu_dtype),), specs, params,
        outputs=1)
    return ScaleByFoldedLionState(count=placement.count_zeros(params),
                                  mu=named_scales.stored(params, mu),
                                  param_shapes=param_shapes_lib.record(params))

  def update_fn(updates, state, params=None):
    del params
    updates = _validation.as_arrays(updates)
    param_shapes_lib.check(state.param_shapes, updates)
    specs = specs_lib.resolve_fold_specs(updates, fold_spec, fold_level)

    count = optax.safe_increment(state.count)

    def xla_update(updates, mu_stored, specs=specs):
      """The update and the new momentum, as XLA computes them on every platform."""
      leaves, (mu,) = folded_moments.update_moments(
          updates, specs, [folded_moments.MomentUpdate(mu_stored, b2, "mean", "mu")],
          count=count, residual_scale=residual_scale, optax_order=True)

      def leaf_update(lm, g):
        fg, (previous,) = lm.gradient, lm.previous
        compute = fg.blocks.dtype
        # The read uses the momentum before this step's update, as Lion does.
        u = squash((1.0 - b1) * fg.blocks + b1 * fg.read(previous.astype(compute)))
        return fg.unblock(u).astype(g.dtype)

      return folded_moments.leaf_map(leaf_update, specs, leaves, updates), mu

    # On TPU the leaves tpu_folded.covers covers take the kernel; the rest, and
    # every other platform, XLA's.
    updates, mu = tpu_dispatch.folded_update(
        xla_update, functools.partial(tpu_lion.folded_lion, mode=mode),
        lambda: tpu_lion.coefficients(b1=b1, b2=b2, residual_scale=residual_scale,
                                      smooth_beta=smooth_beta),
        updates, state.mu)
    return updates, ScaleByFoldedLionState(count=count, mu=mu,
                                           param_shapes=state.param_shapes)

  return optax.GradientTransformation(init_fn, update_fn)


def foam_lion(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any | None = None,
    weight_decay: optax.ScalarOrSchedule = 1e-3,
    mask: Any | Callable[[optax.Params], Any] | None = None,
    *,
    fold_level: specs_lib.Level | None = None,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Lion with a folded momentum: a drop-in replacement for ``optax.lion``.

  ``optax.chain(scale_by_folded_lion(...), add_decayed_weights(weight_decay,
  mask), scale_by_learning_rate(learning_rate))``: each parameter moves by
  :math:`-\eta_t (\operatorname{sign}(\beta_1 M_t + (1 - \beta_1) g_t) +
  \lambda W)` with :math:`M_t` the folded momentum read back with the
  gradient's residual (:func:`scale_by_folded_lion`). The positional
  parameters are ``optax.lion``'s, in its order and with its defaults;
  FOAM's options follow, keyword-only. Weight matrices (FOAM's default
  policy, :class:`foam_jax.FoldPolicy`) keep ``1/2**fold_level`` of Lion's
  momentum.

  Sharding: the update is elementwise plus block-local, so under any FSDP/TP
  layout whose blocks lie inside shards (the default policy fits them) it
  needs no collectives.

  Args:
    learning_rate: a float or an Optax schedule.
    b1: rate combining the momentum and the current gradient.
    b2: decay of the momentum.
    mu_dtype: storage dtype of the momentum (default: the param's; bfloat16 for float16 params);
      ``jnp.int8`` (or ``"int8"``) stores it blockwise-quantized in 8 bits
      (codes plus one float32 scale per 256 entries, see
      :class:`foam_jax.QuantizedMoments`).
    weight_decay: decoupled weight decay (``optax.lion``'s default ``1e-3``).
    mask: which leaves get weight decay, as in ``optax.lion``.
    fold_level: blocks hold ``2**fold_level`` entries; ``None`` is ``2``,
      ``0`` is ``optax.lion``. Under ``optax.inject_hyperparams`` an
      explicit level needs ``static_args=("fold_level",)``.
    residual_scale: weight of the gradient residual (``0`` drops it).
    fold_spec: which leaves to fold how; see :func:`foam_jax.scale_by_foam`.

  Returns:
    An ``optax.GradientTransformationExtraArgs``.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, foam_jax
    >>> params = {"w": jnp.ones((16, 4)), "b": jnp.zeros((4,))}
    >>> tx = foam_jax.foam_lion(1e-4)
    >>> state = tx.init(params)
    >>> state[0].mu["w"].shape  # a quarter of Lion's momentum
    (4, 4)
    >>> grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Chen et al., `Symbolic Discovery of Optimization Algorithms
    <https://arxiv.org/abs/2302.06675>`_, 2023

    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  _validation.check_number(
      "learning_rate", learning_rate, low=0.0, allow_callable=True)
  _validation.check_number(
      "weight_decay", weight_decay, low=0.0, allow_callable=True)
  return optax.chain(
      scale_by_folded_lion(
          b1, b2, mu_dtype, fold_level=fold_level,
          residual_scale=residual_scale, fold_spec=fold_spec),
      optax.add_decayed_weights(weight_decay, _validation.checked_mask(mask)),
      optax.scale_by_learning_rate(learning_rate),
  )
