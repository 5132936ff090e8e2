"""Where a leaf lives: the one place that reads a parameter's sharding.

Folded states keep their parameter's rank, so a parameter's sharding applies
to its moments unchanged. Three questions need the sharding: which level the
default policy may fold at (:func:`shard_shape`), where ``init`` allocates a
moment (:func:`zeros_like_placed`), and where the step count lives
(:func:`count_zeros`). All three read it through :func:`known_sharding`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec


def known_sharding(leaf: Any) -> jax.sharding.Sharding | None:
  """The sharding ``leaf`` is known to have, or ``None``.

  * A concrete ``jax.Array``: its sharding if it is *committed* (placed with
    ``device_put``, or the output of a sharded computation). An uncommitted
    array (fresh from ``jnp.ones``) gives ``None``, so that states made for
    it stay uncommitted like ``jnp.zeros_like`` would make them, and a
    jitted step does not recompile on its second call.
  * A ``jax.ShapeDtypeStruct``: its ``sharding`` (``None`` when absent).
  * A tracer: its abstract value's ``NamedSharding`` under explicit mesh
    axes; ``None`` under automatic axes, where it is not known while tracing.

  Examples:
    >>> import jax.numpy as jnp
    >>> known_sharding(jnp.ones(3)) is None   # uncommitted
    True
  """
  if isinstance(leaf, jax.core.Tracer):
    try:
      sharding = jax.typeof(leaf).sharding
    except Exception:  # pylint: disable=broad-except
      return None
    explicit = isinstance(sharding, NamedSharding) and bool(
        getattr(sharding.mesh, "explicit_axes", None))
    return sharding if explicit else None
  if isinstance(leaf, jax.Array):
    return leaf.sharding if leaf.committed else None
  return getattr(leaf, "sharding", None)


def hidden_mesh_shape(leaf: Any) -> dict[str, int] | None:
  """The mesh a tracer lives on when its own sharding is not visible.

  Under ``jax.jit`` with *automatic* mesh axes a tracer's abstract value
  names its mesh but not its partition spec: then the mesh's axis sizes
  (only axes of size > 1); otherwise (a concrete array, a visible sharding,
  no mesh) ``None``.

  Examples:
    >>> import jax.numpy as jnp
    >>> hidden_mesh_shape(jnp.ones(3)) is None
    True
  """
  if not isinstance(leaf, jax.core.Tracer) or known_sharding(leaf) is not None:
    return None
  try:
    mesh = jax.typeof(leaf).sharding.mesh
    sizes = {name: int(size) for name, size in mesh.shape.items() if size > 1}
  except Exception:  # pylint: disable=broad-except
    return None
  return sizes or None


def shard_shape(leaf: Any) -> tuple[int, ...] | None:
  """The per-device shape of ``leaf``, or ``None`` if its sharding is unknown.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.sharding.AbstractMesh((8,), ("x",))
    >>> shard_shape(jax.ShapeDtypeStruct(
    ...     (16, 4), jnp.float32, sharding=NamedSharding(mesh, P("x"))))
    (2, 4)
  """
  sharding = known_sharding(leaf)
  if sharding is None:
    return None
  try:
    return tuple(sharding.shard_shape(tuple(leaf.shape)))
  except Exception:  # pylint: disable=broad-except
    return None


def zeros_like_placed(shape, dtype, leaf: Any) -> jax.Array:
  """Zeros of ``shape`` placed like ``leaf`` (same rank, shape may differ).

  ``jnp.zeros_like(leaf, shape=...)`` drops a non-replicated sharding when
  the shape changes; a folded moment must keep it.
  """
  sharding = known_sharding(leaf)
  if sharding is None or not _placeable(sharding):
    return jnp.zeros(shape, dtype)
  if isinstance(leaf, jax.core.Tracer) and isinstance(sharding, NamedSharding):
    return _traced_zeros(shape, dtype, sharding)
  return jnp.zeros(shape, dtype, device=sharding)


def _traced_zeros(shape, dtype, sharding: NamedSharding) -> jax.Array:
  """Zeros with an explicit-axes ``sharding`` while tracing (``jit``, ``eval_shape``).

  ``jax.sharding.reshard`` keeps the sharding outside a mesh context, where
  ``jnp.zeros(..., out_sharding=...)`` drops it on jax 0.12 (so
  ``jax.eval_shape(tx.init, abstract_params)`` would lose the layout).
  """
  return jax.sharding.reshard(jnp.zeros(shape, dtype), sharding)


def _placeable(sharding: Any) -> bool:
  """Whether arrays can be created with ``sharding``.

  A sharding on an abstract mesh with automatic axes (a layout described for
  a traced ``init``, e.g. by an axis-name mapping) only informs the layout:
  the caller's ``jit`` places the state.
  """
  mesh = getattr(sharding, "mesh", None)
  if not isinstance(mesh, jax.sharding.AbstractMesh):
    return True
  return all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


def replicated_zeros(shape, dtype, params: Any) -> jax.Array:
  """Zeros of ``shape`` replicated over the params' placement (see below)."""
  for leaf in jax.tree.leaves(params):
    sharding = known_sharding(leaf)
    if sharding is None or not _placeable(sharding):
      continue
    if isinstance(sharding, NamedSharding):
      sharding = NamedSharding(sharding.mesh, PartitionSpec())
    if isinstance(leaf, jax.core.Tracer) and isinstance(sharding, NamedSharding):
      return _traced_zeros(shape, dtype, sharding)
    return jnp.zeros(shape, dtype, device=sharding)
  return jnp.zeros(shape, dtype)


def count_zeros(params: Any) -> jax.Array:
  """A zero ``int32`` step count placed with the params.

  Replicated over the params' mesh when they are sharded, on their device
  when they are committed to one, and uncommitted when they are: then a
  jitted step's outputs are placed as its inputs and its second call does not
  recompile (``optax.adamw``'s uncommitted count recompiles once for
  committed params).
  """
  return replicated_zeros([], jnp.int32, params)
