r"""The 8-bit float code of quantized moments, as integer bit arithmetic.

A code is float32's exponent and its top ``mant_bits`` mantissa bits of a
ratio :math:`r = |x| / s \in [0, 1]` (entry over its block's scale),
offset so that :math:`1.0` is the top code; code 0 means exactly zero.
Neighbouring code values are at most :math:`2^{-\text{mant\_bits}}` apart
relative to the entry, however far below the scale it lies. Encoding and
decoding are integer shifts and a bitcast: no logarithms or exponentials.

Rounding is stochastic and unbiased in value: uniform bits added below the
kept mantissa bits before truncation (the mantissa is linear within a
binade). :func:`rounding_bits` gives those bits without an RNG state: a hash
of each entry's index, advanced by a Weyl sequence over the steps.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "MANT_MU",
    "MANT_NU",
    "TOP_MU",
    "TOP_NU",
    "code_value",
    "codes_of",
    "ratio_of",
    "rounding_bits",
]

# Mantissa bits kept: second moment (unsigned, codes 1..255: 32 binades below
# the block's scale), first moment (signed, magnitudes 1..127: 16 binades).
MANT_NU = 3
MANT_MU = 3
TOP_NU = 255
TOP_MU = 127


def rounding_bits(shape: tuple[int, ...], step: Any, salt: int) -> jax.Array:
  """Uniform ``uint32`` bits per entry and step: a hash of the index, then a
  Weyl sequence over the steps.

  Each entry starts at murmur3's 32-bit finalizer of its flat index plus
  ``salt`` (two multiplies per entry) and moves by ``2^32 / phi`` (the
  golden ratio) per step: uniform over the entries at every step (so the
  rounding is unbiased), and, for one entry, spread evenly over the steps
  instead of independently, so the rounding errors that an EMA keeps
  summing partly cancel. Elementwise integer ops, reproducible, no key to
  carry.

  Examples:
    >>> rounding_bits((2, 3), 0, 1).shape
    (2, 3)
  """
  idx = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for d in reversed(range(len(shape))):
    idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * np.uint32(
        stride % 2**32)
    stride *= shape[d]
  h = idx + np.uint32(salt)
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  h = h ^ (h >> 16)
  return h + jnp.asarray(step).astype(jnp.uint32) * np.uint32(0x9E3779B9)


def codes_of(ratio: jax.Array, u_bits: Any, u: Any, mant_bits: int,
              top: int, zero_free: bool) -> jax.Array:
  """Codes ``0..top`` of ``ratio`` in ``[0, 1]`` (float32), by bit arithmetic.

  A code is float32's exponent and top ``mant_bits`` mantissa bits, offset
  so that ``1.0`` is ``top``; rounding adds ``u_bits`` (uniform over the
  dropped bits, or half their range for nearest) before truncating, which
  is unbiased in value because the mantissa is linear within a binade.
  Below code 1 (``code_value(1)``): stochastically 0 or 1 (``u``), or 1
  when ``zero_free``; exact zeros stay 0.
  """
  shift = 23 - mant_bits
  one = 127 << mant_bits                     # (bits of 1.0) >> shift
  bits = jax.lax.bitcast_convert_type(ratio, jnp.uint32)
  k = ((bits + u_bits) >> shift).astype(jnp.int32) - (one - top)
  smallest = np.float32(code_value(1, mant_bits, top))
  if zero_free:
    low = jnp.where(ratio > 0, 1, 0)
  else:
    low = (u * smallest < ratio).astype(jnp.int32)
  return jnp.where(k >= 1, jnp.minimum(k, top), low)


def code_value(k, mant_bits: int, top: int):
  """The ratio code ``k >= 1`` stands for (NumPy, float64)."""
  kbits = np.asarray(k, np.int64) + ((127 << mant_bits) - top)
  e = (kbits >> mant_bits) - 127
  m = kbits & ((1 << mant_bits) - 1)
  return 2.0 ** e * (1 + m / 2.0**mant_bits)


def ratio_of(k: jax.Array, mant_bits: Any, top: int) -> jax.Array:
  """The float32 ratio of codes ``k`` (``0`` for ``k == 0``), by bit shifts.

  ``mant_bits`` is an int, or an integer array broadcasting against ``k``
  (one code per block).
  """
  shift = 23 - mant_bits
  offset = (127 << mant_bits) - top
  if isinstance(mant_bits, int):
    shift, offset = np.uint32(shift), np.int32(offset)
  else:
    shift, offset = shift.astype(jnp.uint32), offset.astype(jnp.int32)
  kbits = (k + offset).astype(jnp.uint32) << shift
  ratio = jax.lax.bitcast_convert_type(kbits, jnp.float32)
  return jnp.where(k == 0, 0.0, ratio)
