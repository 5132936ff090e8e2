"""The int8 state's layout: a moment tree as a tree of codes and a tree of scales.

The state of a moment stored in 8 bits holds a :class:`QuantizedMoments`:
``codes`` and ``scales``, each a tree shaped like the params, so that every
state leaf is an array at its parameter's place, which every container that
keeps array leaves keeps (``nnx.Optimizer``, Orbax, Equinox's serialisation,
Levanter's checkpointer). An update works on one parameter's
:class:`~foam_jax._src.quantize.QuantizedMoment` at a time: :func:`unpack`
gives those, :func:`pack` stores them back. foam_jax 0.2 kept a (codes,
scales) pair at each parameter's place; :func:`stored_moments` refuses that
layout with what to do.
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax

from foam_jax._src import quantize
from foam_jax._src.moment import is_absent

__all__ = ["OLD_INT8_LAYOUT", "OldInt8LayoutError", "QuantizedMoments", "pack",
           "stored_moments", "unpack"]


class QuantizedMoments(NamedTuple):
  """A moment tree stored in 8 bits: codes and scales, each shaped like the params.

  The state field of a moment stored with ``mu_dtype=jnp.int8`` (or
  ``nu_dtype``) holds one of these in place of the float moment tree.

  Attributes:
    codes: a tree like the params of ``int8`` arrays, each the (folded)
      moment's shape.
    scales: a tree like the params of ``float32`` block scales, each the
      moment's rank with the last axis shrunk to ``ceil(n / B)``: each scale
      bounds its block's largest magnitude.

  Examples:
    >>> import jax.numpy as jnp, foam_jax
    >>> state = foam_jax.scale_by_foam(mu_dtype=jnp.int8).init({"w": jnp.ones((8, 512))})
    >>> state.mu.codes["w"].dtype, state.mu.scales["w"].shape
    (dtype('int8'), (2, 2))
  """

  codes: Any
  scales: Any


def _is_view(x: Any) -> bool:
  return isinstance(x, quantize.QuantizedMoment)


def pack(tree: Any, like: Any = None) -> Any:
  """A tree of per-parameter moments as the state stores it.

  A tree holding :class:`~foam_jax._src.quantize.QuantizedMoment` s becomes one
  :class:`QuantizedMoments` (codes and scales as two trees); a float tree is
  returned as it is. ``like``, the stored field being replaced, keeps its
  trees' own node metadata (a stack's axis names on the scales, see
  :mod:`foam_jax._src.named_scales`).
  """
  if not any(_is_view(x) for x in jax.tree.leaves(tree, is_leaf=_is_view)):
    return tree
  codes = jax.tree.map(lambda q: q.codes, tree, is_leaf=_is_view)
  scales = jax.tree.map(lambda q: q.scales, tree, is_leaf=_is_view)
  if isinstance(like, QuantizedMoments):
    codes = jax.tree.unflatten(jax.tree.structure(like.codes), jax.tree.leaves(codes))
    scales = jax.tree.unflatten(jax.tree.structure(like.scales), jax.tree.leaves(scales))
  return QuantizedMoments(codes=codes, scales=scales)


def unpack(stored: Any, *, signed: bool) -> Any:
  """The per-parameter moments of a stored moment tree (:func:`pack`'s inverse).

  The views follow the codes' tree; the scales' may name their axes
  differently (:mod:`foam_jax._src.named_scales`).

  Args:
    stored: a state's moment field: a float tree, or a
      :class:`QuantizedMoments`.
    signed: whether it holds a first moment (signed code).
  """
  if not isinstance(stored, QuantizedMoments):
    return stored
  view = quantize.SignedQuantizedMoment if signed else quantize.QuantizedMoment
  codes, treedef = jax.tree.flatten(stored.codes)
  scales = jax.tree.leaves(stored.scales)
  if len(codes) != len(scales):
    raise ValueError(
        f"int8 moments: {len(codes)} code arrays but {len(scales)} scale arrays.")
  return jax.tree.unflatten(treedef, [view(c, s) for c, s in zip(codes, scales)])


OLD_INT8_LAYOUT = (
    "int8 moments in the layout of foam_jax 0.2 (a (codes, scales) pair at each "
    "parameter's place). foam_jax 0.3 stores them as foam_jax.QuantizedMoments "
    "(a tree of codes and a tree of scales) and cannot read the old layout. To keep "
    "the run: with foam_jax 0.2, convert_state the state to float moments "
    "(mu_dtype=nu_dtype=None) and save it; with 0.3, restore that and convert_state "
    "it to int8. Or start the moments afresh with tx.init(params)."
)


class OldInt8LayoutError(ValueError):
  """A state holds int8 moments in foam_jax 0.2's layout (:data:`OLD_INT8_LAYOUT`)."""


def _is_moment_leaf(x: Any) -> bool:
  return hasattr(x, "shape") and hasattr(x, "dtype")


def stored_moments(stored: Any, updates: Any, *, signed: bool, field: str) -> Any:
  """A state's moment field as one moment per parameter, checked.

  Args:
    stored: the field (a float tree, or a :class:`QuantizedMoments`).
    updates: the gradients, whose tree the moments follow.
    signed: the field holds a first moment (the int8 code's sign).
    field: the field's name, for messages.

  Returns:
    The moments (8-bit ones as per-parameter
    :class:`~foam_jax._src.quantize.QuantizedMoment` s).

  Raises:
    OldInt8LayoutError: a parameter's place holds something other than an
      array, as in the int8 layout of foam_jax 0.2.
  """
  moments = unpack(stored, signed=signed)
  packed = isinstance(stored, QuantizedMoments)

  def check(path, g, m):
    if is_absent(g) or is_absent(m):
      return
    if _is_moment_leaf(m) and (packed or not isinstance(m, quantize.QuantizedMoment)):
      return
    found = type(m).__name__
    if isinstance(m, dict):
      found += f" with keys {sorted(m)}"
    raise OldInt8LayoutError(
        f"The optimizer state's {field} holds a {found} for the parameter at "
        f"{jax.tree_util.keystr(path)}, where an array belongs: {OLD_INT8_LAYOUT}")

  jax.tree_util.tree_map_with_path(check, updates, moments, is_leaf=is_absent)
  return moments
