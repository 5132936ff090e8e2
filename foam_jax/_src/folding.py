"""Folding along one axis: block means, their broadcast back, and the residual.

FOAM compresses a tensor along one *fold axis* of length ``n`` by averaging
every block of ``k = 2**level`` adjacent entries:

.. math::

  \\operatorname{fold}(x)_{\\ldots, b, \\ldots}
    = \\frac{1}{|B_b|} \\sum_{i \\in B_b} x_{\\ldots, i, \\ldots},
  \\qquad B_b = \\{bk, \\ldots, \\min((b+1)k, n) - 1\\}

so the axis shrinks from ``n`` to ``ceil(n / k)`` and every other axis is
kept: the result has the input's rank. ``unfold`` repeats each block value
over its block, and ``residual(x) = x - unfold(fold(x))`` is what folding
throws away (it has zero mean inside every block).

Conventions:

* A tail block shorter than ``k`` (``n % k != 0``) is averaged over its true
  length. (The authors' PyTorch code zero-pads and divides by ``k``.)
* A block larger than the axis (``k >= n``) folds the whole axis into one
  block: ``fold`` then keeps a single entry along the axis.
* Everything is written with reshapes, pads, slices and reductions (no
  gathers), so XLA fuses it with the surrounding elementwise work and a
  sharded fold axis needs no communication when blocks do not straddle
  shards.

The *blocked view* used throughout reshapes the fold axis into
``(num_blocks, block)``; block statistics are reductions over the ``block``
axis and ``unfold`` is a broadcast in that view.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = [
    "WHOLE_AXIS",
    "whole_axis_level",
    "block_size",
    "num_blocks",
    "folded_shape",
    "to_blocks",
    "from_blocks",
    "block_counts",
    "blocked_mean",
    "folded_counts",
    "block_sums",
    "shifted_block_sums",
    "abs_sq",
    "fold",
    "unfold",
    "residual",
    "state_size",
]


# The level that folds each fold axis into one block (FOAM-Mini).
WHOLE_AXIS = "whole_axis"

# The level of `fold_level=None`: blocks of 4 entries, the paper's l = 2.
DEFAULT_FOLD_LEVEL = 2


def whole_axis_level(length: int) -> int:
  """The smallest level whose block covers an axis of ``length``.

  ``ceil(log2(length))``: the integer level that ``"whole_axis"`` means for
  that axis.

  Examples:
    >>> whole_axis_level(512), whole_axis_level(5461), whole_axis_level(1)
    (9, 13, 0)
  """
  return max(length - 1, 0).bit_length()


def block_size(length: int, level: int) -> int:
  """Returns the effective block size for an axis of ``length`` at ``level``.

  The block is ``2**level`` entries, capped at the axis length (a block larger
  than the axis covers the whole axis) and at least 1.

  Args:
    length: the length ``n`` of the fold axis.
    level: the fold level ``l >= 0``.

  Returns:
    ``max(1, min(2**level, length))``.

  Examples:
    >>> block_size(4096, 2), block_size(3, 2), block_size(0, 2)
    (4, 3, 1)
  """
  if level < 0:
    raise ValueError(f"level must be >= 0, got {level}.")
  if level >= max(length, 1).bit_length():  # The block covers the axis.
    return max(1, length)
  return max(1, min(2**level, length))


def num_blocks(length: int, level: int) -> int:
  """Returns ``ceil(length / block)``: the folded length of the axis.

  Examples:
    >>> num_blocks(5461, 2), num_blocks(8, 10), num_blocks(0, 2)
    (1366, 1, 0)
  """
  return -(-length // block_size(length, level))


def _normalize_axis(axis: int, ndim: int) -> int:
  if not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis} is out of range for an array of rank {ndim}.")
  return axis % ndim


def folded_shape(shape: tuple[int, ...], axis: int, level: int) -> tuple[int, ...]:
  """Returns the shape of ``fold(x, axis, level)`` for ``x`` of ``shape``.

  Examples:
    >>> folded_shape((512, 1376), axis=-2, level=2)
    (128, 1376)
  """
  axis = _normalize_axis(axis, len(shape))
  out = list(shape)
  out[axis] = num_blocks(shape[axis], level)
  return tuple(out)


def to_blocks(x: jax.Array, axis: int, level: int) -> jax.Array:
  """Reshapes the fold axis of ``x`` into ``(num_blocks, block)``.

  A short tail block is zero-padded at the end of the axis so the reshape is
  exact; pair reductions over the block axis with :func:`block_counts` to
  average over true lengths, and undo with :func:`from_blocks`.

  Args:
    x: array of any rank ``>= 1``.
    axis: the fold axis (negative values count from the end).
    level: the fold level; blocks hold ``block_size(n, level)`` entries.

  Returns:
    An array of rank ``x.ndim + 1`` whose axes ``axis`` and ``axis + 1`` are
    ``(num_blocks, block)``.

  Examples:
    >>> to_blocks(jnp.zeros((6, 3)), axis=0, level=2).shape
    (2, 4, 3)
  """
  axis = _normalize_axis(axis, x.ndim)
  n = x.shape[axis]
  k = block_size(n, level)
  nb = -(-n // k)
  pad = nb * k - n
  if pad:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    x = jnp.pad(x, widths)
  return x.reshape(x.shape[:axis] + (nb, k) + x.shape[axis + 1 :])


def from_blocks(xb: jax.Array, axis: int, length: int) -> jax.Array:
  """Inverse of :func:`to_blocks`: merges ``(num_blocks, block)`` back.

  Args:
    xb: blocked array, the block pair at axes ``axis`` and ``axis + 1`` where
      ``axis`` is counted on the *unblocked* rank ``xb.ndim - 1``.
    axis: the fold axis of the unblocked array.
    length: the true length ``n`` of the fold axis; padding is sliced off.

  Returns:
    An array of rank ``xb.ndim - 1`` with ``length`` entries along ``axis``.

  Examples:
    >>> from_blocks(jnp.zeros((2, 4, 3)), axis=0, length=6).shape
    (6, 3)
  """
  axis = _normalize_axis(axis, xb.ndim - 1)
  nb, k = xb.shape[axis], xb.shape[axis + 1]
  x = xb.reshape(xb.shape[:axis] + (nb * k,) + xb.shape[axis + 2 :])
  if nb * k != length:
    x = jax.lax.slice_in_dim(x, 0, length, axis=axis)
  return x


def block_counts(length: int, level: int) -> tuple[int, ...] | int:
  """Returns the number of true entries in each block along the fold axis.

  Returns a plain ``int`` when every block is full (the common case, so the
  division is by a constant), otherwise a tuple with one count per block.

  Examples:
    >>> block_counts(8, 2), block_counts(10, 2)
    (4, (4, 4, 2))
  """
  k = block_size(length, level)
  nb = -(-length // k)
  if nb * k == length:
    return k
  return (k,) * (nb - 1) + (length - (nb - 1) * k,)


def folded_counts(length: int, level: int, ndim: int, axis: int,
                  dtype) -> jax.Array | int:
  """:func:`block_counts` shaped to broadcast against a folded array.

  Args:
    length: true length of the fold axis.
    level: fold level.
    ndim: rank of the folded (and unfolded) array.
    axis: the fold axis (non-negative).
    dtype: dtype of the counts array when blocks differ in size.

  Returns:
    ``k`` (an ``int``) when every block is full, else an array of per-block
    counts of shape ``(1, .., num_blocks, .., 1)``.

  Examples:
    >>> folded_counts(8, 2, 2, 0, jnp.float32)
    4
    >>> folded_counts(10, 2, 2, 0, jnp.float32).shape
    (3, 1)
  """
  counts = block_counts(length, level)
  if isinstance(counts, int):
    return counts
  shape = [1] * ndim
  shape[axis] = len(counts)
  return jnp.asarray(counts, dtype).reshape(shape)


def blocked_mean(xb: jax.Array, axis: int, length: int, level: int) -> jax.Array:
  """Mean of each block of a blocked array, with the block axis kept (size 1).

  Args:
    xb: output of :func:`to_blocks` (padding must be zeros).
    axis: the fold axis of the unblocked array (non-negative).
    length: true length of the fold axis.
    level: fold level used by :func:`to_blocks`.

  Returns:
    ``xb``'s block means, shape ``(..., num_blocks, 1, ...)``.
  """
  counts = folded_counts(length, level, xb.ndim - 1, axis, xb.dtype)
  return jnp.expand_dims(block_sums(xb, axis) / counts, axis + 1)


def abs_sq(x: jax.Array) -> jax.Array:
  """``|x|^2``, real: ``x * x`` for real ``x``, ``re^2 + im^2`` for complex.

  Examples:
    >>> import jax.numpy as jnp
    >>> abs_sq(jnp.array([3 + 4j]))
    Array([25.], dtype=float32)
  """
  if jnp.iscomplexobj(x):
    return x.real * x.real + x.imag * x.imag
  return x * x


# Blocks up to this size are summed with slices and adds instead of a reduce.
MAX_SLICED_BLOCK = 16


def block_sums(xb: jax.Array, axis: int, *, square: bool = False) -> jax.Array:
  """Sum over the block axis ``axis + 1`` of a blocked array (axis removed).

  For power-of-two blocks up to :data:`MAX_SLICED_BLOCK` entries, the sum is
  written as pairwise halving with slices and adds (``x[:k/2] + x[k/2:]``,
  repeated), which is elementwise work: XLA fuses it into the consumers of
  the sum (the moment updates and the residual) instead of running a
  separate, slow reduction pass over the gradient. Larger or odd blocks use
  ``jnp.sum``.

  Args:
    xb: a blocked array (:func:`to_blocks` output); axes ``axis`` and
      ``axis + 1`` are ``(num_blocks, block)``.
    axis: the fold axis of the unblocked array (non-negative).
    square: sum the squared magnitudes ``|x|^2`` of the entries instead.

  Returns:
    The block sums: the folded shape ``(..., num_blocks, ...)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> xb = jnp.arange(8.0).reshape(2, 4)
    >>> block_sums(xb, axis=0)
    Array([ 6., 22.], dtype=float32)
  """
  k = xb.shape[axis + 1]
  if k > MAX_SLICED_BLOCK or k & (k - 1):
    return jnp.sum(abs_sq(xb) if square else xb, axis=axis + 1)
  parts = [jax.lax.index_in_dim(xb, j, axis + 1, keepdims=False)
           for j in range(k)]
  if square:  # Square each slice: no block-sized x * x for XLA to keep.
    parts = [abs_sq(x) for x in parts]
  while len(parts) > 1:  # Pairwise: ((x0 + x1) + (x2 + x3)) + ...
    parts = [a + b for a, b in zip(parts[::2], parts[1::2])]
  return parts[0]


def shifted_block_sums(xb: jax.Array, axis: int) -> jax.Array:
  """Each entry's block sum, at full size: the sum of the block axis's cyclic shifts.

  For a blocked array (:func:`to_blocks`) with power-of-two blocks, entry
  ``j`` of a block gets ``sum_s x[(j - s) mod k]`` over the ``k`` shifts
  ``s``: its block's sum, formed from the block's own entries with no
  folded intermediate (the order of the additions differs by entry).

  Examples:
    >>> xb = jnp.arange(8.0).reshape(2, 4)
    >>> shifted_block_sums(xb, axis=0)
    Array([[ 6.,  6.,  6.,  6.],
           [22., 22., 22., 22.]], dtype=float32)
  """
  total = xb
  for shift in range(1, xb.shape[axis + 1]):
    total = total + jnp.roll(xb, shift, axis=axis + 1)
  return total


def fold(x: jax.Array, axis: int = -2, level: int = 2) -> jax.Array:
  """Block means of ``x`` along ``axis``: the axis shrinks ``n -> ceil(n/k)``.

  .. math::

    \\operatorname{fold}(x)_b = \\operatorname{mean}_{i \\in B_b} x_i,
    \\qquad k = 2^{\\text{level}}

  Args:
    x: array of any rank ``>= 1``.
    axis: the fold axis; ``-2`` is a Flax ``Dense`` kernel's input axis.
    level: fold level ``l``; blocks hold ``2**l`` entries (fewer in a tail
      block, or the whole axis when ``2**l`` exceeds it).

  Returns:
    The folded array: same rank and dtype as ``x``.

  Examples:
    >>> import jax.numpy as jnp
    >>> fold(jnp.arange(8.0).reshape(8, 1), axis=0, level=2)[:, 0]
    Array([1.5, 5.5], dtype=float32)
  """
  axis = _normalize_axis(axis, x.ndim)
  n = x.shape[axis]
  mean = blocked_mean(to_blocks(x, axis, level), axis, n, level)
  return jnp.squeeze(mean, axis=axis + 1).astype(x.dtype)


def unfold(y: jax.Array, axis: int, level: int, length: int) -> jax.Array:
  """Repeats each folded entry over its block: the axis grows back to ``length``.

  Args:
    y: a folded array (``fold``'s output).
    axis: the fold axis.
    level: the fold level used to fold.
    length: the unfolded length ``n`` of the axis.

  Returns:
    An array with ``length`` entries along ``axis``; ``unfold(fold(x))`` is the
    projection of ``x`` onto block-constant arrays.

  Examples:
    >>> import jax.numpy as jnp
    >>> unfold(jnp.array([1.0, 2.0]), axis=0, level=1, length=3)
    Array([1., 1., 2.], dtype=float32)
  """
  axis = _normalize_axis(axis, y.ndim)
  k = block_size(length, level)
  expanded = jnp.expand_dims(y, axis + 1)
  shape = y.shape[:axis] + (y.shape[axis], k) + y.shape[axis + 1 :]
  return from_blocks(jnp.broadcast_to(expanded, shape), axis, length)


def residual(x: jax.Array, axis: int = -2, level: int = 2) -> jax.Array:
  """What folding discards: ``x - unfold(fold(x))``; zero mean in every block.

  Examples:
    >>> import jax.numpy as jnp
    >>> residual(jnp.array([1.0, 3.0, 5.0]), axis=0, level=1)
    Array([-1.,  1.,  0.], dtype=float32)
  """
  axis = _normalize_axis(axis, x.ndim)
  n = x.shape[axis]
  xb = to_blocks(x, axis, level)
  r = xb - blocked_mean(xb, axis, n, level)
  return from_blocks(r, axis, n).astype(x.dtype)


def state_size(shape: tuple[int, ...], axis: int | None, level: int) -> int:
  """Number of elements of one folded state of a leaf of ``shape``.

  ``axis=None`` means the leaf is not folded (Adam-size state).

  Examples:
    >>> state_size((4096, 11008), axis=-2, level=2)
    11272192
  """
  if axis is None:
    return math.prod(shape)
  return math.prod(folded_shape(shape, axis, level))
