r"""Where FOAM's TPU kernels run: which leaves, which shards, which platform.

:func:`foam_jax.scale_by_foam` and :func:`foam_jax.scale_by_folded_lion`
give their XLA path and their kernel to :func:`folded_update`: on TPU (chosen
when the program is lowered, ``jax.lax.platform_dependent``) the leaves that
:func:`~foam_jax._src.tpu_folded.covers` covers (float moments, a fold along
axis -2 or -1) take the kernel (:func:`split_update`); every other leaf, and
every other platform, takes the XLA path. :func:`per_shard` runs a
kernel where it needs no communication: on one device, or per shard where
the sharding is in the types (Explicit mesh axes).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax

from foam_jax._src import folding
from foam_jax._src import moment
from foam_jax._src import quantized_state
from foam_jax._src.tpu_folded import covers

__all__ = ["folded_update", "per_shard", "covered_folds", "split_update", "interpret",
           "interpreting"]

Fold = tuple[int, int]  # (axis, level) of a leaf a kernel covers.


def _mesh_names(entry: Any) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _fitted_spec(mesh, spec, shape: tuple[int, ...], fold: Fold) -> jax.sharding.PartitionSpec:
  """``spec`` without the axes the kernel cannot split.

  The fold needs whole blocks in each shard (shard lengths that ``k``
  divides), and each shard must be a shape :func:`covers` covers.
  """
  axis, level = fold[0] % len(shape), fold[1]
  entries = list(tuple(spec)) + [None] * (len(shape) - len(tuple(spec)))
  shards = lambda e: math.prod(mesh.shape[n] for n in _mesh_names(e))  # noqa: E731
  if shape[axis] % (folding.block_size(shape[axis], level) * shards(entries[axis])):
    entries[axis] = None
  for other in (-1, -2):  # A shard the kernel would not cover: gathered.
    if not covers(_local_shape(shape, entries, shards), axis, level, jnp.float32):
      entries[other] = None
  return jax.sharding.PartitionSpec(*entries)


def _local_shape(shape, entries, shards) -> tuple[int, ...]:
  return tuple(d // shards(e) for d, e in zip(shape, entries))


def _mesh(x: Any):
  """The mesh in ``x``'s type (``jax.typeof``), or ``None``."""
  mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
  return mesh if mesh is not None and tuple(getattr(mesh, "axis_names", None) or ()) else None


def _spec(x: Any) -> jax.sharding.PartitionSpec:
  given = tuple(jax.typeof(x).sharding.spec)
  return jax.sharding.PartitionSpec(*given, *(None,) * (x.ndim - len(given)))


def per_shard(local, g: jax.Array, stored: tuple[jax.Array, ...], coefs: jax.Array, *,
              fold: Fold, fallback) -> tuple[jax.Array, ...]:
  """``local`` (a kernel) where it runs without communication, else ``fallback``.

  * On one device: the kernel.
  * On a mesh whose axes are all Explicit (the sharding is in the types):
    each device runs the kernel on its shard (``jax.shard_map``), where the
    moments are sharded as the gradient, every shard holds whole fold
    blocks and is a shape :func:`~foam_jax._src.tpu_folded.covers` covers.
  * Otherwise ``fallback``, the XLA path: on a mesh with Auto axes the
    sharding is not known when the update is traced, and XLA partitions a
    kernel by gathering its operands (``custom_partitioning``, which could
    place it per shard, does not reach libtpu's partitioner in jax 0.10).

  Args:
    local: ``(coefs, g, *stored) -> (u, *new)``, the kernel on one leaf.
    g: the gradient.
    stored: its stored folded moments.
    coefs: the kernel's scalars.
    fold: the leaf's ``(axis, level)``.
    fallback: ``(g, *stored) -> (u, *new)``, the XLA path for one leaf.

  Returns:
    ``(u, *new_moments)``.
  """
  mesh = _mesh(g)
  if mesh is None or mesh.size == 1:
    return local(coefs, g, *stored)
  if any(t != jax.sharding.AxisType.Explicit for t in mesh.axis_types):
    return fallback(g, *stored)
  spec = _spec(g)
  if (_fitted_spec(mesh, spec, tuple(g.shape), fold) != spec
      or any(_spec(m) != spec for m in stored)):
    return fallback(g, *stored)
  count = 1 + len(stored)
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(jax.sharding.PartitionSpec(),) + (spec,) * count,
                       out_specs=(spec,) * count, check_vma=False)(coefs, g, *stored)


_INTERPRET = [False]


@contextlib.contextmanager
def interpret() -> Iterator[None]:
  """Within it, :func:`foam_jax.scale_by_foam` runs the kernel on every platform.

  In Pallas's interpreter, for the leaves :func:`plan` covers: how the
  tests check the TPU path's numerics on CPU. Read when ``update`` is
  traced; entering and leaving clear JAX's caches (``jax.clear_caches``), so
  that a function jitted on either side traces again rather than reusing
  the other path's program.

  Examples:
    >>> import jax.numpy as jnp, foam_jax
    >>> tx = foam_jax.scale_by_foam()
    >>> params = {"w": jnp.ones((64, 128))}
    >>> with interpret():
    ...   u, _ = tx.update(params, tx.init(params))
  """
  jax.clear_caches()
  _INTERPRET.append(True)
  try:
    yield
  finally:
    _INTERPRET.pop()
    jax.clear_caches()


def interpreting() -> bool:
  """Whether :func:`interpret` is in effect."""
  return _INTERPRET[-1]


def _absent(x: Any) -> bool:
  return x is None or isinstance(x, optax.MaskedNode)


def _flat(tree: Any):
  return jax.tree.flatten(tree, is_leaf=_absent)


def covered_folds(grads: Any, *stored: Any) -> list[Fold | None] | None:
  """Each gradient leaf's ``(axis, level)`` where a kernel covers it, else ``None``.

  Leaves are in ``jax.tree.flatten`` order with absent parameters (``None``,
  ``optax.MaskedNode``) as leaves. ``None`` where no leaf is covered, and
  for 8-bit moments (the XLA path's).
  """
  if any(isinstance(m, quantized_state.QuantizedMoments) for m in stored):
    return None
  g_leaves = _flat(grads)[0]
  moment_leaves = [_flat(m)[0] for m in stored]
  if any(len(m) != len(g_leaves) for m in moment_leaves):
    return None  # The XLA path says what does not fit.
  folds = [_leaf_fold(g, *ms) for g, *ms in zip(g_leaves, *moment_leaves)]
  return folds if any(folds) else None


def _leaf_fold(g: Any, *stored: Any) -> Fold | None:
  if _absent(g) or not all(hasattr(x, "shape") and hasattr(x, "dtype") for x in (g, *stored)):
    return None
  floats = (jnp.float16, jnp.bfloat16, jnp.float32)
  if any(m.shape != stored[0].shape or jnp.dtype(m.dtype) not in floats for m in stored):
    return None
  try:
    geom = moment.geometry(None, tuple(g.shape), tuple(stored[0].shape))
  except ValueError:
    return None  # The XLA path says what does not fit.
  if geom is None or not covers(tuple(g.shape), geom.axis, geom.level, g.dtype):
    return None
  return geom.axis, geom.level


def split_update(xla_update, kernel, folds: list[Fold | None], grads: Any, *stored: Any):
  """``xla_update`` on the leaves no kernel covers, ``kernel`` on the rest.

  Args:
    xla_update: ``(grads, *stored) -> (updates, *new)``, the XLA path.
    kernel: ``(g, *stored, fold) -> (u, *new)`` for one covered leaf.
    folds: :func:`covered_folds`.
    grads: the gradients.
    stored: the stored moments (trees like the gradients).

  Returns:
    ``(updates, *new)`` as ``xla_update`` returns them.
  """
  g_leaves, g_def = _flat(grads)
  flat_stored = [_flat(m) for m in stored]

  def hide(leaves):  # Covered leaves become absent for the XLA path.
    return [optax.MaskedNode() if fold else x for fold, x in zip(folds, leaves)]

  outs = xla_update(g_def.unflatten(hide(g_leaves)),
                    *(treedef.unflatten(hide(leaves)) for leaves, treedef in flat_stored))
  flat_outs = [_flat(o) for o in outs]
  for i, fold in enumerate(folds):
    if fold:
      news = kernel(g_leaves[i], *(leaves[i] for leaves, _ in flat_stored), fold)
      for (leaves, _), new in zip(flat_outs, news):
        leaves[i] = new
  return tuple(treedef.unflatten(leaves) for leaves, treedef in flat_outs)


def folded_update(xla_update: Callable[..., tuple], kernel: Callable[..., tuple],
                  coefficients: Callable[[], jax.Array], updates: Any, *stored: Any) -> tuple:
  """A folded optimizer's update: its XLA path, and on TPU its kernel where one covers a leaf.

  The kernel is chosen when the program is lowered
  (``jax.lax.platform_dependent``) for the leaves :func:`covered_folds`
  finds; on every other platform, for every other leaf, and where a
  sharding keeps a kernel from running per shard (:func:`per_shard`), the
  XLA path runs.

  Args:
    xla_update: ``(updates, *stored, specs=...) -> (updates, *new)``, the
      XLA path over a tree (``specs`` defaulting to the transform's).
    kernel: ``(g, *stored, coefs, *, axis, level, interpret) -> (u, *new)``,
      the kernel on one leaf.
    coefficients: ``() -> coefs``, the kernel's scalars (made only where a
      leaf is covered).
    updates: the gradients.
    stored: the stored folded moments (trees like the gradients).

  Returns:
    ``(updates, *new)`` as ``xla_update`` returns them.
  """
  folds = covered_folds(updates, *stored)
  if folds is None:
    return xla_update(updates, *stored)
  coefs = coefficients()

  def xla_leaf(g, *moments):  # One leaf alone; its fold is read from its state.
    outs = xla_update({"x": g}, *({"x": m} for m in moments), specs={"x": None})
    return tuple(out["x"] for out in outs)

  def tpu_update(*args, interpret=False):
    def leaf_kernel(g, *moments_and_fold):
      *moments, fold = moments_and_fold

      def local(coefs, g, *moments):
        return kernel(g, *moments, coefs, axis=fold[0], level=fold[1], interpret=interpret)

      return per_shard(local, g, tuple(moments), coefs, fold=fold, fallback=xla_leaf)

    return split_update(xla_update, leaf_kernel, folds, *args)

  args = (updates, *stored)
  if interpreting():
    return tpu_update(*args, interpret=True)
  return jax.lax.platform_dependent(*args, tpu=tpu_update, default=xla_update)
