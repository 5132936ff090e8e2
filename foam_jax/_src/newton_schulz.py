r"""Muon's orthogonalization and shape scaling, written from the math.

Newton-Schulz approximately replaces a matrix :math:`X = U S V^\top` by
:math:`U V^\top`: after a normalization that puts every singular value in
``(0, 1]``, each step applies the odd quintic

.. math::

  X \leftarrow c_0 X + (c_1 A + c_2 A^2) X, \qquad A = X X^\top

to the wide orientation of ``X`` (rows <= columns; a tall matrix is
transposed before and after, since the step commutes with transposition).
The coefficients ``(c_0, c_1, c_2)`` are one triple for every step, or one
triple per step. The normalizations ("preconditionings"):

* ``"frobenius"``: :math:`X / (\|X\|_F + \epsilon)`;
* ``"spectral"``: :math:`X / (\|X\|_2 + \epsilon)`;
* ``"aol"``: the first step on :math:`S X`, :math:`S = \operatorname{diag}(
  \max(\sum_j |A_{ij}|, \epsilon))^{-1/2}`, with :math:`A` rescaled to
  :math:`S A S` (Almost Orthogonal Layers);
* ``"schatten"``: the first step on :math:`X / \max(\|A\|_F, \epsilon)^{1/2}`
  (a Schatten-4 bound).

An array of rank > 2 is a batch of matrices: its reduction (input) axes are
flattened into rows, its output axes into columns, every other axis is a
batch axis.

``scale_by_shape`` multiplies an orthogonalized update by
:math:`\sqrt{\max(1, \text{fan\_out} / \text{fan\_in})}` (Keller Jordan's
width transfer) or, with ``consistent_rms``, by :math:`\sqrt{\max(
\text{fan\_in}, \text{fan\_out})} \cdot \text{consistent\_rms}` (Liu et al.,
arXiv 2502.16982).

These follow the arithmetic of Optax's Muon (``optax.contrib.muon``, which
foam_jax tests them against bit for bit) and read no private Optax name, so
that foam_jax works with every Optax it supports.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

__all__ = [
    "DEFAULT_NS_COEFFS",
    "PRECONDITIONINGS",
    "PRESETS",
    "is_dim_nums",
    "orthogonalize",
    "scale_by_shape",
]

# Keller Jordan's quintic: the largest slope at zero that still keeps the
# singular values in about (0.7, 1.2) after 5 steps.
DEFAULT_NS_COEFFS = (3.4445, -4.7750, 2.0315)
# One triple per step, tuned for 5 steps (Dion; Ahn et al., arXiv 2504.05295).
DION_NS_COEFFS = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)
PRESETS = {"standard": DEFAULT_NS_COEFFS, "dion": DION_NS_COEFFS}
PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
# The floor of the aol and schatten first steps' rescaling: fixed, not the
# ``eps`` argument, as in Optax's Muon (so that the two agree bit for bit).
_FIRST_STEP_EPS = 1e-8


def is_dim_nums(x: Any) -> bool:
  """Whether ``x`` is an ``optax.contrib.MuonDimensionNumbers``."""
  return isinstance(x, MuonDimensionNumbers)


def _axes(x: jax.Array, dims: MuonDimensionNumbers) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Reduction and output axes of ``dims`` as tuples of non-negative ints."""
  as_tuple = lambda a: (a,) if isinstance(a, int) else tuple(a)
  return (tuple(a % x.ndim for a in as_tuple(dims.reduction_axis)),
          tuple(a % x.ndim for a in as_tuple(dims.output_axis)))


def _fans(x: jax.Array, dims: MuonDimensionNumbers) -> tuple[int, int]:
  reduction, output = _axes(x, dims)
  return math.prod(x.shape[a] for a in reduction), math.prod(x.shape[a] for a in output)


def _as_matrices(x: jax.Array, dims: MuonDimensionNumbers):
  """``x`` as ``(batch, rows, columns)`` and the function that undoes it."""
  if x.ndim < 2:
    raise ValueError(f"Muon's matrices need rank >= 2, got shape {x.shape}.")
  reduction, output = _axes(x, dims)
  if set(reduction) & set(output):
    raise ValueError(f"Muon's reduction axes {reduction} and output axes {output} "
                     f"overlap (dimension numbers {dims}, shape {x.shape}).")
  batch = tuple(a for a in range(x.ndim) if a not in reduction + output)
  order = batch + reduction + output
  sizes = lambda axes: tuple(x.shape[a] for a in axes)
  flat = (math.prod(sizes(batch)), math.prod(sizes(reduction)), math.prod(sizes(output)))
  back = tuple(sorted(range(x.ndim), key=lambda i: order[i]))
  return (x.transpose(order).reshape(flat),
          lambda y: y.reshape(sizes(order)).transpose(back))


def _step(x, c):
  """One quintic step ``c0 X + (c1 A + c2 A A) X`` with ``A = X X^H``."""
  a = x @ x.T.conj()
  return c[0] * x + (c[1] * a + c[2] * a @ a) @ x


def _aol_step(x, c, eps):
  a = x @ x.T.conj()
  s = jnp.expand_dims(jax.lax.rsqrt(jnp.clip(jnp.abs(a).sum(axis=-1), min=eps)), -1)
  x, a = x * s, a * s * s.transpose(-1, -2)
  return c[0] * x + (c[1] * a + c[2] * a @ a) @ x


def _schatten_step(x, c, eps):
  a = x @ x.T
  s = jnp.expand_dims(jax.lax.rsqrt(jnp.clip(jnp.linalg.norm(a, ord="fro", axis=(-2, -1)),
                                             min=eps)), (0, -1))
  x, a = x * s, a * s**2
  return c[0] * x + (c[1] * a + c[2] * a @ a) @ x


def _orthogonalize_matrix(x, coeffs, steps, preconditioning, eps):
  """Newton-Schulz on one matrix (the module docstring's iteration)."""
  tall = x.shape[0] > x.shape[1]
  if tall:
    x = x.T
  if preconditioning == "frobenius":
    x /= jnp.linalg.norm(x, ord="fro") + eps
  elif preconditioning == "spectral":
    x /= jnp.linalg.norm(x, ord=2) + eps
  first = {"aol": functools.partial(_aol_step, eps=_FIRST_STEP_EPS),
           "schatten": functools.partial(_schatten_step, eps=_FIRST_STEP_EPS)
           }.get(preconditioning)

  def step(i, x, c):
    if first is None:
      return _step(x, c)
    return jax.lax.cond(i == 0, lambda x: first(x, c), lambda x: _step(x, c), x)

  coeffs = coeffs.astype(x.dtype)
  if coeffs.ndim == 1:
    x = jax.lax.fori_loop(0, steps, lambda i, x: step(i, x, coeffs), x, unroll=True)
  else:
    def body(carry, c):
      i, x = carry
      return (i + 1, step(i, x, c)), None

    (_, x), _ = jax.lax.scan(body, (jnp.asarray(0, jnp.int32), x), coeffs)
  return x.T if tall else x


def _explicit_sharding(x: jax.Array):
  """``x``'s sharding when its mesh axes are explicit and it is sharded, else ``None``."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  if sharding is None or mesh is None or not mesh.axis_names:
    return None
  if sharding.spec == jax.sharding.PartitionSpec():
    return None
  explicit = jax.sharding.AxisType.Explicit
  if not any(t == explicit for t in mesh.axis_types):
    return None
  return sharding


def orthogonalize(x: jax.Array, coeffs: jax.Array, steps: int = 5,
                  preconditioning: str = "frobenius", eps: float = 1e-8,
                  dims: MuonDimensionNumbers | None = None) -> jax.Array:
  """Newton-Schulz orthogonalization of ``x`` (a matrix, or a batch by ``dims``).

  Args:
    x: the array; rank 2 unless ``dims`` says which axes are its rows
      (``reduction_axis``) and columns (``output_axis``).
    coeffs: ``(3,)`` for every step, or ``(n, 3)`` for ``n`` steps.
    steps: number of steps when ``coeffs`` is ``(3,)``.
    preconditioning: one of :data:`PRECONDITIONINGS`.
    eps: added to the normalizing norm.
    dims: required for rank != 2.

  Under explicit mesh axes a sharded ``x`` is gathered for the matrix
  products and the result returned with ``x``'s sharding, so that the
  update's sharding type is the parameter's.

  Examples:
    >>> import jax.numpy as jnp
    >>> o = orthogonalize(jnp.array([[3.0, 0.0], [0.0, 1.0]]), jnp.array(DEFAULT_NS_COEFFS))
    >>> bool(jnp.all(jnp.abs(jnp.diag(o) - 1.0) < 0.35))
    True
  """
  if preconditioning not in PRECONDITIONINGS:
    raise ValueError(f"preconditioning must be one of {PRECONDITIONINGS}, got "
                     f"{preconditioning!r}.")
  if x.ndim != 2 and not is_dim_nums(dims):
    raise ValueError(f"Muon needs dimension numbers for an array of shape {x.shape}.")
  if x.ndim == 2:
    dims = MuonDimensionNumbers(reduction_axis=0, output_axis=1)
  if coeffs.ndim > 2 or coeffs.shape[-1] != 3:
    raise ValueError(f"Newton-Schulz coefficients must have shape (3,) or (n, 3), got "
                     f"{coeffs.shape}.")
  sharding = _explicit_sharding(x)
  if sharding is not None:
    x = jax.sharding.reshard(x, jax.sharding.NamedSharding(sharding.mesh,
                                                           jax.sharding.PartitionSpec()))
  assert dims is not None
  matrices, back = _as_matrices(x, dims)
  out = back(jax.vmap(lambda m: _orthogonalize_matrix(m, coeffs, steps, preconditioning,
                                                      eps))(matrices))
  return out if sharding is None else jax.sharding.reshard(out, sharding)


def scale_by_shape(weight_dimension_numbers: Any = None,
                   consistent_rms: float | None = None) -> optax.GradientTransformation:
  """Scales each orthogonalized update by its matrix's fans (see the module docstring).

  Args:
    weight_dimension_numbers: a tree of ``MuonDimensionNumbers`` (or a
      callable ``updates -> tree``); ``None``: every update is a matrix
      ``(fan_in, fan_out)``.
    consistent_rms: ``None`` for width transfer, else the consistent-RMS
      target.

  Returns:
    A stateless ``optax.GradientTransformation``.
  """

  def scale(u, dims):
    fan_in, fan_out = _fans(u, dims)
    if consistent_rms is None:
      # An empty matrix (fan_in 0) has nothing to scale.
      return jnp.sqrt(jnp.maximum(1, fan_out / max(fan_in, 1))) * u
    return jnp.sqrt(jnp.maximum(fan_in, fan_out)) * consistent_rms * u

  def update_fn(updates, state, params=None):
    del params
    dims = (weight_dimension_numbers(updates) if callable(weight_dimension_numbers)
            else weight_dimension_numbers)
    if dims is None:
      return jax.tree.map(lambda u: scale(u, MuonDimensionNumbers(0, 1)), updates), state
    return jax.tree.map(scale, updates, dims, is_leaf=is_dim_nums), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)
