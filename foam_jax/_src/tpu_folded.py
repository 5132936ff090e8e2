r"""One pass over a folded leaf's tiles on TPU: the driver of FOAM's Pallas kernels.

XLA's TPU program for the blocked view of a fold along axis -2 (blocks of
:math:`k = 2^l` rows) puts the block into the two minor dimensions that the
TPU tiles, relayouts the gradient and hands full-size float32 intermediates
between its kernels. :func:`folded_call` streams each ``(tr, tc)`` tile of
the gradient once, with the matching ``(tr / k, tc)`` tile of each folded
moment. In each tile, a block's rows are ``k`` strided loads (``g[j::k]``)
from a float32 copy in VMEM, so the fold :math:`F`, its broadcast :math:`U`
and the residual :math:`R = g - U F g` are elementwise work on
``(tr / k, 128)`` slabs; a tail block (an axis length that ``k`` does not
divide) is averaged over its true rows. An optimizer gives two functions:

* ``moments(coefs, mean, square_mean, olds)``: the new moments (float32)
  from the block means :math:`F g`, a function that returns
  :math:`F(g^2)`, and the stored moments (float32);
* ``update(coefs, part, mean, olds, news)``: :math:`u` on one row of every
  block, reading the new moments as stored (rounded to their dtype).

A fold along the last axis takes :mod:`~foam_jax._src.tpu_lanes`'s pass,
with the same two functions; :func:`covers` and :func:`call` choose.

Each block of every operand is copied between HBM and VMEM once
(:func:`block_visits`), so a kernel moves what its operands and outputs
hold (:func:`hbm_bytes`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from foam_jax._src import folding
from foam_jax._src import tpu_lanes

__all__ = ["KernelPlan", "plan", "covers", "call", "folded_call", "block_visits", "hbm_bytes",
           "LANES"]

LANES = 128
MAX_BLOCK = folding.MAX_SLICED_BLOCK
FOLDED_ROWS = 32  # Moment rows per tile: a multiple of bf16's 16-row tile.

Moments = Callable[..., Sequence[jax.Array]]
Update = Callable[..., jax.Array]


class KernelPlan(NamedTuple):
  """The tiling of one leaf of shape ``(*batch, rows, cols)``.

  Attributes:
    batch: the product of the leading dimensions (1 for a matrix).
    rows: the fold axis's length.
    cols: the last axis's length.
    block: ``k``, rows per fold block.
    tile_rows: gradient rows per tile (``folded_tile_rows * block``, or
      ``rows`` when one tile holds the axis).
    folded_tile_rows: moment rows per tile.
    tile_cols: columns per tile (a multiple of 128).
  """

  batch: int
  rows: int
  cols: int
  block: int
  tile_rows: int
  folded_tile_rows: int
  tile_cols: int

  @property
  def folded_rows(self) -> int:
    return -(-self.rows // self.block)

  @property
  def tail(self) -> bool:
    """Whether the last fold block is shorter than ``block``."""
    return self.rows % self.block != 0

  @property
  def grid(self) -> tuple[int, int, int]:
    return (self.batch, -(-self.rows // self.tile_rows), -(-self.cols // self.tile_cols))


def plan(shape: tuple[int, ...], axis: int, level: int, dtype: Any) -> KernelPlan | None:
  """The kernel's tiling for a leaf, or ``None`` where the XLA path runs.

  Covered: real float16, bfloat16 and float32 leaves of rank 2 or more,
  folded along the second-to-last axis in blocks of 2 to
  :data:`MAX_BLOCK` rows, with at least 128 columns. A tail block is
  covered where the axis spans more than one tile.

  Examples:
    >>> plan((4096, 11008), 0, 2, "bfloat16").grid
    (1, 32, 22)
    >>> plan((4096, 11008), 1, 2, "bfloat16") is None  # fold axis -1
    True
  """
  k = tpu_lanes.kernel_block(shape, axis, level, dtype, fold_axis=-2)
  rows, cols = shape[-2:] if k else (0, 0)
  if not k or cols < LANES:
    return None
  nb = -(-rows // k)
  if nb > FOLDED_ROWS:
    folded_tile, tile_rows = FOLDED_ROWS, FOLDED_ROWS * k
  elif rows % k:
    return None  # One tile with a tail block: left to XLA.
  else:
    folded_tile, tile_rows = nb, rows
  tile_cols = min(512 if k <= 4 else 256, cols // LANES * LANES)
  return KernelPlan(math.prod(shape[:-2]), rows, cols, k, tile_rows, folded_tile, tile_cols)


def _kernel(coef_ref, g_ref, *refs, kplan: KernelPlan, count: int, moments: Moments,
            update: Update):
  old_refs, u_ref, new_refs = refs[:count], refs[count], refs[count + 1:2 * count + 1]
  scratch = refs[2 * count + 1:]
  k, r, f32 = kplan.block, kplan.folded_tile_rows, jnp.float32
  masks: list[jax.Array] | None = None
  inverse: Any = 1.0 / k
  if kplan.tail:
    # Rows of this tile inside the axis; part j of folded row q is row q k + j.
    valid = kplan.rows - pl.program_id(1) * kplan.tile_rows
    row = jax.lax.broadcasted_iota(jnp.int32, (r, LANES), 0) * k
    masks = [row + j < valid for j in range(k)]
    inverse = 1.0 / jnp.maximum(sum(m.astype(f32) for m in masks), 1.0)
  chunks = len(scratch) // 2
  for chunk in range(chunks):
    cols = pl.ds(chunk * LANES, LANES)
    g_tile, u_tile = scratch[chunk], scratch[chunks + chunk]
    g_tile[...] = g_ref[:, cols].astype(f32)
    parts = [g_tile[pl.ds(j, r, stride=k), :] for j in range(k)]
    if masks is not None:
      parts = [jnp.where(m, p, 0.0) for m, p in zip(masks, parts)]
    mean = sum(parts[1:], parts[0]) * inverse
    olds = [ref[:, cols].astype(f32) for ref in old_refs]
    square_mean = lambda: sum((p * p for p in parts[1:]), parts[0] * parts[0]) * inverse  # noqa: B023, E731
    news = []
    for ref, new in zip(new_refs, moments(coef_ref, mean, square_mean, olds)):
      stored = new.astype(ref.dtype)
      ref[:, cols] = stored
      news.append(stored.astype(f32))  # Read as stored.
    for j, part in enumerate(parts):
      u_tile[pl.ds(j, r, stride=k), :] = update(coef_ref, part, mean, olds, news)
    u_ref[:, cols] = u_tile[...].astype(u_ref.dtype)


def _specs(kplan: KernelPlan):
  grad = pl.BlockSpec((pl.squeezed, kplan.tile_rows, kplan.tile_cols), lambda b, i, j: (b, i, j))
  folded = pl.BlockSpec((pl.squeezed, kplan.folded_tile_rows, kplan.tile_cols),
                        lambda b, i, j: (b, i, j))
  return grad, folded


def folded_call(moments: Moments, update: Update, g: jax.Array, stored: Sequence[jax.Array],
                coefs: jax.Array, *, level: int, name: str, interpret: bool = False
                ) -> tuple[jax.Array, ...]:
  """One leaf's update ``u`` and new moments, in one pass over its tiles.

  Args:
    moments, update: the optimizer's two functions (module docstring).
    g: the gradient, folded along axis -2 (:func:`plan` must cover it).
    stored: the stored folded moments (float, ``g``'s shape with the fold
      axis ``ceil(rows / k)`` long); overwritten in place where donated.
    coefs: the optimizer's float32 scalars (in SMEM).
    level: the fold level.
    name: the kernel's name (in the HLO's custom call).
    interpret: run the kernel in Pallas's interpreter (any backend).

  Returns:
    ``(u, *new_moments)``: ``u`` in ``g``'s dtype, the moments in theirs.
  """
  kplan = plan(g.shape, g.ndim - 2, level, g.dtype)
  if kplan is None:
    raise ValueError(f"The TPU kernel does not cover a {g.dtype} gradient of shape "
                     f"{g.shape} folded at level {level} along axis -2.")
  batch, rows, cols, nb = kplan.batch, kplan.rows, kplan.cols, kplan.folded_rows
  if any(m.shape[-2] != nb or m.shape[:-2] != g.shape[:-2] for m in stored):
    raise ValueError(f"moments of shapes {[m.shape for m in stored]} are not a fold of "
                     f"{g.shape}.")
  grad, folded = _specs(kplan)
  count = len(stored)
  scratch_rows = kplan.folded_tile_rows * kplan.block
  outs = pl.pallas_call(
      functools.partial(_kernel, kplan=kplan, count=count, moments=moments, update=update),
      grid=kplan.grid,
      in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), grad] + [folded] * count,
      out_specs=[grad] + [folded] * count,
      out_shape=[jax.ShapeDtypeStruct((batch, rows, cols), g.dtype)]
      + [jax.ShapeDtypeStruct((batch, nb, cols), m.dtype) for m in stored],
      scratch_shapes=[pltpu.VMEM((scratch_rows, LANES), jnp.float32)]
      * (2 * (kplan.tile_cols // LANES)),
      input_output_aliases={2 + i: 1 + i for i in range(count)},
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel")),
      interpret=interpret,
      name=name,
  )(coefs, g.reshape(batch, rows, cols), *(m.reshape(batch, nb, cols) for m in stored))
  return (outs[0].reshape(g.shape),) + tuple(
      new.reshape(m.shape) for new, m in zip(outs[1:], stored))


def block_visits(kplan: KernelPlan) -> dict[str, list[tuple[int, int, int]]]:
  """The block each operand copies in at each grid step, in the grid's order.

  A block whose index is the same as the previous step's is not copied
  again (Pallas's pipeline keeps it), so these lists are the copies.
  """
  visits: dict[str, list[tuple[int, int, int]]] = {"gradient": [], "moments": []}
  for b, i, j in np.ndindex(*kplan.grid):
    for name in visits:
      index = (b, i, j)  # Both index maps are the identity on the grid.
      if not visits[name] or visits[name][-1] != index:
        visits[name].append(index)
  return visits


def hbm_bytes(kplan: KernelPlan, g_dtype: Any, *moment_dtypes: Any) -> int:
  """HBM bytes a kernel moves: each copied block's in-bounds part, in and out.

  The gradient is read and ``u`` written (``g``'s dtype); each moment is
  read and written.
  """
  def in_bounds(index, block_rows, rows):
    _, i, j = index
    height = min(block_rows, rows - i * block_rows)
    width = min(kplan.tile_cols, kplan.cols - j * kplan.tile_cols)
    return height * width

  visits = block_visits(kplan)
  grad = sum(in_bounds(ix, kplan.tile_rows, kplan.rows) for ix in visits["gradient"])
  folded = sum(in_bounds(ix, kplan.folded_tile_rows, kplan.folded_rows)
               for ix in visits["moments"])
  size = lambda dt: jnp.dtype(dt).itemsize  # noqa: E731
  return 2 * grad * size(g_dtype) + 2 * folded * sum(size(dt) for dt in moment_dtypes)


def covers(shape: tuple[int, ...], axis: int, level: int, dtype: Any) -> bool:
  """Whether a kernel covers a leaf folded along ``axis``: -2 (:func:`plan`) or -1.

  Examples:
    >>> covers((4096, 11008), 0, 2, "bfloat16"), covers((4096, 11008), 1, 2, "bfloat16")
    (True, True)
  """
  return (plan(shape, axis, level, dtype) is not None
          or tpu_lanes.plan(shape, axis, level, dtype) is not None)


def call(moments: Moments, update: Update, g: jax.Array, stored: Sequence[jax.Array],
         coefs: jax.Array, *, axis: int, level: int, name: str, interpret: bool = False
         ) -> tuple[jax.Array, ...]:
  """:func:`folded_call` for a fold along axis -2, ``tpu_lanes.lanes_call`` along -1."""
  if axis % g.ndim == g.ndim - 1:
    return tpu_lanes.lanes_call(moments, update, g, stored, coefs, level=level, name=name,
                                interpret=interpret)
  return folded_call(moments, update, g, stored, coefs, level=level, name=name,
                     interpret=interpret)
