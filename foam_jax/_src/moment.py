r"""The folded moment: an EMA of the gradient stored folded, read back whole.

Every folded optimizer here (FOAM's Adam, folded Muon, folded Lion) keeps
exponential moving averages of the gradient in the folded space and reads
them back at full size with the current gradient's residual. For one leaf
with fold operator :math:`F` (block means of :math:`k = 2^l` entries along
one axis), its broadcast back :math:`U` and residual scale :math:`c`:

.. math::

  \tilde m_t &= \beta \tilde m_{t-1} + (1 - \beta) F(g_t)
    && \text{(stored, } k \text{ times smaller)} \\
  R_t &= g_t - U F(g_t) && \text{(recomputed, never stored)} \\
  M_t &= U \tilde m + c R_t && \text{(the read)} \\
  V_t &= U \tilde v + c^2 |R_t|^2 && \text{(the read of a second moment)}

:class:`FoldedGradient` holds one leaf's gradient in the *blocked view*
(the fold axis reshaped to ``(num_blocks, block)``), where :math:`U` is a
broadcast and :math:`F` a sum of slices, so every read and update is
elementwise work that XLA fuses into one pass over the gradient. A leaf that
is not folded gets the same interface with :math:`F = U = \mathrm{id}` and
:math:`R = 0`: the transforms need no second code path.

The state is the source of truth for the geometry (:func:`geometry`):
``init`` may fit the level or axis to the parameter's sharding, and
``update`` (possibly traced without sharding information) folds as the state
was folded.
"""

from __future__ import annotations

import functools
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from foam_jax._src import folding
from foam_jax._src import placement
from foam_jax._src import quantize
from foam_jax._src import specs as specs_lib

__all__ = [
    "Geometry",
    "FoldedGradient",
    "geometry",
    "zeros",
    "ema",
    "map_leaves",
    "real_dtype",
    "first_moment_hat",
]


class Geometry(NamedTuple):
  """Where one leaf is folded: ``axis`` (non-negative) and ``level``."""

  axis: int
  level: int


def real_dtype(dtype) -> jnp.dtype:
  """The real dtype of a (possibly complex) inexact dtype's precision."""
  return jnp.finfo(dtype).dtype


def geometry(spec: specs_lib.FoldSpec | None, shape, state_shape
             ) -> Geometry | None:
  """Recovers a folded leaf's ``(axis, level)`` from its state's shape.

  Args:
    spec: the leaf's resolved spec; ``None`` means not folded. Its axis is
      used only when the state has the parameter's shape.
    shape: the parameter's (gradient's) shape.
    state_shape: the shape of the stored moment.

  Returns:
    ``None`` for a leaf that is not folded, else its :class:`Geometry`: the
    smallest level that folds the axis into the state's number of blocks.

  Raises:
    ValueError: the state is not a fold of a parameter of ``shape``.

  Examples:
    >>> geometry(specs_lib.FoldSpec(axis=-2, level=2), (8, 3), (2, 3))
    Geometry(axis=0, level=2)
  """
  if spec is None:
    return None
  ndim = len(shape)
  differing = [
      a for a in range(min(ndim, len(state_shape))) if shape[a] != state_shape[a]
  ]
  if len(state_shape) != ndim or len(differing) > 1:
    raise ValueError(
        f"Folded state of shape {tuple(state_shape)} does not fit a gradient "
        f"of shape {tuple(shape)}; was the state made for other params?"
    )
  axis = differing[0] if differing else spec.axis % ndim
  n, nb = shape[axis], state_shape[axis]
  # num_blocks only falls as the level grows; levels past the axis length all
  # give one block, so the smallest match is the fold.
  for level in range(max(n, 1).bit_length() + 1):
    if folding.num_blocks(n, level) == nb:
      return Geometry(axis, level)
  raise ValueError(
      f"Folded state of shape {tuple(state_shape)} is not a fold of shape "
      f"{tuple(shape)}."
  )


class FoldedGradient:
  """One leaf's gradient seen through a folded moment's geometry.

  Everything is in the blocked view ``(.., num_blocks, block, ..)`` of the
  gradient and the folded view ``(.., num_blocks, ..)`` of the moments;
  :meth:`unblock` returns to the parameter's shape. For a leaf that is not
  folded (``geometry=None``) the views are the gradient itself.

  Args:
    g: the gradient, already in the compute dtype.
    geom: the leaf's :class:`Geometry`, or ``None`` if it is not folded
      (level 0, blocks of one entry, is the same: the gradient itself).
    residual_scale: ``c``, the weight of the residual in every read.
    count_dtype: dtype of the per-block entry counts (a tail block shorter
      than the rest is averaged over its true length).

  Examples:
    >>> import jax.numpy as jnp
    >>> g = jnp.array([1.0, 3.0, 5.0, 9.0])
    >>> fg = FoldedGradient(g, Geometry(axis=0, level=1))
    >>> fg.mean  # F(g): what the stored moment takes
    Array([2., 7.], dtype=float32)
    >>> fg.unblock(fg.read(jnp.array([10.0, 20.0])))  # U m + c R
    Array([ 9., 11., 18., 22.], dtype=float32)
  """

  def __init__(self, g: jax.Array, geom: Geometry | None, *,
               residual_scale: Any = 1.0, count_dtype=None):
    if geom is not None and geom.level == 0:
      geom = None  # Blocks of one entry: F = U = id and R = 0 exactly.
    self.geom = geom
    self.length = None if geom is None else g.shape[geom.axis]
    self.residual_scale = residual_scale
    if geom is None:
      self.blocks = g
      self.mean = g
      return
    axis, level = geom
    self.blocks = folding.to_blocks(g, axis, level)  # (.., nb, k, ..)
    self._counts = folding.folded_counts(
        self.length, level, g.ndim, axis, count_dtype or real_dtype(g.dtype))
    # Block sums as slices + adds (folding.block_sums): elementwise work
    # that fuses into the consumers, no separate reduction pass.
    self.mean = folding.block_sums(self.blocks, axis) / self._counts

  def mean_of_squares(self) -> jax.Array:
    """:math:`F(|g|^2)`: the block means of the squared magnitudes."""
    if self.geom is None:
      return folding.abs_sq(self.blocks)
    return (folding.block_sums(self.blocks, self.geom.axis, square=True)
            / self._counts)

  def expand(self, folded: jax.Array) -> jax.Array:
    """:math:`U`: a folded array broadcast over the block axis (a view)."""
    if self.geom is None:
      return folded
    return jnp.expand_dims(folded, self.geom.axis + 1)

  @functools.cached_property
  def residual(self) -> jax.Array | None:
    """:math:`c R`, blocked; ``None`` (zero) for a leaf that is not folded."""
    if self.geom is None:
      return None
    return self.residual_scale * (self.blocks - self.expand(self.mean))

  def read(self, m: jax.Array) -> jax.Array:
    """:math:`U \\tilde m + c R`: a folded first moment at full size (blocked)."""
    if self.residual is None:
      return self.expand(m)
    return self.expand(m) + self.residual

  def read_energy(self, v: jax.Array) -> jax.Array:
    """:math:`U \\tilde v + c^2 |R|^2`: a folded second moment at full size."""
    if self.residual is None:
      return self.expand(v)
    return self.expand(v) + folding.abs_sq(self.residual)

  def unblock(self, x_blocks: jax.Array) -> jax.Array:
    """From the blocked view back to the parameter's shape."""
    if self.geom is None:
      return x_blocks
    return folding.from_blocks(x_blocks, self.geom.axis, self.length)


def ema(moment: jax.Array | quantize.QuantizedMoment, target: jax.Array,
        decay: Any, compute_dtype=None, *, optax_order: bool = False,
        step: Any = None) -> jax.Array | quantize.QuantizedMoment:
  """``decay * moment + (1 - decay) * target``, stored in ``moment``'s dtype.

  Args:
    moment: the stored (folded) moment.
    target: what it averages: ``F(g)``, ``F(|g|^2)``, in the folded shape.
    decay: the EMA's decay rate.
    compute_dtype: dtype the stored moment is read in (default: its own).
    optax_order: write it ``(1 - decay) * target + decay * moment``, as
      ``optax.tree.update_moment`` does. The sum is the same, but under
      ``jit`` XLA may contract one product into a fused multiply-add, so
      the operand order decides the last bit: the transforms that mirror an
      Optax optimizer use Optax's order to equal it bit for bit at level 0.
    step: the step count; seeds the stochastic rounding of a moment stored
      in 8 bits (:class:`~foam_jax._src.quantize.QuantizedMoment`), which is
      dequantized, updated and requantized in one pass. Unused for floats.

  Returns:
    The new moment, rounded to the storage dtype (or requantized).

  Examples:
    >>> import jax.numpy as jnp
    >>> ema(jnp.zeros(2), jnp.array([1.0, 2.0]), 0.5)
    Array([0.5, 1. ], dtype=float32)
  """
  if isinstance(moment, quantize.QuantizedMoment):
    m = moment.astype(compute_dtype or jnp.float32)
  else:
    m = moment if compute_dtype is None else moment.astype(compute_dtype)
  if optax_order:
    new = (1.0 - decay) * target + decay * m
  else:
    new = decay * m + (1.0 - decay) * target
  if isinstance(moment, quantize.QuantizedMoment):
    return quantize.quantize(new, moment, step)
  return new.astype(moment.dtype)


def zeros(spec: specs_lib.FoldSpec | None, param: Any, dtype, *,
          second: bool = False) -> Any:
  """A zero moment for ``param``: folded by ``spec``, placed like ``param``.

  ``spec=None`` gives the parameter's shape; an ``optax.MaskedNode`` passes
  through. Works on ``jax.ShapeDtypeStruct`` s under ``jax.eval_shape``.
  ``dtype=int8`` gives blockwise 8-bit storage
  (:class:`~foam_jax._src.quantize.QuantizedMoment`), with the code of a
  second moment when ``second`` (else a first moment's, signed).

  Examples:
    >>> import jax.numpy as jnp
    >>> zeros(specs_lib.FoldSpec(-2, 2), jnp.ones((8, 3)), jnp.float32).shape
    (2, 3)
  """
  if isinstance(param, optax.MaskedNode):
    return param
  shape = tuple(param.shape)
  if spec is not None:
    shape = folding.folded_shape(shape, spec.axis, spec.level)
  if quantize.is_quantized_dtype(dtype):
    if jnp.issubdtype(param.dtype, jnp.complexfloating):
      raise TypeError(
          "int8 moment storage is for real parameters; got a "
          f"{jnp.dtype(param.dtype).name} parameter of shape {tuple(param.shape)}.")
    return quantize.zeros(shape, param, signed=not second)
  return placement.zeros_like_placed(shape, dtype or param.dtype, param)


def map_leaves(fn, specs, *trees, outputs: int) -> tuple[Any, ...]:
  """``jax.tree.map`` of ``fn`` over a spec tree and trees shaped like it.

  ``fn`` returns a tuple of ``outputs`` values per leaf; the result is one
  tree per output. ``optax.MaskedNode`` leaves are handed to ``fn``, which
  must pass them through.
  """
  tuples = jax.tree.map(fn, specs, *trees, is_leaf=specs_lib.is_spec_leaf)
  return tuple(
      jax.tree.map(lambda _, t, i=i: t[i], specs, tuples,
                   is_leaf=specs_lib.is_spec_leaf)
      for i in range(outputs)
  )


def first_moment_hat(m: Any, g: Any, decay: Any, count: jax.Array,
                     nesterov: bool) -> Any:
  """Bias-corrected first moment (trees), as ``optax.scale_by_adam`` forms it.

  ``m / (1 - decay^t)``, or with Nesterov
  ``decay m / (1 - decay^(t+1)) + (1 - decay) g / (1 - decay^t)``, tree by
  tree in Optax's operation order, so a level-0 fold equals Optax's Adam and
  Muon to the last bit.

  Examples:
    >>> import jax.numpy as jnp
    >>> m_hat = first_moment_hat(jnp.array([0.1]), jnp.array([1.0]), 0.9,
    ...                          jnp.array(1), False)
    >>> round(float(m_hat[0]), 5)  # 0.1 / (1 - 0.9)
    1.0
  """
  if not nesterov:
    return optax.tree.bias_correction(m, decay, count)
  return jax.tree.map(
      lambda m, g: decay * m + (1 - decay) * g,
      optax.tree.bias_correction(m, decay, optax.safe_increment(count)),
      optax.tree.bias_correction(g, decay, count))
