r"""FOAM's folded Adam update on TPU: one Pallas (Mosaic) kernel per leaf.

XLA's TPU program for the blocked view of a fold along axis -2 (blocks of
:math:`k = 2^l` rows) puts the block into the two minor dimensions that the
TPU tiles, relayouts the gradient and hands full-size float32 intermediates
between its kernels. This kernel streams each ``(tr, tc)`` tile of the
gradient once, with the matching ``(tr / k, tc)`` tile of each moment:

.. math::

  F g &= \tfrac{1}{k} \textstyle\sum_j g_{j::k}, \qquad
  T = F(g^2) \text{ or } (F g)^2 \\
  \tilde m &\leftarrow \beta_1 \tilde m + (1 - \beta_1) F g, \qquad
  \tilde v \leftarrow \beta_2 \tilde v + (1 - \beta_2) T
  \quad \text{(stored, then read as stored)} \\
  R &= g - U F g \\
  u &= s_u \frac{a_m U \tilde m + b_m U F g + c_m R}
                {\sqrt{a_v U \tilde v + c_v R^2 + v_f} + \epsilon}

The rows of one block are ``k`` strided loads (``g[j::k]``) from a float32
copy of the tile in VMEM, so :math:`F`, :math:`U` and :math:`R` are
elementwise work on ``(tr / k, 128)`` slabs. :func:`coefficients` gives
:math:`(a_m, b_m, c_m, a_v, c_v, s_u, v_f)` for each bias-correction form of
:func:`foam_jax.scale_by_foam` (with Nesterov's momentum); the state format
is the XLA path's. A tail block (an axis length that ``k`` does not divide)
is averaged over its true rows.

Each block of every operand is copied between HBM and VMEM once
(:func:`block_visits`), so the kernel moves what its operands and outputs
hold (:func:`hbm_bytes`): the gradient, the moments in and out, and ``u``.
:mod:`foam_jax._src.tpu_dispatch` chooses it on TPU when the program is
lowered (``jax.lax.platform_dependent``) for the leaves :func:`plan` covers;
the XLA path is the reference and every other platform's program.
"""

from __future__ import annotations

import functools
import math
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from foam_jax._src import folding

__all__ = ["KernelPlan", "plan", "coefficients", "folded_adam", "block_visits",
           "hbm_bytes", "KERNEL_NAME"]

KERNEL_NAME = "foam_folded_adam"
LANES = 128
MAX_BLOCK = folding.MAX_SLICED_BLOCK
FOLDED_ROWS = 32  # Moment rows per tile: a multiple of bf16's 16-row tile.
_COEFFICIENTS = ("b1", "b2", "am", "bm", "cm", "av", "cv", "su", "vf", "eps")


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
  dtype = jnp.dtype(dtype)
  if len(shape) < 2 or axis % len(shape) != len(shape) - 2:
    return None
  if dtype not in (jnp.float16, jnp.bfloat16, jnp.float32):
    return None
  rows, cols = shape[-2:]
  k = folding.block_size(rows, level) if rows else 0
  if not 2 <= k <= MAX_BLOCK or cols < LANES:
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


def coefficients(form: str, nesterov: bool, count: jax.Array, *, b1: Any, b2: Any,
                 eps: Any, eps_root: Any, alpha: Any, residual_scale: Any) -> jax.Array:
  r"""The kernel's scalars for step ``count`` of one bias-correction form.

  With :math:`M = U \tilde m + c R` and :math:`V = U \tilde v + c^2 R^2` the
  reads, :math:`t` the count, :math:`a = 1 / (1 - \beta_1^t)`:

  * ``"step_size"``: :math:`u = \alpha \sqrt{1 - \beta_2^t}\, a M /
    (\sqrt{V + \epsilon_r (1 - \beta_2^t)} + \epsilon)`;
  * ``"moments"``: :math:`u = \alpha\, a M / (\sqrt{V / (1 - \beta_2^t) +
    \epsilon_r} + \epsilon)`;
  * ``"folded_moments"``: :math:`u = \alpha (a U \tilde m + c R) /
    (\sqrt{U \tilde v / (1 - \beta_2^t) + c^2 R^2 + \epsilon_r} + \epsilon)`.

  With Nesterov's momentum the first moment's part is
  :math:`\beta_1 X / (1 - \beta_1^{t+1}) + (1 - \beta_1) g / (1 - \beta_1^t)`
  for its read :math:`X` (``optax.scale_by_adam``'s), where
  :math:`g = U F g + R`.

  Returns:
    float32 ``[b1, b2, am, bm, cm, av, cv, su, vf, eps]``.
  """
  f32 = jnp.float32
  b1, b2, eps, eps_root, alpha, c = (jnp.asarray(x, f32) for x in (
      b1, b2, eps, eps_root, alpha, residual_scale))
  t = count.astype(f32)
  one = jnp.ones((), f32)
  zero = jnp.zeros((), f32)
  if nesterov:
    # X's weight and g's weight; g = U F g + R.
    x_w, g_w = b1 / (1.0 - b1 ** (t + 1.0)), (1.0 - b1) / (1.0 - b1**t)
  else:
    x_w, g_w = 1.0 / (1.0 - b1**t), zero
  if form == "step_size":
    root = jnp.sqrt(1.0 - b2**t)
    am, bm, cm = x_w, g_w, x_w * c + g_w
    av, cv, su, vf = one, c * c, alpha * root, eps_root * (1.0 - b2**t)
  elif form == "moments":
    am, bm, cm = x_w, g_w, x_w * c + g_w
    av = 1.0 / (1.0 - b2**t)
    cv, su, vf = c * c * av, alpha, eps_root
  elif form == "folded_moments":
    # The folded moments are corrected, then the residual c R is added.
    am, bm, cm = x_w, g_w, c
    av, cv, su, vf = 1.0 / (1.0 - b2**t), c * c, alpha, eps_root
  else:
    raise ValueError(f"form must be step_size, moments or folded_moments, got {form!r}.")
  return jnp.stack([b1, b2, am, bm, cm, av, cv, su, vf, eps])


def _kernel(coef_ref, g_ref, mu_ref, nu_ref, u_ref, mu_out, nu_out, *scratch,
            kplan: KernelPlan, mean_of_squares: bool):
  k, tile_rows = kplan.block, kplan.tile_rows
  r = kplan.folded_tile_rows
  b1, b2, am, bm, cm, av, cv, su, vf, eps = (coef_ref[i] for i in range(len(_COEFFICIENTS)))
  f32 = jnp.float32
  masks: list[jax.Array] | None = None
  inverse: Any = 1.0 / k
  if kplan.tail:
    # Rows of this tile inside the axis; part j of folded row q is row q k + j.
    valid = kplan.rows - pl.program_id(1) * tile_rows
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
    if mean_of_squares:
      target = sum((p * p for p in parts[1:]), parts[0] * parts[0]) * inverse
    else:
      target = mean * mean
    mu = (b1 * mu_ref[:, cols].astype(f32) + (1.0 - b1) * mean).astype(mu_out.dtype)
    nu = (b2 * nu_ref[:, cols].astype(f32) + (1.0 - b2) * target).astype(nu_out.dtype)
    mu_out[:, cols] = mu
    nu_out[:, cols] = nu
    m_base = am * mu.astype(f32) + bm * mean
    v_base = av * nu.astype(f32) + vf
    for j, p in enumerate(parts):
      res = p - mean
      u_tile[pl.ds(j, r, stride=k), :] = su * (m_base + cm * res) / (
          jnp.sqrt(v_base + cv * res * res) + eps)
    u_ref[:, cols] = u_tile[...].astype(u_ref.dtype)


def _specs(kplan: KernelPlan):
  grad = pl.BlockSpec((pl.squeezed, kplan.tile_rows, kplan.tile_cols), lambda b, i, j: (b, i, j))
  folded = pl.BlockSpec((pl.squeezed, kplan.folded_tile_rows, kplan.tile_cols),
                        lambda b, i, j: (b, i, j))
  return grad, folded


def folded_adam(g: jax.Array, mu: jax.Array, nu: jax.Array, coefs: jax.Array, *,
                level: int, mean_of_squares: bool, interpret: bool = False
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One leaf's update ``u`` and new moments, in one pass over its tiles.

  Args:
    g: the gradient, folded along axis -2 (:func:`plan` must cover it).
    mu, nu: the stored folded moments (float, ``g``'s shape with the fold
      axis ``ceil(rows / k)`` long); overwritten in place where donated.
    coefs: :func:`coefficients`.
    level: the fold level.
    mean_of_squares: the second moment averages :math:`F(g^2)` (else
      :math:`(F g)^2`).
    interpret: run the kernel in Pallas's interpreter (any backend).

  Returns:
    ``(u, mu, nu)``: ``u`` in ``g``'s dtype, the moments in theirs.
  """
  kplan = plan(g.shape, g.ndim - 2, level, g.dtype)
  if kplan is None:
    raise ValueError(f"The TPU kernel does not cover a {g.dtype} gradient of shape "
                     f"{g.shape} folded at level {level} along axis -2.")
  batch, rows, cols, nb = kplan.batch, kplan.rows, kplan.cols, kplan.folded_rows
  if mu.shape[-2] != nb or nu.shape[-2] != nb:
    raise ValueError(f"moments of shapes {mu.shape} and {nu.shape} are not a fold of {g.shape}.")
  grad, folded = _specs(kplan)
  scratch_rows = kplan.folded_tile_rows * kplan.block
  chunks = kplan.tile_cols // LANES
  u, mu_new, nu_new = pl.pallas_call(
      functools.partial(_kernel, kplan=kplan, mean_of_squares=mean_of_squares),
      grid=kplan.grid,
      in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), grad, folded, folded],
      out_specs=[grad, folded, folded],
      out_shape=[jax.ShapeDtypeStruct((batch, rows, cols), g.dtype),
                 jax.ShapeDtypeStruct((batch, nb, cols), mu.dtype),
                 jax.ShapeDtypeStruct((batch, nb, cols), nu.dtype)],
      scratch_shapes=[pltpu.VMEM((scratch_rows, LANES), jnp.float32)] * (2 * chunks),
      input_output_aliases={2: 1, 3: 2},
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel")),
      interpret=interpret,
      name=KERNEL_NAME,
  )(coefs, g.reshape(batch, rows, cols), mu.reshape(batch, nb, cols),
    nu.reshape(batch, nb, cols))
  return u.reshape(g.shape), mu_new.reshape(mu.shape), nu_new.reshape(nu.shape)


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


def hbm_bytes(kplan: KernelPlan, g_dtype: Any, mu_dtype: Any, nu_dtype: Any) -> int:
  """HBM bytes the kernel moves: each copied block's in-bounds part, in and out.

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
  return 2 * grad * size(g_dtype) + 2 * folded * (size(mu_dtype) + size(nu_dtype))


