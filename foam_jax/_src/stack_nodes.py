"""The nodes other stacks wrap parameters in, and the axis names they carry.

Flax Linen boxes (``nn.Partitioned``, ``nn.LogicallyPartitioned``), Flax NNX
``Variable`` s and haliax ``NamedArray`` s are pytree nodes around one array
that name its axes; Optax's tree maps keep them, so a state made by
``tx.init`` holds the same nodes around its moments. The classes are
recognised by name and package, so foam_jax imports none of those stacks.
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["axis_names", "is_class_of", "is_flax_box", "is_named_array", "is_named_node",
           "is_nnx_variable", "rebuild"]


def is_class_of(node: Any, package: str, *names: str) -> bool:
  """``node``'s class or a base is ``package``'s class named one of ``names``."""
  return any(c.__name__ in names and c.__module__.split(".")[0] == package
             for c in type(node).__mro__)


def is_flax_box(node: Any) -> bool:
  """A Flax Linen ``Partitioned`` / ``LogicallyPartitioned`` box."""
  return is_class_of(node, "flax", "Partitioned")


def is_nnx_variable(node: Any) -> bool:
  """A Flax NNX ``Variable`` (its metadata may name the axes)."""
  return is_class_of(node, "flax", "Variable") and hasattr(node, "get_metadata")


def is_named_array(node: Any) -> bool:
  """A haliax ``NamedArray``."""
  return is_class_of(node, "haliax", "NamedArray")


def is_named_node(node: Any) -> bool:
  """One of the nodes above: a wrapper of one array that may name its axes."""
  return is_flax_box(node) or is_nnx_variable(node) or is_named_array(node)


def _nnx_names_key(meta: dict[str, Any]) -> str | None:
  for key in ("out_sharding", "sharding_names"):
    if meta.get(key):
      return key
  return None


def axis_names(node: Any) -> tuple[Any, ...] | None:
  """The names ``node`` gives its array's axes (a name, a tuple or ``None`` each).

  ``None`` where the node names none (or is not one of the nodes above).
  """
  if is_flax_box(node):
    return tuple(node.names)
  if is_nnx_variable(node):
    meta = node.get_metadata()
    key = _nnx_names_key(meta)
    return tuple(meta[key]) if key else None
  if is_named_array(node):
    names = getattr(node, "axis_names", None)
    return tuple(names) if names is not None else tuple(a.name for a in node.axes)
  return None


def rebuild(node: Any, value: Any, names: tuple[Any, ...]) -> Any:
  """``node`` around ``value`` (any shape of its rank), its axes named ``names``.

  A haliax axis named ``None`` is renamed ``<old name>_unsharded`` (a
  haliax axis must have a name; one that no axis mapping lists is
  replicated).
  """
  node = jax.tree.map(lambda _: value, node)  # Each node's own unflatten.
  if names == axis_names(node):
    return node
  if is_flax_box(node):
    return node.replace(names=tuple(names))
  if is_nnx_variable(node):
    key = _nnx_names_key(node.get_metadata()) or "sharding_names"
    # Flax 0.11's Variable.replace, 0.12's Variable.copy (looked up on the
    # class: a Variable forwards unknown attributes to its value).
    copy = node.replace if hasattr(type(node), "replace") else node.copy
    return copy(value, **{key: tuple(names)})
  if is_named_array(node):
    axes = tuple(a if n is not None else type(a)(f"{a.name}_unsharded", a.size)
                 for a, n in zip(node.axes, names))
    return type(node)(node.array, axes)
  raise TypeError(f"not a named node: {type(node).__name__}")
