r"""Blockwise 8-bit storage of optimizer moments (``mu_dtype=jnp.int8``).

One moment stored in 8 bits is ``int8`` codes of the moment's shape plus
one ``float32`` scale per block of ``B`` adjacent entries along the *last*
axis (the moment's rank, that axis shrunk to ``ceil(n / B)``); the state
keeps them as two trees (:mod:`foam_jax._src.quantized_state`), while an
update works on one parameter's :class:`QuantizedMoment`. Codes and scales
take the parameter's
``PartitionSpec`` like float moments do, and a block never straddles two
shards as long as each shard's slice of the last axis is a multiple of
``B`` (:func:`block_size` fits ``B`` to a known sharding; under automatic
mesh axes inside ``jax.jit`` the sharding is hidden, and ``B`` fits every
split the mesh allows, unless ``foam_jax.sharding.pin_layout`` pins the
choice fitted to the actual sharding).

The code is a small float per block: with a scale :math:`s \ge \max_b |x|`
(the block maximum, or during training the bound that
``folded_moments.ema`` carries from step to step, which needs no second pass over
the new moment), an entry is stored as float32's exponent and its top
3 mantissa bits of :math:`|x| / s \in [0, 1]`, offset so that :math:`1.0` is
the top code:

.. math::

  \text{second moment } (x \ge 0):\ & q \in \{0, 1..255\},\
    \text{32 binades below } s \\
  \text{first moment:}\ & |q| \in \{0, 1..127\},\
    \text{16 binades below } s

with :math:`q = 0` meaning exactly zero and neighbouring code values at
most :math:`2^{-3}` apart *relative to the entry*, however far below the
scale it lies (so a scale above the block maximum costs no precision):
second moments, which span many decades inside one block, keep their small
entries, where a linear (absmax) code rounds them to zero and blows up
:math:`1/\sqrt{v}`. The second moment's code is *zero-free*: a positive
entry below the smallest code is stored as that code, never as zero.
Encoding and decoding are integer shifts and a bitcast: no logarithms or
exponentials.

Rounding is stochastic and unbiased in value: an entry between neighbouring
code values :math:`a < x < b` is stored as :math:`b` with probability
:math:`(x - a) / (b - a)` (uniform bits added below the kept mantissa bits
before truncation; the mantissa is linear within a binade). Deterministic
rounding would freeze an EMA whose per-step change (``1 - b2 = 0.1 %``) is
smaller than half a code step. The random bits are a hash of the entry's
index and a salt, advanced by a Weyl sequence over the steps: uniform over
the entries at each step, evenly spread over one entry's steps, so that the
errors a stored EMA accumulates partly cancel. Elementwise integer
arithmetic that fuses with the update (no RNG state, no ``jax.random``
key). The code's bit arithmetic lives in :mod:`foam_jax._src.float_code`.

Blocks whose scale is not a normal float32 (zero, denormal) are stored as
zero; an infinite scale is clipped to the largest float32.

Non-finite entries are stored per entry, as a float moment stores them, so
that one cannot spoil its block: the scale bounds the block's *finite*
entries only (:func:`block_stats`), and a block that holds an infinite
entry is marked by a negative scale, :math:`-2s`. In a marked block the
finite entries are coded against :math:`2s` (so never with the top code)
and the top code reads :math:`\pm\infty`; a first moment's code
:math:`-128` (unused otherwise) reads NaN. A second moment stores NaN as
:math:`+\infty`, which the update reads as a frozen entry, as Adam's does
(its first moment, from the same gradient, is NaN there too). Scales of
blocks without non-finite entries are stored as before.
"""

from __future__ import annotations

import math
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from foam_jax._src import float_code
from foam_jax._src import placement

__all__ = [
    "BLOCK_SIZE",
    "BlockStats",
    "QuantizedMoment",
    "SignedQuantizedMoment",
    "block_size",
    "block_stats",
    "dequantize",
    "is_quantized",
    "is_quantized_dtype",
    "quantize",
    "zeros",
]

# Entries per scale along the last axis (bitsandbytes uses 256-2048).
BLOCK_SIZE = 256
# Smallest block size init may fit to a shard before it refuses.
MIN_BLOCK_SIZE = 16
# The largest float32 whose square is finite: sqrt of float32's maximum.
SQUARE_LIMIT = np.float32(np.sqrt(np.float64(np.finfo(np.float32).max)))
# The first moment's code for a NaN entry (its codes are -127..127 otherwise).
NAN_CODE = -128


def is_quantized_dtype(dtype: Any) -> bool:
  """Whether ``dtype`` asks for blockwise 8-bit storage (``int8``)."""
  return dtype is not None and jnp.dtype(dtype) == jnp.int8


class QuantizedMoment(NamedTuple):
  """One parameter's 8-bit moment while an update works on it (not stored).

  Attributes:
    codes: ``int8`` codes, the moment's shape.
    scales: ``float32`` block scales, the moment's rank with the last axis
      shrunk to ``ceil(n / B)``.

  This class reads a second moment (unsigned, zero-free code); its subclass
  :class:`SignedQuantizedMoment` a first moment. The state stores the codes
  and scales of all parameters as two trees (:class:`QuantizedMoments`).
  """

  codes: jax.Array
  scales: jax.Array

  @property
  def shape(self) -> tuple[int, ...]:
    """The moment's shape (the codes')."""
    return tuple(self.codes.shape)

  @property
  def dtype(self) -> jnp.dtype:
    """``int8``: what the moment is stored in."""
    return jnp.dtype(jnp.int8)

  @property
  def nonfinite(self) -> jax.Array:
    """Per block: whether it holds an infinite entry (a negative stored scale)."""
    return self.scales < 0

  @property
  def bounds(self) -> jax.Array:
    """Each block's bound ``s`` on its finite entries' ``|x|``.

    The stored scale, or half its magnitude for a block marked as holding
    an infinite entry (stored as ``-2 s``).
    """
    return jnp.where(self.scales < 0, -0.5 * self.scales, self.scales)

  @property
  def block(self) -> int:
    """Entries per scale along the last axis (see :func:`_block_of`)."""
    return _block_of(self.shape, tuple(self.scales.shape))

  def astype(self, dtype) -> jax.Array:
    """The dequantized moment in ``dtype``.

    So that transforms read a quantized moment as they read a float one
    (``mu.astype(compute)``).
    """
    return dequantize(self).astype(dtype)


class SignedQuantizedMoment(QuantizedMoment):
  """A first moment (signed code) as :class:`QuantizedMoment`."""


def _block_of(shape: tuple[int, ...], scales_shape: tuple[int, ...]) -> int:
  """Recovers the block size from the codes' and scales' shapes.

  The smallest power of two ``B`` with ``ceil(n / B)`` scales (unique but
  when there is one scale, where every ``B >= n`` quantizes alike).
  """
  if len(shape) != len(scales_shape):
    raise ValueError(
        f"int8 moment: codes {shape} and scales {scales_shape} differ in rank.")
  if not shape:
    return 1
  n, nb = shape[-1], scales_shape[-1]
  for j in range(max(n, 1).bit_length() + 1):
    if -(-n // 2**j) == nb:
      return 2**j
  raise ValueError(
      f"int8 moment: {nb} scales do not fit a last axis of length {n}.")


def block_size(param: Any, requested: int = BLOCK_SIZE,
               shape: tuple[int, ...] | None = None) -> int:
  """The block size for ``param``'s moment, fitted to its known sharding.

  The largest power of two ``<= requested`` that divides each shard's slice
  of the moment's last axis, so that no block straddles two shards. The
  moment (of ``shape``, by default the parameter's) is placed like the
  parameter, so a moment folded along the last axis has proportionally
  shorter slices. Unsharded (or unknown) placement gives ``requested``.

  Traced under automatic mesh axes, where the sharding is not visible
  (only the mesh is), the block is the largest that divides the last axis's
  slice for every way that axis could be split over the mesh's axes.

  Raises:
    ValueError: no power of two ``>= MIN_BLOCK_SIZE`` divides the slices
      (the scales would cost more than the codes save).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> block_size(jax.ShapeDtypeStruct((8, 4096), jnp.float32))
    256
  """
  shard = placement.shard_shape(param)
  shape = tuple(param.shape) if shape is None else tuple(shape)
  if not shape:
    return requested
  if shard is None:
    slices = _possible_slices(param, shape[-1])
    if not slices:
      return requested
    how = (f"traced under automatic mesh axes {placement.hidden_mesh_shape(param)}, where "
           "its sharding is not visible; it could be split into slices of "
           f"{sorted(slices)} entries. Pin the layout fitted to the sharded params "
           "(tx = foam_jax.sharding.pin_layout(tx, params)), init eagerly on them, or use "
           "explicit mesh axes")
  elif shard[-1] == param.shape[-1]:
    return requested
  else:
    slices = {shape[-1] * shard[-1] // param.shape[-1]}  # This moment's slice.
    how = f"sharded into slices of {min(slices)} entries"
  block = requested
  while block > 1 and any(n % block for n in slices):
    block //= 2
  if block < MIN_BLOCK_SIZE:
    raise ValueError(
        f"int8 moment storage: the last axis (length {shape[-1]}) of a moment of shape "
        f"{shape} is {how}; no quantization block of {MIN_BLOCK_SIZE}..{requested} "
        "entries divides them, so a block would straddle two shards. Shard that axis "
        f"into multiples of {MIN_BLOCK_SIZE}, or store this moment in bfloat16.")
  return block


def _possible_slices(param: Any, n: int) -> set[int]:
  """Slice lengths of an axis of length ``n`` split over any of the hidden mesh's axes."""
  mesh = placement.hidden_mesh_shape(param)
  if not mesh:
    return set()
  sizes = list(mesh.values())
  slices = set()
  for bits in range(1, 2**len(sizes)):
    parts = math.prod(s for i, s in enumerate(sizes) if bits >> i & 1)
    if parts > 1 and n % parts == 0:
      slices.add(n // parts)
  return slices


def is_quantized(*moments: Any) -> bool:
  """Whether any of ``moments`` is stored in 8 bits (a :class:`QuantizedMoment`)."""
  return any(isinstance(m, QuantizedMoment) for m in moments)


def _scales_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
  if not shape:
    return ()
  return shape[:-1] + (-(-shape[-1] // block),)


def zeros(shape: tuple[int, ...], param: Any, *, signed: bool
          ) -> QuantizedMoment:
  """A zero quantized moment of ``shape``, placed like ``param``.

  Args:
    shape: the moment's shape.
    param: the parameter (array or ``jax.ShapeDtypeStruct``) whose sharding
      places the codes and scales and fits the block size; ``None``: none.
    signed: the first moment's (signed) code, else the second moment's.
  """
  block = block_size(param, shape=shape) if param is not None else BLOCK_SIZE
  codes = placement.zeros_like_placed(shape, jnp.int8, param)
  scales = placement.zeros_like_placed(
      _scales_shape(tuple(shape), block), jnp.float32, param)
  return (SignedQuantizedMoment if signed else QuantizedMoment)(codes, scales)


def _blocked(x: jax.Array, block: int) -> jax.Array:
  """``x`` with its last axis padded and split into ``(nb, block)``."""
  n = x.shape[-1]
  nb = -(-n // block)
  if nb * block != n:
    pad = [(0, 0)] * (x.ndim - 1) + [(0, nb * block - n)]
    x = jnp.pad(x, pad)
  return x.reshape(x.shape[:-1] + (nb, block))


def _unblocked(x: jax.Array, n: int) -> jax.Array:
  # Sizes spelled out: a reshape with -1 cannot infer it for an empty array.
  return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))[..., :n]


class BlockStats(NamedTuple):
  """What a block's scale is made from.

  Attributes:
    top: ``max |x|`` over each block's finite entries (``0`` if none).
    nonfinite: whether the block holds a non-finite entry (bool).
  """

  top: jax.Array
  nonfinite: jax.Array


def block_stats(x: jax.Array, block: int, *, limit: Any = None) -> BlockStats:
  """``max |x|`` over each block's finite entries, and which blocks hold others.

  Args:
    x: the entries (real).
    block: entries per block along the last axis.
    limit: entries with ``|x| > limit`` count as non-finite (so that the
      caller may square the maximum: :data:`SQUARE_LIMIT`).

  Examples:
    >>> import jax.numpy as jnp
    >>> stats = block_stats(jnp.array([[1.0, -jnp.inf, 2.0, 0.5]]), 2)
    >>> stats.top.tolist(), stats.nonfinite.tolist()
    ([[1.0, 2.0]], [[True, False]])
  """
  shape = tuple(x.shape)
  x = x.astype(jnp.float32).reshape(shape or (1,))
  mag = jnp.abs(x)
  ok = mag <= (np.float32(np.finfo(np.float32).max) if limit is None else limit)
  # Two standard reductions, which XLA fuses into one pass over the blocks,
  # and which the SPMD partitioner can finish with an all-reduce where a
  # block spans shards (a custom reduction computation it cannot).
  keys = _blocked(jnp.where(ok, mag, -1.0), block)  # Padding (0.0) is finite.
  top = jnp.maximum(jnp.max(keys, axis=-1), 0.0)
  nonfinite = jnp.min(keys, axis=-1) < 0.0
  scales_shape = _scales_shape(shape, block)
  return BlockStats(top.reshape(scales_shape), nonfinite.reshape(scales_shape))


def quantize(x: jax.Array, like: QuantizedMoment, step: Any = None, *,
             scale: jax.Array | None = None,
             nonfinite: jax.Array | None = None) -> QuantizedMoment:
  """Quantizes ``x`` with ``like``'s block size and code (signed or not).

  Args:
    x: the moment in float32 (any real float dtype), ``like``'s shape.
    like: the stored moment this replaces: gives the block size and code.
    step: the step count, seeding the stochastic rounding; ``None`` rounds
      to the nearest code value (deterministic).
    scale: the block scales to code against, of ``like.scales``' shape, each
      at least its block's ``max |x|`` over finite entries (entries above it
      are clipped to the top code); default: those block maxima.
    nonfinite: per block, whether it holds a non-finite entry (bool, of
      ``scale``'s shape); default: computed from ``x``.

  Returns:
    The new :class:`QuantizedMoment`.

  Examples:
    >>> import jax.numpy as jnp
    >>> q = quantize(jnp.array([1.0, 0.5, 0.0]), zeros((3,), None, signed=False))
    >>> q.codes.dtype, dequantize(q).tolist()
    (dtype('int8'), [1.0, 0.5, 0.0])
  """
  signed = _is_signed(like)
  block = like.block
  shape = tuple(x.shape)
  x = x.astype(jnp.float32)
  x1 = x.reshape(shape or (1,))
  n = x1.shape[-1]
  if scale is None or nonfinite is None:
    stats = block_stats(x1, block)
    scale = stats.top if scale is None else scale
    nonfinite = stats.nonfinite if nonfinite is None else nonfinite
  xb = _blocked(x1, block)                    # (.., nb, B)
  mag = jnp.abs(xb) if signed else jnp.maximum(xb, 0.0)  # NaN stays NaN.
  scale = scale.astype(jnp.float32).reshape(xb.shape[:-1] + (1,))
  marked = jnp.reshape(nonfinite, xb.shape[:-1] + (1,))
  tiny = np.float32(np.finfo(np.float32).tiny)
  big = np.float32(np.finfo(np.float32).max)
  scale = jnp.where(scale < tiny, 0.0, jnp.minimum(scale, big))  # Zero, denormal.
  # A marked block codes its finite entries against 2 s (never the top code).
  scale = jnp.where(marked, jnp.clip(2.0 * scale, tiny, big), scale)
  cap = jnp.where(marked, np.float32(0.75), np.float32(1.0))
  # The loop over entries reads 1 / scale only (0 for a zero block): one
  # value per block, computed once (a divide XLA does not recompute per entry).
  # Above 2^64 both sides are scaled by 2^-64 first (exact): 1 / scale is a
  # denormal above 1 / tiny (about 8.5e37), which backends may flush to zero,
  # and every code of the block would read zero.
  pre = jnp.where(scale > np.float32(2.0**64), np.float32(2.0**-64), np.float32(1.0))
  inv = 1.0 / jnp.where(scale > 0, scale * pre, np.float32(np.inf))
  raw = (mag * pre) * inv                     # inf or NaN for a non-finite entry.
  ratio = jnp.minimum(raw, cap)
  if signed:
    mant_bits, top = float_code.MANT_MU, float_code.TOP_MU
  else:
    mant_bits, top = float_code.MANT_NU, float_code.TOP_NU
    # Zero-free: a positive entry whose ratio underflows keeps code 1.
    ratio = jnp.where((mag > 0) & (ratio < tiny), tiny, ratio)
  shift = 23 - mant_bits
  u_bits: Any  # Added below the kept bits: half a step, or uniform bits.
  u: Any
  if step is None:
    u_bits, u = np.uint32(1 << (shift - 1)), np.float32(0.5)
  else:
    salt = 0x1B873593 if signed else 0x27D4EB2F
    h = _blocked(float_code.rounding_bits(x1.shape, step, salt), block)
    u_bits = h >> (32 - shift)
    u = (h >> 8).astype(jnp.float32) * np.float32(2.0**-24)
  k = float_code.codes_of(ratio, u_bits, u, mant_bits, top, zero_free=not signed)
  k = jnp.where(raw <= cap, k, top)           # Above the cap, inf, NaN: the top.
  if signed:
    codes = jnp.where(xb < 0, -k, k)
    codes = jnp.where(raw != raw, NAN_CODE, codes).astype(jnp.int8)
  else:
    codes = (k - 128).astype(jnp.int8)        # NaN stored as +inf.
  codes = _unblocked(codes, n).reshape(shape)
  scale = jnp.where(marked, -scale, scale)
  scales = scale[..., 0].reshape(_scales_shape(shape, block))
  return type(like)(codes, scales)


def _is_signed(q: QuantizedMoment) -> bool:
  """Whether ``q`` holds the signed (first-moment) code."""
  return isinstance(q, SignedQuantizedMoment)


def dequantize(q: QuantizedMoment) -> jax.Array:
  """The float32 moment that ``q`` stores.

  Examples:
    >>> import jax.numpy as jnp
    >>> q = quantize(jnp.array([-2.0, 0.5]), zeros((2,), None, signed=True))
    >>> dequantize(q).tolist()
    [-2.0, 0.5]
  """
  signed = _is_signed(q)
  shape = q.shape
  codes = q.codes.reshape(shape or (1,))
  n = codes.shape[-1]
  block = q.block
  scales = q.scales.reshape(codes.shape[:-1] + (q.scales.shape[-1] if q.scales.ndim else 1,))
  # Each scale broadcast over its block: a reshape, no gather.
  cb = _blocked(codes.astype(jnp.int32), block)
  s = scales[..., None]
  marked = s < 0
  s = jnp.abs(s)
  if signed:
    k = jnp.abs(cb)
    x = float_code.ratio_of(k, float_code.MANT_MU, float_code.TOP_MU) * s
    x = jnp.where(marked & (k == float_code.TOP_MU), np.float32(np.inf), x)
    x = jnp.where(cb < 0, -x, x)
    x = jnp.where(cb == NAN_CODE, np.float32(np.nan), x)
  else:
    k = cb + 128
    x = float_code.ratio_of(k, float_code.MANT_NU, float_code.TOP_NU) * s
    x = jnp.where(marked & (k == float_code.TOP_NU), np.float32(np.inf), x)
  return _unblocked(x, n).reshape(shape)
