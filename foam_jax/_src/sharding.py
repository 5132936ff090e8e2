"""Sharded FOAM states: shardings from the params', straddle and HLO checks.

FOAM's folded moments keep their parameter's rank (the fold axis shrinks
from ``n`` to ``n / k``), so every state leaf takes its parameter's
``PartitionSpec`` unchanged. The update is then block-local: with no block
straddling two shards, it needs no communication at all. The default policy
(:func:`foam_jax.default_fold_specs`, fitted by :mod:`foam_jax.specs`)
guarantees that whenever it can see the parameters' shardings:

* eagerly on concrete sharded ``jax.Array`` s (``tx.init(params)``; the
  zeros are allocated sharded, and ``nnx.Optimizer`` does this);
* on ``jax.ShapeDtypeStruct`` s carrying a sharding;
* under ``jax.jit`` with *explicit* mesh axes (``AxisType.Explicit``).

Under ``jax.jit`` with *automatic* mesh axes a tracer carries no sharding,
so a traced ``init`` folds at ``fold_level`` regardless. When that could
straddle shards, pin the choice: ``foam(lr, fold_spec=fitted_fold_specs(
params))``. :func:`state_shardings` raises a clear error in that case. Int8
moments' quantization blocks have the same problem: a traced ``init``
takes blocks that fit every split the mesh allows (raising where no block
of 16 or more does), and :func:`pin_layout` pins folds and blocks fitted to
the actual shardings at once.

Typical use (MaxText-style sharded-state setup in one line)::

  state = jax.jit(tx.init, out_shardings=state_shardings(tx, params))(params)
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from foam_jax._src import memory
from foam_jax._src import specs as specs_lib

__all__ = [
    "Straddle",
    "abstract_state",
    "fitted_fold_specs",
    "pin_layout",
    "state_shardings",
    "straddling_blocks",
]

def fitted_fold_specs(params: Any, fold_level: specs_lib.Level = 2
                      ) -> specs_lib.FoldSpecTree:
  """The default policy's spec tree for these params, fitted to their shardings.

  Pass it as ``fold_spec=`` to pin the choice made on sharded params, so that
  ``init`` and ``update`` traced under ``jax.jit`` with automatic mesh axes
  (where shardings are invisible) fold exactly the same way.

  Args:
    params: sharded ``jax.Array`` s or ``jax.ShapeDtypeStruct`` s with
      shardings.
    fold_level: the level of the default policy.

  Returns:
    A pytree of ``FoldSpec | None`` shaped like ``params``.

  Examples:
    >>> import jax, jax.numpy as jnp, foam_jax
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.sharding.AbstractMesh((8,), ("x",))  # or a real Mesh
    >>> narrow = jax.ShapeDtypeStruct(
    ...     (16, 32), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    >>> foam_jax.sharding.fitted_fold_specs({"w": narrow})["w"]  # 2 rows per shard < block of 4
    FoldSpec(axis=-1, level=2)
  """
  return specs_lib.resolve_fold_specs(params, None, fold_level)


def pin_layout(tx: optax.GradientTransformation, params: Any
               ) -> optax.GradientTransformation:
  """``tx`` whose ``init`` builds the state fitted to these params' shardings.

  Traced under ``jax.jit`` with automatic mesh axes, ``init`` cannot see the
  params' shardings, so it can fit neither the default policy's folds
  (see :func:`fitted_fold_specs`) nor the quantization blocks of int8
  moments (``mu_dtype=jnp.int8``), whose blocks must not straddle shards
  (an int8 ``init`` traced so takes blocks that fit every split the mesh
  allows, often smaller). The returned
  transformation's ``init`` ignores its argument's shardings and builds the
  state from ``params``' shapes, dtypes and shardings, captured here: the
  same state as an eager ``tx.init(params)``, so each block lies in one
  shard and ``update`` needs no collectives. ``update`` is ``tx``'s (it
  reads the layout off the state).

  For transformations whose ``init`` reads only shapes, dtypes and
  shardings (FOAM's, folded Muon's and Lion's, Optax's Adam...). Parameters
  that ``init`` is given as absent (``None``, or ``optax.MaskedNode`` when
  the pinned transformation sits inside ``optax.masked``) stay absent.

  Args:
    tx: the optimizer.
    params: the parameters, sharded ``jax.Array`` s or
      ``jax.ShapeDtypeStruct`` s with shardings.

  Returns:
    The transformation (of ``tx``'s type) with the pinned ``init``.

  Raises:
    ValueError: (from ``init``) its argument's tree, shapes or dtypes differ
      from ``params``'.

  Examples:
    >>> import jax, jax.numpy as jnp, foam_jax
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("x",),
    ...                      axis_types=(jax.sharding.AxisType.Auto,))
    >>> params = {"w": jax.device_put(jnp.ones((8, 1024)),
    ...                               NamedSharding(mesh, P(None, "x")))}
    >>> tx = foam_jax.sharding.pin_layout(foam_jax.foam(1e-3, nu_dtype=jnp.int8), params)
    >>> state = jax.jit(tx.init)(params)
    >>> block = 1024 // state[0].nu.scales["w"].shape[-1]  # entries per scale
    >>> block == min(256, 1024 // jax.device_count())
    True
  """
  pinned = memory.abstract(params)

  def init(given):
    def pick(path, want, got):
      if _is_masked(got) or got is None:
        return got  # Absent in the params init is given (optax.masked): so here.
      if _is_masked(want):
        raise ValueError(
            f"pin_layout: the parameter at {jax.tree_util.keystr(path)} was "
            "masked out when the layout was pinned, and is present now.")
      if tuple(want.shape) != tuple(got.shape) or want.dtype != got.dtype:
        raise ValueError(
            f"pin_layout: the parameter at {jax.tree_util.keystr(path)} is "
            f"{got.dtype}{list(got.shape)}, the pinned one "
            f"{want.dtype}{list(want.shape)}.")
      return want

    try:
      target = jax.tree_util.tree_map_with_path(pick, pinned, given, is_leaf=_is_masked)
    except (ValueError, TypeError) as e:
      if "pin_layout" in str(e):
        raise
      raise ValueError(f"pin_layout: the params' tree differs from the pinned "
                       f"one: {e}") from None
    return tx.init(target)

  return tx._replace(init=init)


class Straddle(NamedTuple):
  """A folded leaf whose blocks would cross a shard boundary."""

  path: str
  axis: int
  block: int
  shard: int


def straddling_blocks(
    params: Any, fold_spec: specs_lib.FoldSpecLike = None,
    fold_level: specs_lib.Level = 2
) -> list[Straddle]:
  """Lists the leaves whose fold blocks would straddle two shards.

  Unlike ``scale_by_foam``, which raises on the first offending explicit
  spec (and silently fits the default policy), this reports every leaf.

  Args:
    params: sharded arrays or ``jax.ShapeDtypeStruct`` s with shardings.
    fold_spec: a spec tree or callable; ``None`` checks the paper's policy
      *before* fitting (:func:`foam_jax.default_fold_specs`), i.e. lists the
      leaves the default policy has to adapt.
    fold_level: level of ``FoldSpec(level=None)`` entries and of ``None``.

  Returns:
    One :class:`Straddle` per offending leaf (empty when none straddle).

  Examples:
    >>> import jax, jax.numpy as jnp, foam_jax
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.sharding.AbstractMesh((8,), ("x",))  # or a real Mesh
    >>> w = jax.ShapeDtypeStruct(
    ...     (16, 32), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    >>> foam_jax.sharding.straddling_blocks({"w": w})
    [Straddle(path="['w']", axis=-2, block=4, shard=2)]
  """
  specs = specs_lib.requested_fold_specs(params, fold_spec, fold_level)
  found = []

  def check(path, spec, leaf):
    if spec is None or leaf is None or isinstance(leaf, optax.MaskedNode):
      return
    if not isinstance(spec, specs_lib.FoldSpec):
      raise TypeError(
          f"fold_spec leaf at {jax.tree_util.keystr(path)} must be a FoldSpec "
          f"or None, got {spec!r}."
      )
    found_here = specs_lib.straddle(
        specs_lib.concrete_spec(spec, fold_level, leaf), leaf)
    if found_here is not None:
      block, shard_n = found_here
      found.append(
          Straddle(jax.tree_util.keystr(path), spec.axis, block, shard_n)
      )

  jax.tree_util.tree_map_with_path(
      check, specs, params, is_leaf=specs_lib.is_spec_leaf
  )
  return found


def _is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def _is_param_leaf(x: Any) -> bool:
  """A state leaf standing for one parameter: masked, or an array."""
  return isinstance(x, optax.MaskedNode)


def _mesh_axes_size(mesh, entry) -> int:
  if entry is None:
    return 1
  names = entry if isinstance(entry, tuple) else (entry,)
  size = 1
  for name in names:
    size *= mesh.shape[name]
  return size


def state_shardings(tx: optax.GradientTransformation, params: Any) -> Any:
  """The shardings of ``tx.init(params)``: each state leaf sharded like its param.

  Works for any Optax transformation whose state holds copies of the params
  tree (FOAM, Adam, chains, ``masked``, ``inject_hyperparams``...): a state
  leaf inside such a copy gets its parameter's ``NamedSharding`` when it has
  the parameter's rank (FOAM's folded moments do), and is replicated
  otherwise; every other leaf (step counts, hyperparameters) is replicated.
  A moment stored in 8 bits (``mu_dtype=jnp.int8``) is a tree of codes and
  a tree of per-block scales, both of the parameter's rank: each takes the
  parameter's sharding.

  Args:
    tx: the optimizer.
    params: the parameters: sharded ``jax.Array`` s or
      ``jax.ShapeDtypeStruct`` s with ``NamedSharding`` s (e.g.
      ``jax.eval_shape`` output given shardings).

  Returns:
    A pytree of ``NamedSharding`` shaped like ``tx.init(params)``, for
    ``jax.jit(tx.init, out_shardings=...)`` or ``jax.device_put``.

  Raises:
    ValueError: no leaf of ``params`` has a ``NamedSharding``; or a state leaf
      cannot take its parameter's sharding because its sharded axes do not
      divide (the fold was chosen without seeing the sharding, see the module
      docstring).

  Examples:
    >>> import jax, jax.numpy as jnp, foam_jax
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("x",))
    >>> params = {"w": jax.device_put(
    ...     jnp.ones((64, 32)), NamedSharding(mesh, P("x", None)))}
    >>> tx = foam_jax.foam(1e-3)
    >>> shardings = foam_jax.sharding.state_shardings(tx, params)
    >>> shardings[0].mu["w"].spec, shardings[0].count.spec
    (P('x', None), P())
    >>> state = jax.jit(tx.init, out_shardings=shardings)(params)
    >>> state[0].mu["w"].shape, state[0].mu["w"].sharding == shardings[0].mu["w"]
    ((16, 32), True)
  """
  abstract = memory.abstract(params)
  named = [
      x.sharding
      for x in jax.tree.leaves(abstract, is_leaf=_is_masked)
      if isinstance(getattr(x, "sharding", None), NamedSharding)
  ]
  if not named:
    raise ValueError(
        "params must carry NamedShardings (sharded jax.Arrays, or "
        "jax.ShapeDtypeStructs with sharding=NamedSharding(...)); none found."
    )
  mesh = named[0].mesh
  replicated = NamedSharding(mesh, PartitionSpec())
  param_shardings = jax.tree.map(
      lambda x: x.sharding
      if isinstance(getattr(x, "sharding", None), NamedSharding)
      else replicated,
      abstract,
      is_leaf=_is_masked,
  )
  params_def = jax.tree.structure(abstract, is_leaf=_is_masked)
  state = jax.eval_shape(tx.init, abstract)

  def is_params_copy(x):
    if isinstance(x, jax.ShapeDtypeStruct) and params_def.num_nodes != 1:
      return False
    try:
      return jax.tree.structure(x, is_leaf=_is_param_leaf) == params_def
    except Exception:  # pylint: disable=broad-except
      return False

  def for_leaf(path, sharding, param, leaf):
    if isinstance(leaf, optax.MaskedNode):
      return leaf
    if len(leaf.shape) != len(param.shape):
      return replicated
    for dim, entry in zip(leaf.shape, tuple(sharding.spec)):
      parts = _mesh_axes_size(sharding.mesh, entry)
      if dim % parts:
        raise ValueError(
            f"The optimizer state leaf for the parameter at "
            f"{jax.tree_util.keystr(path)} has shape {tuple(leaf.shape)}, "
            f"which its parameter's sharding {sharding.spec} (shape "
            f"{tuple(param.shape)}) cannot split: its fold (or its int8 "
            "quantization block) was chosen without seeing the sharding "
            "(automatic mesh axes under tracing). Pass "
            "fold_spec=foam_jax.sharding.fitted_fold_specs(params) to the "
            "optimizer, pin the layout with "
            "foam_jax.sharding.pin_layout(tx, params), or use explicit mesh axes."
        )
    return sharding

  def for_subtree(x):
    if is_params_copy(x):
      return jax.tree_util.tree_map_with_path(
          for_leaf, param_shardings, abstract, x, is_leaf=_is_param_leaf
      )
    return jax.tree.map(lambda _: replicated, x)

  return jax.tree.map(for_subtree, state, is_leaf=is_params_copy)


def abstract_state(tx: optax.GradientTransformation, params: Any) -> Any:
  """``jax.ShapeDtypeStruct`` s of ``tx.init(params)``, with their shardings.

  The restore target for a checkpointed optimizer state (e.g. Orbax's
  ``StandardCheckpointer.restore(path, target)``), on whatever mesh
  ``params`` are sharded over; see :func:`state_shardings`.

  Args:
    tx: the optimizer.
    params: sharded arrays or ``jax.ShapeDtypeStruct`` s with shardings.

  Returns:
    A pytree of ``jax.ShapeDtypeStruct`` shaped like ``tx.init(params)``.

  Examples:
    >>> import jax, jax.numpy as jnp, foam_jax
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("x",))
    >>> params = {"w": jax.ShapeDtypeStruct(
    ...     (64, 32), jnp.float32, sharding=NamedSharding(mesh, P("x")))}
    >>> target = foam_jax.sharding.abstract_state(foam_jax.foam(1e-3), params)
    >>> target[0].mu["w"].shape, target[0].mu["w"].sharding.spec
    ((16, 32), P('x',))
  """
  abstract = memory.abstract(params)
  shapes = jax.eval_shape(tx.init, abstract)
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      shapes,
      state_shardings(tx, abstract),
  )
