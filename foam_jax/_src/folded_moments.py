r"""The folded-moment update, written once: FOAM's Adam, folded Muon and Lion.

Each folded optimizer keeps exponential moving averages of the gradient in
the folded space (:mod:`foam_jax._src.moment`). :func:`update_moments` is
that step for a whole tree, as ``optax.tree.update_moment`` is for Optax:
for every parameter it reads the stored moments (unpacking 8-bit ones),
recovers the fold from the state (:func:`~foam_jax._src.moment.geometry`),
sees the gradient through it (:class:`~foam_jax._src.moment.FoldedGradient`),
updates each moment

.. math:: \tilde m_t = \beta \tilde m_{t-1} + (1 - \beta) T(g_t),
   \qquad T \in \{F(g),\ F(|g|^2),\ |F(g)|^2\},

and packs the new moments into the state's layout. The optimizer then forms
its update from what :class:`LeafMoments` hands it (the folded gradient, the
moments before and after the step), with one choice everywhere: the compute
dtype (float32 or wider), the step count that seeds 8-bit stochastic
rounding (this step's, ``count + 1``), and the 8-bit block maxima of an
unfolded leaf's targets, read from the gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from typing import Literal
from typing import NamedTuple

import jax
import jax.numpy as jnp

from foam_jax._src import folding
from foam_jax._src import moment
from foam_jax._src import quantize
from foam_jax._src import quantized_state
from foam_jax._src import specs as specs_lib

__all__ = ["Target", "MomentUpdate", "LeafMoments", "ema", "gradient_maxima",
           "update_moments", "without_overflow"]

Target = Literal["mean", "mean_of_squares", "square_of_mean"]


class MomentUpdate(NamedTuple):
  """One moment of the state and what it averages.

  Attributes:
    stored: the state's field (a tree like the params, or a
      :class:`foam_jax.QuantizedMoments`).
    decay: the EMA's decay :math:`\\beta`.
    target: ``"mean"`` (:math:`F(g)`, a first moment), ``"mean_of_squares"``
      (:math:`F(|g|^2)`) or ``"square_of_mean"`` (:math:`|F(g)|^2`); a leaf
      that is not folded averages :math:`g` or :math:`|g|^2`.
    field: the field's name, for messages (``"mu"``, ``"nu"``).
  """

  stored: Any
  decay: Any
  target: Target
  field: str


class LeafMoments(NamedTuple):
  """One parameter's moments around a step, for its optimizer's update.

  Attributes:
    gradient: the gradient seen through the leaf's fold (compute dtype).
    previous: the moments before the step, as stored (floats in their
      storage dtype, 8-bit ones as
      :class:`~foam_jax._src.quantize.QuantizedMoment` views).
    stored: the new moments in their storage form.
    unfolded: the new moments as the update reads them, broadcast into the
      blocked view (:math:`U \\tilde m`, see :func:`_unfolded_read`), in the
      compute dtype (a first moment's) or its real dtype (a second
      moment's): float moments as stored, 8-bit ones before requantization.
  """

  gradient: moment.FoldedGradient
  previous: tuple[Any, ...]
  stored: tuple[Any, ...]
  unfolded: tuple[jax.Array, ...]


def ema(old: jax.Array | quantize.QuantizedMoment, target: jax.Array,
        decay: Any, compute_dtype=None, *, optax_order: bool = False,
        step: Any = None, target_max: quantize.BlockStats | None = None,
        separate: bool = False) -> tuple[jax.Array, Any]:
  r"""``decay * old + (1 - decay) * target``: the moment to read and to store.

  A float moment is rounded to its storage dtype, and the update reads it
  back as stored (so that XLA can overwrite a low-precision state in place,
  as the authors' in-place PyTorch code does). An 8-bit moment
  (:class:`~foam_jax._src.quantize.QuantizedMoment`) is dequantized, updated
  in float32 and requantized, and the update reads the float32 value (as
  bitsandbytes' 8-bit optimizers do). The new block scales are

  .. math:: s' = \beta s + (1 - \beta) \max_{\text{block}} |t|
            \ \ge\ \max_{\text{block}} |\beta m + (1 - \beta) t|,

  a bound that needs the target's block maxima only, not a second pass over
  the new moment. Maxima and bounds are over finite entries: a non-finite
  entry (an infinite square, a NaN gradient) stays in its own entry, and its
  block is marked as holding one for as long as it does (in a float moment,
  too, an infinite or NaN entry stays so), see
  :mod:`~foam_jax._src.quantize`.

  Args:
    old: the stored (folded) moment.
    target: what it averages: ``F(g)``, ``F(|g|^2)``, in the folded shape.
    decay: the EMA's decay rate.
    compute_dtype: dtype the stored moment is read in (default: its own).
    optax_order: write it ``(1 - decay) * target + decay * old``, as
      ``optax.tree.update_moment`` does. The sum is the same, but under
      ``jit`` XLA may contract one product into a fused multiply-add, so
      the operand order decides the last bit: the transforms that mirror an
      Optax optimizer use Optax's order to equal it bit for bit at level 0.
    step: the step count; seeds the stochastic rounding of an 8-bit moment.
      Unused for floats.
    target_max: an 8-bit moment's ``max |target|`` over finite entries and
      its non-finite blocks, per quantization block
      (:func:`~foam_jax._src.quantize.block_stats`), when the caller has
      them more cheaply; default: computed from ``target``.
    separate: on GPUs (chosen at lowering, ``jax.lax.platform_dependent``),
      a float moment is written in its own kernel and the update reads it
      as stored (``jax.lax.optimization_barrier`` on the stored moment). For
      a folded moment this is XLA GPU's cheaper program: the full-size
      update reads the stored moment (a quarter of the weight's size at
      level 2, in its storage dtype) instead of a float32 copy of it or the
      EMA of the old moment recomputed, which needs the old moment copied
      before it is overwritten in place. Leaves that are not folded keep the
      moment update in the update's kernel (``False``). The values are the
      same either way.

  Returns:
    ``(read, stored)``: the value the update reads (in ``compute_dtype``),
    and the new moment in its storage dtype (or requantized).

  Examples:
    >>> import jax.numpy as jnp
    >>> read, stored = ema(jnp.zeros(2), jnp.array([1.0, 2.0]), 0.5)
    >>> stored
    Array([0.5, 1. ], dtype=float32)
  """
  def average(m):
    if optax_order:
      return (1.0 - decay) * target + decay * m
    return decay * m + (1.0 - decay) * target

  if not isinstance(old, quantize.QuantizedMoment):
    new = average(old if compute_dtype is None else old.astype(compute_dtype))
    stored = new.astype(old.dtype)
    if separate:
      stored = jax.lax.platform_dependent(
          stored, cuda=jax.lax.optimization_barrier,
          rocm=jax.lax.optimization_barrier, default=lambda x: x)
    return stored.astype(compute_dtype or stored.dtype), stored
  new = average(old.astype(compute_dtype or jnp.float32))
  if target_max is None:
    target_max = quantize.block_stats(target, old.block)
  scale = decay * old.bounds + (1.0 - decay) * target_max.top
  return new, quantize.quantize(new, old, step, scale=scale,
                                nonfinite=old.nonfinite | target_max.nonfinite)


def gradient_maxima(g: jax.Array, geom: moment.Geometry | None,
                    moments: Sequence[MomentUpdate], previous: Sequence[Any],
                    mean: jax.Array | None = None) -> list[Any]:
  """:func:`ema`'s ``target_max`` for each moment, where the gradient gives it.

  For a leaf that is not folded, reductions of ``|g|`` give the block
  statistics of ``g`` and of ``|g|^2`` (``(max |g|)^2`` over the entries
  whose square is finite) for every 8-bit moment of one block size. A
  folded leaf's targets are block statistics, and ``None`` lets :func:`ema`
  reduce them; float moments need none. ``mean``: the first moment's
  target where it is not ``g`` (:func:`without_overflow`).
  """
  quantized = [p for p in previous if isinstance(p, quantize.QuantizedMoment)]
  if geom is not None or not quantized or len({p.block for p in quantized}) > 1:
    return [None] * len(moments)
  block = quantized[0].block

  def stats(target: Target) -> quantize.BlockStats:
    if target == "mean":
      return quantize.block_stats(g if mean is None else mean, block)
    top = quantize.block_stats(g, block, limit=quantize.SQUARE_LIMIT)
    return top._replace(top=top.top * top.top)

  return [stats(m.target) for m in moments]


def without_overflow(g: jax.Array) -> jax.Array:
  r"""``g`` with zero where its square overflows: an 8-bit first moment's gradient.

  A finite entry beyond :data:`~foam_jax._src.quantize.SQUARE_LIMIT` (about
  1.8e19) has :math:`|g|^2 = \infty`, so Adam's second moment there (or its
  fold block's, with ``second_moment="mean_of_squares"``) is infinite from
  then on (:math:`\beta_2 \cdot \infty = \infty`) and its step is
  :math:`m / \sqrt{v} = 0` whatever :math:`m` holds. An 8-bit first moment
  averages the gradient with such entries counted as zero, so that one cannot
  raise its block's scale: a first moment's code spans 16 binades below the
  scale, and the block's other entries would lose their momentum to it.
  Non-finite entries stay (they are stored per entry, and the step there is
  NaN, as Adam's). With ``second_moment="square_of_mean"`` a fold block whose
  mean stays below the limit is not frozen, and its first moment averages
  the mean of its other entries. Float first moments, and optimizers without
  a second moment (Lion, Muon), average every entry.

  Examples:
    >>> import jax.numpy as jnp
    >>> without_overflow(jnp.array([1.0, 3e38, jnp.inf])).tolist()
    [1.0, 0.0, inf]
  """
  overflows = jnp.isposinf(folding.abs_sq(g)) & jnp.isfinite(g)
  return jnp.where(overflows, jnp.zeros((), g.dtype), g)


def _unfolded_read(fg: moment.FoldedGradient, m: MomentUpdate, previous: Any,
                   read: jax.Array, dtype, optax_order: bool) -> jax.Array:
  r""":math:`U \tilde m_t`, the new moment at full size, for the update to read.

  By default the new folded moment broadcast. On GPUs (chosen at lowering,
  ``jax.lax.platform_dependent``), an 8-bit second moment's read, which is the
  float32 EMA before requantization and so linear in its parts, is formed at
  full size from its parts instead,

  .. math:: U \tilde m_t = \beta\, U \tilde m_{t-1} + (1 - \beta)\, U T(g_t),

  with :math:`U T(g_t)` from each block's own entries
  (:meth:`~foam_jax._src.moment.FoldedGradient.shifted_means`): the update's
  kernel reads the stored codes and the gradient it reads anyway, where the
  folded float32 EMA would be written by one kernel and read back by the
  next. The values are the same up to the order of the additions. (An 8-bit
  first moment keeps the broadcast: XLA then hands its dequantized old value
  between kernels in float32, which costs more.)
  """
  def broadcast(blocks):
    return jnp.broadcast_to(fg.expand(read), blocks.shape)

  if fg.geom is None:
    return read
  if (m.target == "mean" or not isinstance(previous, quantize.QuantizedMoment)
      or not fg.has_shifted_form):
    return broadcast(fg.blocks)

  def from_parts(blocks):
    del blocks
    if m.target == "mean_of_squares":
      target = fg.shifted_means(square=True)
    else:
      target = folding.abs_sq(fg.shifted_means())
    old = fg.expand(previous.astype(dtype))
    if optax_order:
      return (1.0 - m.decay) * target + m.decay * old
    return m.decay * old + (1.0 - m.decay) * target

  return jax.lax.platform_dependent(fg.blocks, cuda=from_parts, rocm=from_parts,
                                    default=broadcast)


def update_moments(
    grads: Any,
    specs: Any,
    moments: Sequence[MomentUpdate],
    *,
    count: jax.Array,
    residual_scale: Any = 1.0,
    optax_order: bool = False,
) -> tuple[Any, tuple[Any, ...]]:
  """Updates folded moments for every parameter of a tree.

  Args:
    grads: the gradients (a tree like the params; ``None`` and
      ``optax.MaskedNode`` leaves pass through).
    specs: the resolved fold specs at ``update`` (the state decides the
      fold; see :func:`~foam_jax._src.moment.geometry`).
    moments: the state's moments and what each averages; every leaf is
      folded as the first one's state is.
    count: this step's count (the state's, incremented); seeds the
      stochastic rounding of 8-bit moments.
    residual_scale: ``c``, the weight of the residual in every read.
    optax_order: write each EMA in ``optax.tree.update_moment``'s operand
      order (:func:`ema`).

  Returns:
    ``(leaves, stored)``: a tree shaped like ``specs`` with one
    :class:`LeafMoments` per parameter (absent parameters as they came),
    and one new state field per moment, packed as the state keeps it.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> g = {"w": jnp.ones((8, 3))}
    >>> specs = {"w": specs_lib.FoldSpec(axis=-2, level=2)}
    >>> leaves, (mu,) = update_moments(
    ...     g, specs, [MomentUpdate({"w": jnp.zeros((2, 3))}, 0.9, "mean", "mu")],
    ...     count=jnp.array(1))
    >>> mu["w"][0]  # (1 - 0.9) * the block mean 1.0
    Array([0.1, 0.1, 0.1], dtype=float32)
  """
  unpacked = [quantized_state.stored_moments(m.stored, grads, signed=m.target == "mean",
                                             field=m.field) for m in moments]

  def leaf(spec, g, *previous):
    if moment.is_absent(g):
      return g
    compute = jnp.promote_types(g.dtype, jnp.float32)
    real = moment.real_dtype(compute)
    geom = moment.geometry(spec, g.shape, previous[0].shape)
    fg = moment.FoldedGradient(g, geom, compute_dtype=compute,
                               residual_scale=residual_scale, count_dtype=real)
    # Beside a second moment (Adam), an entry whose square overflows is frozen.
    frozen_by_second = any(m.target != "mean" for m in moments)
    targets, dtypes, mean = [], [], None
    for m, old in zip(moments, previous):
      if m.target == "mean":
        target, dtype = fg.mean, compute
        if frozen_by_second and isinstance(old, quantize.QuantizedMoment):
          target = mean = moment.FoldedGradient(
              without_overflow(g.astype(compute)), geom, compute_dtype=compute,
              count_dtype=real).mean
      elif m.target == "mean_of_squares" or geom is None:
        target, dtype = fg.mean_of_squares(), real
      else:
        target, dtype = folding.abs_sq(fg.mean), real
      targets.append(target)
      dtypes.append(dtype)
    maxima = gradient_maxima(fg.mean, geom, moments, previous, mean=mean)
    news, unfolded = [], []
    for m, old, top, target, dtype in zip(moments, previous, maxima, targets, dtypes):
      read, new = ema(old, target, m.decay, dtype, step=count, optax_order=optax_order,
                      target_max=top, separate=geom is not None)
      news.append(new)
      unfolded.append(_unfolded_read(fg, m, old, read, dtype, optax_order))
    return LeafMoments(fg, tuple(previous), tuple(news), tuple(unfolded))

  leaves = jax.tree.map(leaf, specs, grads, *unpacked, is_leaf=specs_lib.is_spec_leaf)
  stored = tuple(
      quantized_state.pack(jax.tree.map(
          lambda _, lm, i=i: lm.stored[i] if isinstance(lm, LeafMoments) else lm,
          specs, leaves, is_leaf=specs_lib.is_spec_leaf), like=moments[i].stored)
      for i in range(len(moments)))
  return leaves, stored


def leaf_map(fn, specs: Any, leaves: Any, *trees: Any) -> Any:
  """``fn(leaf_moments, *xs)`` per parameter; absent parameters pass through.

  Examples:
    >>> import jax.numpy as jnp
    >>> leaf_map(lambda lm: lm, {"w": None}, {"w": None})
    {'w': None}
  """
  def one(_, lm, *xs):
    if not isinstance(lm, LeafMoments):
      return lm
    return fn(lm, *xs)

  return jax.tree.map(one, specs, leaves, *trees, is_leaf=specs_lib.is_spec_leaf)

