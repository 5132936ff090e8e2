"""The parameters' shapes, kept in an optimizer state without array leaves.

A folded moment does not say which parameter it belongs to: at level 2 a
``(2, 4)`` moment folds every length from 5 to 8 along its axis, so a state
made for ``(8, 4)`` weights would silently accept ``(5, 4)`` gradients.
:class:`ParamShapes` records each parameter's shape at ``init`` as static
pytree metadata (a node with no children): no state leaf is added, it costs
no memory or checkpoint space, it is part of the state's tree structure
(so ``jax.jit`` sees it at trace time, and a checkpoint restored into
``tx.init``'s state gets it from there), and :func:`check` compares it with
the gradients at ``update``.
"""

from __future__ import annotations

from typing import Any

import jax

from foam_jax._src import moment

__all__ = ["ParamShapes", "check", "record"]


@jax.tree_util.register_pytree_node_class
class ParamShapes(tuple):
  """Each parameter's shape by its tree path; no pytree children.

  ``ParamShapes()`` (no record) checks nothing: the state of code that builds
  states by hand.

  It is an empty tuple with the record as an attribute, so that code which
  walks state trees by hand (Levanter's checkpoint paths) reads it as an
  empty ``NamedTuple``, as it reads ``optax.EmptyState``; JAX flattens it
  as registered here (no leaves, the record as static data).

  Attributes:
    shapes: ``((path, shape), ...)`` in the params' leaf order, ``path`` as
      ``jax.tree_util.keystr`` writes it.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> rec = record({"w": jnp.zeros((8, 4))})
    >>> rec.shapes, jax.tree.leaves(rec)
    ((("['w']", (8, 4)),), [])
  """

  _fields: tuple[str, ...] = ()
  shapes: tuple[tuple[str, tuple[int, ...]], ...]

  def __new__(cls, shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()):
    self = super().__new__(cls)
    self.shapes = tuple(shapes)
    return self

  def _asdict(self) -> dict[str, Any]:
    return {}

  def tree_flatten(self):
    return (), self  # The record is its own (immutable) aux data.

  @classmethod
  def tree_unflatten(cls, record, children):
    del children
    return record

  # Every record equals every other: a record is advisory metadata, not
  # structure, so trees of states made from other params (Optax's
  # ``tree.map_params`` inits on placeholders; ``lax.cond`` branches) still
  # match. ``jax.jit`` traces again for gradients of new shapes, and then
  # reads the record of the state it is given.
  def __eq__(self, other: object) -> bool:
    return isinstance(other, ParamShapes)

  def __hash__(self) -> int:
    return hash(ParamShapes)

  def __repr__(self) -> str:
    return f"ParamShapes({len(self.shapes)} parameters)"


def record(params: Any) -> ParamShapes:
  """The shapes of ``params``' present leaves (arrays or ``ShapeDtypeStruct``)."""
  leaves = jax.tree_util.tree_flatten_with_path(params, is_leaf=moment.is_absent)[0]
  return ParamShapes(tuple((jax.tree_util.keystr(path), tuple(leaf.shape))
                           for path, leaf in leaves
                           if not moment.is_absent(leaf) and hasattr(leaf, "shape")))


def check(recorded: ParamShapes, grads: Any) -> None:
  """Raises if a gradient's shape is not its parameter's at ``init``.

  Leaves are matched by tree path; a path the record does not have is not
  checked (a state without a record checks nothing).

  Raises:
    ValueError: naming the leaf's path, the shape the state was made for
      and the gradient's.
  """
  if not recorded.shapes:
    return
  shapes = dict(recorded.shapes)
  leaves = jax.tree_util.tree_flatten_with_path(grads, is_leaf=moment.is_absent)[0]
  for path, leaf in leaves:
    if moment.is_absent(leaf):
      continue
    key = jax.tree_util.keystr(path)
    want = shapes.get(key)
    if want is not None and tuple(leaf.shape) != want:
      raise ValueError(
          f"The gradient at {key} has shape {tuple(leaf.shape)}, but the optimizer "
          f"state was initialized for a parameter of shape {want} there. Call "
          "tx.init on the parameters being trained (a state restored from a "
          "checkpoint must come from a model of the same shapes).")
