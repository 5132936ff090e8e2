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
    "is_absent",
    "FoldedGradient",
    "geometry",
    "zeros",
    "map_leaves",
    "real_dtype",
    "first_moment_hat",
]


def is_absent(x: Any) -> bool:
  """A parameter that is not there: ``None`` or an ``optax.MaskedNode``.

  Both pass through every transform as Optax passes them: nothing in the
  state, and the same placeholder in the update.
  """
  return x is None or isinstance(x, optax.MaskedNode)


class Geometry(NamedTuple):
  """Where one leaf is folded: ``axis`` (non-negative) and ``level``."""

  axis: int
  level: int


def real_dtype(dtype) -> jnp.dtype:
  """The real dtype of a (possibly complex) inexact dtype's precision."""
  return jnp.finfo(dtype).dtype


def geometry(spec: specs_lib.FoldSpec | None, shape, state_shape
             ) -> Geometry | None:
  """Recovers a leaf's ``(axis, level)`` from its state's shape: the state decides.

  ``init`` may have seen more of the parameters than ``update`` sees of the
  gradients (axis names in Flax boxes or NNX Variables that the training
  step strips, shardings that tracers hide), so the state, not the spec,
  says whether and where a leaf is folded:

  * a state smaller than the gradient along one axis is a fold along it,
    whatever ``spec`` says;
  * a state of the gradient's shape is not folded, unless ``spec`` asks for
    a fold that leaves the shape as it is (level 0, or a fold axis of length
    1), as ``init`` would have made it.

  Args:
    spec: the leaf's resolved spec at ``update`` (``None``: not folded).
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
    >>> geometry(None, (8, 3), (2, 3))  # Folded by init, whatever update sees.
    Geometry(axis=0, level=2)
    >>> geometry(specs_lib.FoldSpec(axis=-2, level=2), (8, 3), (8, 3)) is None
    True
  """
  ndim = len(shape)
  differing = [
      a for a in range(min(ndim, len(state_shape))) if shape[a] != state_shape[a]
  ]
  if len(state_shape) != ndim or len(differing) > 1:
    raise ValueError(
        f"Folded state of shape {tuple(state_shape)} does not fit a gradient "
        f"of shape {tuple(shape)}; was the state made for other params?"
    )
  if not differing:
    if spec is None:
      return None
    axis = spec.axis % ndim
    if isinstance(spec.level, int) and folding.num_blocks(shape[axis], spec.level) != shape[axis]:
      return None  # init kept Adam's moments where this spec would fold.
  else:
    axis = differing[0]
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

  Moments are in the folded view ``(.., num_blocks, ..)``; the gradient and
  every full-size read are in the *blocked view* (:attr:`blocks`, the fold
  axis reshaped to ``(num_blocks, block)``), which :meth:`unblock` returns
  to the parameter's shape. There :math:`U` is a broadcast and :math:`F` a
  sum of slices, so every read and update is elementwise work that XLA
  fuses with its consumers.

  A leaf that is not folded gets the same interface with
  :math:`F = U = \\mathrm{id}` and :math:`R = 0`.

  Args:
    g: the gradient.
    geom: the leaf's :class:`Geometry`, or ``None`` if it is not folded
      (level 0, blocks of one entry, is the same: the gradient itself).
    residual_scale: ``c``, the weight of the residual in every read.
    count_dtype: dtype of the per-block entry counts (a tail block shorter
      than the rest is averaged over its true length).
    compute_dtype: the dtype ``g`` is read in (default: its own).

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
               residual_scale: Any = 1.0, count_dtype=None, compute_dtype=None):
    if geom is not None and geom.level == 0:
      geom = None  # Blocks of one entry: F = U = id and R = 0 exactly.
    self.geom = geom
    self.length = None if geom is None else g.shape[geom.axis]
    self.residual_scale = residual_scale
    compute = jnp.dtype(compute_dtype or g.dtype)
    if geom is None:
      self.blocks = self.mean = g.astype(compute)
      return
    axis, level = geom
    self._counts = folding.folded_counts(
        g.shape[axis], level, g.ndim, axis, count_dtype or real_dtype(compute))
    self.blocks = folding.to_blocks(g.astype(compute), axis, level)
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
    """:math:`U`: a folded array broadcast into the blocked view."""
    if self.geom is None:
      return folded
    return jnp.expand_dims(folded, self.geom.axis + 1)

  @property
  def has_shifted_form(self) -> bool:
    """Whether :meth:`shifted_means` applies.

    A fold in power-of-two blocks of at most
    :data:`~foam_jax._src.folding.MAX_SLICED_BLOCK` entries.
    """
    if self.geom is None:
      return False
    k = self.blocks.shape[self.geom.axis + 1]
    return k <= folding.MAX_SLICED_BLOCK and not k & (k - 1)

  def shifted_means(self, *, square: bool = False) -> jax.Array:
    """:math:`U F(g)` (or :math:`U F(|g|^2)`) from each block's own entries.

    :func:`~foam_jax._src.folding.shifted_block_sums` over the blocked view
    (of ``|g|^2`` when ``square``), divided by the block's true length: the
    block mean at full size with no folded intermediate.
    """
    if self.geom is None:
      raise ValueError("shifted_means needs a folded leaf (has_shifted_form).")
    counts = self._counts if isinstance(self._counts, int) else self.expand(self._counts)
    x = folding.abs_sq(self.blocks) if square else self.blocks
    return folding.shifted_block_sums(x, self.geom.axis) / counts

  @functools.cached_property
  def unfolded_mean(self) -> jax.Array:
    """:math:`U F(g)` in the blocked view.

    Two forms of the same values, chosen when the program is lowered
    (``jax.lax.platform_dependent``):

    * on GPUs, each entry sums its own block's entries
      (:meth:`shifted_means`), so the full-size read needs no folded
      intermediate: XLA's GPU fusion forms it inside the kernel that reads
      the gradient for the update, where a broadcast block mean would be
      written in float32 by one kernel and read back by the next;
    * elsewhere (TPU, CPU), and where :attr:`has_shifted_form` is false,
      the block means :attr:`mean` broadcast (:meth:`expand`): shifts along
      a tiled axis make a TPU relayout the gradient.
    """
    def broadcast(blocks):
      return jnp.broadcast_to(self.expand(self.mean), blocks.shape)

    if not self.has_shifted_form:
      return broadcast(self.blocks)

    def shifted(blocks):
      del blocks
      return self.shifted_means()

    return jax.lax.platform_dependent(self.blocks, cuda=shifted, rocm=shifted,
                                      default=broadcast)

  @functools.cached_property
  def residual(self) -> jax.Array | None:
    """:math:`c R` in the blocked view; ``None`` (zero) if not folded."""
    if self.geom is None:
      return None
    return self.residual_scale * (self.blocks - self.unfolded_mean)

  def read(self, m: jax.Array, *, unfolded: bool = False) -> jax.Array:
    """:math:`U \\tilde m + c R`: a folded first moment at full size.

    ``unfolded``: ``m`` is :math:`U \\tilde m` already, in the blocked view.
    """
    um = m if unfolded else self.expand(m)
    if self.residual is None:
      return um
    return um + self.residual

  def read_energy(self, v: jax.Array, *, unfolded: bool = False) -> jax.Array:
    """:math:`U \\tilde v + c^2 |R|^2`: a folded second moment at full size.

    ``unfolded``: ``v`` is :math:`U \\tilde v` already, in the blocked view.
    """
    uv = v if unfolded else self.expand(v)
    if self.residual is None:
      return uv
    return uv + folding.abs_sq(self.residual)

  def unblock(self, x_blocks: jax.Array) -> jax.Array:
    """From the blocked view back to the parameter's shape."""
    if self.geom is None or self.length is None:
      return x_blocks
    return folding.from_blocks(x_blocks, self.geom.axis, self.length)


def zeros(spec: specs_lib.FoldSpec | None, param: Any, dtype, *,
          second: bool = False) -> Any:
  """A zero moment for ``param``: folded by ``spec``, placed like ``param``.

  ``spec=None`` gives the parameter's shape; an absent parameter
  (:func:`is_absent`) passes through. ``dtype=None`` stores it in
  :func:`default_storage_dtype`. Works on ``jax.ShapeDtypeStruct`` s
  under ``jax.eval_shape``. ``dtype=int8`` gives blockwise 8-bit storage
  (a :class:`~foam_jax._src.quantize.QuantizedMoment` view, which
  :func:`~foam_jax._src.quantized_state.pack` turns into the state's layout), with
  the code of a second moment when ``second`` (else a first moment's,
  signed).

  Examples:
    >>> import jax.numpy as jnp
    >>> zeros(specs_lib.FoldSpec(-2, 2), jnp.ones((8, 3)), jnp.float32).shape
    (2, 3)
  """
  if is_absent(param):
    return param
  shape = tuple(param.shape)
  if spec is not None:
    shape = folding.folded_shape(shape, spec.axis, specs_lib.int_level(spec))
  if quantize.is_quantized_dtype(dtype):
    if jnp.issubdtype(param.dtype, jnp.complexfloating):
      raise TypeError(
          "int8 moment storage is for real parameters; got a "
          f"{jnp.dtype(param.dtype).name} parameter of shape {tuple(param.shape)}.")
    return quantize.zeros(shape, param, signed=not second)
  if dtype is None:
    dtype = default_storage_dtype(param.dtype, second=second)
  return placement.zeros_like_placed(shape, dtype, param)


def default_storage_dtype(param_dtype: Any, *, second: bool = False) -> jnp.dtype:
  """A moment's storage dtype when none is asked for: the parameter's.

  A second moment takes the real dtype of the parameter's precision.
  float16 parameters store their moments in bfloat16, the same bytes with
  float32's range: a float16 second moment overflows at 65504, so one
  gradient entry above 256 would freeze its entry and one above 6.6e5 would
  make its first moment infinite and the update NaN.

  Examples:
    >>> import jax.numpy as jnp
    >>> default_storage_dtype(jnp.float16)
    dtype(bfloat16)
  """
  dtype = real_dtype(param_dtype) if second else jnp.dtype(param_dtype)
  return jnp.dtype(jnp.bfloat16) if dtype == jnp.float16 else dtype


def map_leaves(fn, specs, *trees, outputs: int) -> tuple[Any, ...]:
  """``jax.tree.map`` of ``fn`` over a spec tree and trees shaped like it.

  ``fn`` returns a tuple of ``outputs`` values per leaf; the result is one
  tree per output. Absent parameters (``None``, ``optax.MaskedNode``) are
  handed to ``fn``, which must pass them through.
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
