r"""One pass over the tiles of a leaf folded along its last axis, on TPU.

A fold along the last axis puts :math:`k = 2^l` neighbouring lanes in one
block, and Mosaic has no strided loads across lanes. In each ``(tr, 128 k)``
tile of the gradient, the fold :math:`F` and its broadcast :math:`U` are
matmuls against 0/1 matrices on the MXU (``fold_ones`` sums each block's
lanes; ``spread_ones`` copies a folded lane to its block):

* exact: a float32 value is split into bfloat16 parts whose sum it is
  (:func:`split`: one part for bfloat16 values, two for float16 and for the
  squares of bfloat16 values, three for float32), each product is one part
  times 0 or 1, and the MXU accumulates in float32; only the order of the
  additions in a block sum differs from the XLA path's;
* per block, as on the XLA path: the matmul sees non-finite entries as zero,
  and their kinds ride beside it as small integer codes (:func:`fold`,
  :func:`spread`; one more matmul, only in a tile that holds one), so an
  infinity or a NaN reaches its own block's mean and no other.

An optimizer gives the same two functions as to
:mod:`~foam_jax._src.tpu_folded` (its docstring), with ``part`` the whole
gradient tile and ``mean`` and the moments spread to it. Each block of every
operand is copied between HBM and VMEM once (:func:`block_visits`); the two
0/1 matrices are copied in once.

The TPU compiler lays out an array whose minor dimensions it may order
freely (the state's moments) in the order that pads it least to its
``(8, 128)`` tiles (16 rows for 16-bit types): a folded moment of shape
``(4096, 2752)`` is stored column-major. A kernel reads row-major tiles, so
the compiler would copy such a moment into row-major order and back. Where
the moments are stored column-major (:func:`column_major`), the kernel reads
them as their transpose, which is the same bytes, and transposes each tile
in VMEM.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from foam_jax._src import folding

__all__ = ["LanePlan", "plan", "kernel_block", "column_major", "lanes_call", "fold", "spread",
           "split", "fold_matrix", "block_visits", "hbm_bytes"]

LANES = 128
TILE_ELEMENTS = 256 * 512  # Gradient entries per tile: (1024 / k) rows of 128 k lanes.
# Non-finite entries' codes: counts of each kind in a block (at most 16 < 32).
_POSINF, _NEGINF, _NAN = 1, 32, 1024


class LanePlan(NamedTuple):
  """The tiling of one leaf of shape ``(*batch, rows, cols)`` folded along ``cols``.

  Attributes:
    batch: the product of the leading dimensions (1 for a matrix).
    rows: the second-to-last axis's length.
    cols: the fold axis's length (a multiple of ``block``).
    block: ``k``, lanes per fold block.
    tile_rows: rows per tile.
    transposed: the moments are stored column-major (:func:`column_major`).
  """

  batch: int
  rows: int
  cols: int
  block: int
  tile_rows: int
  transposed: bool = False

  @property
  def tile_cols(self) -> int:
    return LANES * self.block

  @property
  def folded_cols(self) -> int:
    return self.cols // self.block

  @property
  def grid(self) -> tuple[int, int, int]:
    return (self.batch, -(-self.rows // self.tile_rows), -(-self.cols // self.tile_cols))


def plan(shape: tuple[int, ...], axis: int, level: int, dtype: Any,
         moment_dtype: Any = None) -> LanePlan | None:
  """The kernel's tiling for a leaf folded along its last axis, or ``None``.

  Covered: real float16, bfloat16 and float32 leaves of rank 2 or more,
  folded along the last axis in blocks of 2 to 16 lanes that divide it,
  with at least 128 folded lanes. A tail block (a last axis that ``k`` does
  not divide) is left to XLA. ``moment_dtype`` (default ``dtype``) decides
  how the compiler stores the moments (:func:`column_major`).

  Examples:
    >>> plan((4096, 11008), 1, 2, "bfloat16").grid  # tiles of 256 x 512
    (1, 16, 22)
    >>> plan((4096, 11002), 1, 2, "bfloat16") is None  # a tail block of 2: XLA
    True
  """
  k = kernel_block(shape, axis, level, dtype, fold_axis=-1)
  rows, cols = shape[-2:] if k else (0, 0)
  if not k or cols % k or cols // k < LANES or not rows:
    return None
  transposed = column_major((rows, cols // k), dtype if moment_dtype is None else moment_dtype)
  # A transposed moment tile is (128, tile_rows): whole lanes.
  tile_rows = max(TILE_ELEMENTS // (LANES * k), LANES if transposed else 0)
  return LanePlan(math.prod(shape[:-2]), rows, cols, k, rows if rows <= tile_rows else tile_rows,
                  transposed)


def kernel_block(shape: tuple[int, ...], axis: int, level: int, dtype: Any,
                 fold_axis: int) -> int | None:
  """``k`` where a kernel may cover a leaf folded along ``fold_axis`` (-2 or -1), else ``None``.

  Real float16, bfloat16 and float32 leaves of rank 2 or more, folded along
  that axis in blocks of 2 to :data:`~foam_jax._src.folding.MAX_SLICED_BLOCK`;
  each kernel's plan adds its own conditions.

  Examples:
    >>> kernel_block((64, 512), 1, 2, "float32", fold_axis=-1)
    4
    >>> kernel_block((64, 512), 1, 2, "float64", fold_axis=-1) is None
    True
  """
  if len(shape) < 2 or axis % len(shape) != len(shape) + fold_axis:
    return None
  if jnp.dtype(dtype) not in (jnp.float16, jnp.bfloat16, jnp.float32):
    return None
  length = shape[fold_axis]
  k = folding.block_size(length, level) if length else 0
  return k if 2 <= k <= folding.MAX_SLICED_BLOCK else None


def column_major(shape: tuple[int, int], dtype: Any) -> bool:
  """Whether the TPU compiler stores a ``(rows, cols)`` array column-major.

  It orders the two minor dimensions to pad the array least: the minor one
  to a multiple of 128, the other to 8 rows (16 for 16-bit types); a tie
  keeps row-major.

  Examples:
    >>> column_major((4096, 2752), "bfloat16"), column_major((4098, 2752), "bfloat16")
    (True, False)
  """
  rows, cols = shape
  sub = 16 if jnp.dtype(dtype).itemsize == 2 else 8
  up = lambda n, m: -(-n // m) * m  # noqa: E731
  return up(rows, LANES) * up(cols, sub) < up(cols, LANES) * up(rows, sub)


def split(x: jax.Array, parts: int) -> list[jax.Array]:
  """bfloat16 parts whose float32 sum is ``x`` (finite), largest first.

  Each part keeps the leading 8 bits of what the parts before it left
  (truncated, so that no part overflows), so ``parts`` of them hold
  ``8 * parts`` bits of the significand: 1 for bfloat16 values, 2 for
  float16 values and the squares of bfloat16 values, 3 for float32.

  Examples:
    >>> x = jnp.array([1.0 + 2.0**-20, -3.4e38])
    >>> [p.dtype for p in split(x, 3)] == [jnp.bfloat16] * 3
    True
    >>> bool((sum(p.astype(jnp.float32) for p in split(x, 3)) == x).all())
    True
  """
  out, rest = [], x
  for _ in range(parts - 1):
    bits = jax.lax.bitcast_convert_type(rest, jnp.uint32) & jnp.uint32(0xFFFF0000)
    top = jax.lax.bitcast_convert_type(bits, jnp.float32)
    out.append(top.astype(jnp.bfloat16))
    rest = rest - top
  out.append(rest.astype(jnp.bfloat16))
  return out


def _codes(x: jax.Array) -> jax.Array:
  """Each entry's kind: 0 finite, or +inf, -inf, NaN's code (bfloat16)."""
  code = jnp.where(x == jnp.inf, float(_POSINF), 0.0)
  code = jnp.where(x == -jnp.inf, float(_NEGINF), code)
  code = jnp.where(x != x, float(_NAN), code)  # noqa: PLR0124 (NaN)
  return code.astype(jnp.bfloat16)


def _matmuls(x: jax.Array, ones: jax.Array, parts: int) -> tuple[jax.Array, jax.Array]:
  """``x`` times ``ones`` with non-finite entries as zero, and their codes times ``ones``.

  The codes' matmul is taken only in a tile with a non-finite entry.
  """
  finite = jnp.abs(x) < jnp.inf
  clean = jnp.where(finite, x, 0.0)
  pieces = [clean.astype(jnp.bfloat16)] if parts == 1 else split(clean, parts)
  out = [jnp.dot(p, ones, preferred_element_type=jnp.float32) for p in pieces]
  value = functools.reduce(lambda a, b: a + b, out[::-1])  # Smallest parts first.
  code = jax.lax.cond(
      jnp.min(jnp.where(finite, 1.0, 0.0)) < 1.0,
      lambda: jnp.dot(_codes(x), ones, preferred_element_type=jnp.float32),
      lambda: jnp.zeros(value.shape, jnp.float32))
  return value, code


def fold(x: jax.Array, fold_ones: jax.Array, k: int, parts: int = 3) -> jax.Array:
  r"""Block means along the last axis, :math:`F x`: ``(tr, 128 k)`` to ``(tr, 128)``.

  ``fold_ones`` is ``(128 k, 128)``, one where lane ``i`` is in block ``j``.
  A block holding a NaN, or both infinities, has a NaN mean; one holding
  one kind of infinity has that infinity; the rest are their float32 means.

  Examples:
    >>> ones = fold_matrix(2)
    >>> x = jnp.tile(jnp.array([1.0, 3.0, jnp.inf, 0.0]), (1, 64))
    >>> fold(x, ones, 2)[0, :2].tolist()
    [2.0, inf]
  """
  total, code = _matmuls(x, fold_ones, parts)
  mean, code = total * (1.0 / k), code.astype(jnp.int32)
  pos, neg, nan = code & 31, (code >> 5) & 31, code >> 10
  nonfinite = jnp.where(pos > 0, jnp.inf, -jnp.inf)
  nonfinite = jnp.where((nan > 0) | ((pos > 0) & (neg > 0)), jnp.nan, nonfinite)
  return jnp.where(code > 0, nonfinite, mean)


def spread(y: jax.Array, spread_ones: jax.Array, parts: int = 3) -> jax.Array:
  r"""Each folded lane copied to its block, :math:`U y`: ``(tr, 128)`` to ``(tr, 128 k)``.

  Examples:
    >>> spread(jnp.array([[2.0, -jnp.inf] * 64]), fold_matrix(2).T)[0, :4].tolist()
    [2.0, 2.0, -inf, -inf]
  """
  value, code = _matmuls(y, spread_ones, parts)
  out = jnp.where(code == _POSINF, jnp.inf, value)
  out = jnp.where(code == _NEGINF, -jnp.inf, out)
  return jnp.where(code == _NAN, jnp.nan, out)


def fold_matrix(k: int) -> jax.Array:
  """``(128 k, 128)`` bfloat16: one where lane ``i`` of a tile is in folded lane ``j``."""
  return jnp.asarray(np.arange(LANES * k)[:, None] // k == np.arange(LANES)[None, :],
                     jnp.bfloat16)


def _parts(dtype: Any) -> int:
  """bfloat16 parts that hold a value of ``dtype`` exactly (:func:`split`)."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.bfloat16:
    return 1
  return 2 if dtype == jnp.float16 else 3


class _Spread(Sequence):
  """Folded values, spread to the tile (:func:`spread`) when they are read."""

  def __init__(self, values: Sequence[jax.Array], spread_fn: Callable, parts: Sequence[int]):
    self._values, self._spread, self._parts = list(values), spread_fn, list(parts)

  def __len__(self) -> int:
    return len(self._values)

  def __getitem__(self, i):
    return self._spread(self._values[i], self._parts[i])

  def __iter__(self) -> Iterator[jax.Array]:
    return (self[i] for i in range(len(self)))


def _kernel(coef_ref, fold_ref, spread_ref, g_ref, *refs, k: int, count: int,
            moments: Callable, update: Callable, transposed: bool):
  old_refs, u_ref, new_refs = refs[:count], refs[count], refs[count + 1:2 * count + 1]
  f32 = jnp.float32
  turn = (lambda x: x.T) if transposed else (lambda x: x)  # noqa: E731
  fold_ones, spread_ones = fold_ref[...], spread_ref[...]
  g = g_ref[...].astype(f32)
  g_parts = _parts(g_ref.dtype)
  mean = fold(g, fold_ones, k, g_parts)
  olds = [turn(ref[...].astype(f32)) for ref in old_refs]
  square_parts = 2 if g_parts == 1 else 3  # A bfloat16 value's square: 16 bits.
  news = []
  for ref, new in zip(new_refs, moments(coef_ref, mean, lambda: fold(g * g, fold_ones, k,
                                                                     square_parts), olds)):
    stored = new.astype(ref.dtype).astype(f32)  # Read as stored.
    ref[...] = turn(stored).astype(ref.dtype)
    news.append(stored)
  spread_fn = lambda y, parts: spread(y, spread_ones, parts)  # noqa: E731
  parts = [_parts(ref.dtype) for ref in old_refs]
  u = update(coef_ref, g, spread_fn(mean, 3), _Spread(olds, spread_fn, parts),
             _Spread(news, spread_fn, parts))
  u_ref[...] = u.astype(u_ref.dtype)


def lanes_call(moments: Callable, update: Callable, g: jax.Array, stored: Sequence[jax.Array],
               coefs: jax.Array, *, level: int, name: str, interpret: bool = False
               ) -> tuple[jax.Array, ...]:
  """One leaf's update ``u`` and new moments, folded along its last axis.

  Args:
    moments: ``(coefs, mean, square_mean, olds) -> news``, the new moments
      (float32) from the block means :math:`F g`, a function returning
      :math:`F(g^2)`, and the stored moments (float32).
    update: ``(coefs, g, mean, olds, news) -> u`` on the gradient tile, with
      the block means and the moments spread to it (the moments when read).
    g: the gradient (:func:`plan` must cover it).
    stored: the stored folded moments (float); overwritten in place where
      donated.
    coefs: the optimizer's float32 scalars (in SMEM).
    level: the fold level.
    name: the kernel's name (in the HLO's custom call).
    interpret: run the kernel in Pallas's interpreter (any backend).

  Returns:
    ``(u, *new_moments)``: ``u`` in ``g``'s dtype, the moments in theirs.
  """
  lplan = plan(g.shape, g.ndim - 1, level, g.dtype, stored[0].dtype if stored else None)
  if lplan is None:
    raise ValueError(f"The TPU kernel does not cover a {g.dtype} gradient of shape "
                     f"{g.shape} folded at level {level} along axis -1.")
  batch, rows, cols, k = lplan.batch, lplan.rows, lplan.cols, lplan.block
  if any(m.shape != g.shape[:-1] + (lplan.folded_cols,) for m in stored):
    raise ValueError(f"moments of shapes {[m.shape for m in stored]} are not a fold of "
                     f"{g.shape} along its last axis.")
  ones = fold_matrix(k)
  grad = pl.BlockSpec((pl.squeezed, lplan.tile_rows, lplan.tile_cols), lambda b, i, j: (b, i, j))
  if lplan.transposed:
    folded = pl.BlockSpec((pl.squeezed, LANES, lplan.tile_rows), lambda b, i, j: (b, j, i))
    moment_shape = (batch, lplan.folded_cols, rows)
    view = lambda m: jnp.swapaxes(m.reshape(batch, rows, lplan.folded_cols), 1, 2)  # noqa: E731
    unview = lambda m, like: jnp.swapaxes(m, 1, 2).reshape(like.shape)  # noqa: E731
  else:
    folded = pl.BlockSpec((pl.squeezed, lplan.tile_rows, LANES), lambda b, i, j: (b, i, j))
    moment_shape = (batch, rows, lplan.folded_cols)
    view = lambda m: m.reshape(moment_shape)  # noqa: E731
    unview = lambda m, like: m.reshape(like.shape)  # noqa: E731
  whole = lambda shape: pl.BlockSpec(shape, lambda b, i, j: (0, 0))  # noqa: E731
  count = len(stored)
  outs = pl.pallas_call(
      functools.partial(_kernel, k=k, count=count, moments=moments, update=update,
                        transposed=lplan.transposed),
      grid=lplan.grid,
      in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), whole(ones.shape), whole(ones.T.shape),
                grad] + [folded] * count,
      out_specs=[grad] + [folded] * count,
      out_shape=[jax.ShapeDtypeStruct((batch, rows, cols), g.dtype)]
      + [jax.ShapeDtypeStruct(moment_shape, m.dtype) for m in stored],
      input_output_aliases={4 + i: 1 + i for i in range(count)},
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel")),
      interpret=interpret,
      name=name,
  )(coefs, ones, ones.T, g.reshape(batch, rows, cols), *(view(m) for m in stored))
  return (outs[0].reshape(g.shape),) + tuple(unview(new, m) for new, m in zip(outs[1:], stored))


def block_visits(lplan: LanePlan) -> dict[str, list[tuple[int, int, int]]]:
  """The block each operand copies in at each grid step, in the grid's order.

  A block whose index is the same as the previous step's is not copied
  again (Pallas's pipeline keeps it): the 0/1 matrices are copied once.
  """
  visits: dict[str, list[tuple[int, int, int]]] = {"gradient": [], "moments": [],
                                                   "matrices": []}
  for b, i, j in np.ndindex(*lplan.grid):
    moment = (b, j, i) if lplan.transposed else (b, i, j)  # The index maps.
    for name, index in (("gradient", (b, i, j)), ("moments", moment),
                        ("matrices", (0, 0, 0))):
      if not visits[name] or visits[name][-1] != index:
        visits[name].append(index)
  return visits


def hbm_bytes(lplan: LanePlan, g_dtype: Any, *moment_dtypes: Any) -> int:
  """HBM bytes a kernel moves: each copied block's in-bounds part, in and out.

  The gradient is read and ``u`` written (``g``'s dtype), each moment read
  and written, and the two 0/1 matrices read once.
  """
  def in_bounds(i, j, width, cols):
    return min(lplan.tile_rows, lplan.rows - i * lplan.tile_rows) * min(width, cols - j * width)

  visits = block_visits(lplan)
  grad = sum(in_bounds(i, j, lplan.tile_cols, lplan.cols) for _, i, j in visits["gradient"])
  folded = sum(in_bounds(*((j, i) if lplan.transposed else (i, j)), LANES, lplan.folded_cols)
               for _, i, j in visits["moments"])
  size = lambda dt: jnp.dtype(dt).itemsize  # noqa: E731
  matrices = len(visits["matrices"]) * 2 * LANES * lplan.tile_cols * 2
  return (2 * grad * size(g_dtype) + 2 * folded * sum(size(dt) for dt in moment_dtypes)
          + matrices)
