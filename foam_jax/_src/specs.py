"""Which leaves FOAM folds, along which axis, at which level.

A :class:`FoldSpec` says how one parameter's moments are folded; ``None``
says the parameter gets plain Adam moments. ``scale_by_foam(fold_spec=...)``
takes:

* ``None``: the default policy (:func:`default_fold_specs`), the paper's:
  fold every leaf with ``ndim >= 2`` along axis ``-2`` (a Flax ``Dense``
  kernel's input axis) at ``fold_level``, except leaves whose tree path
  contains ``embed`` or ``lm_head`` (case-insensitive), which keep Adam's
  moments like every leaf with ``ndim < 2``.
* a pytree shaped like the params whose leaves are ``FoldSpec`` or ``None``
  (an entry at an absent parameter, ``None`` or ``optax.MaskedNode`` in the
  params, is ignored: the parameter has no moments);
* a callable ``params -> such a pytree`` (Optax's ``mask`` convention).

When a parameter is sharded along its fold axis, a block must not straddle
two shards (else the update needs communication): with the axis split ``s``
ways, ``(n / s) % k == 0`` must hold. The default policy reads the
parameter's sharding when it is known (concrete ``jax.Array``s,
``jax.ShapeDtypeStruct`` s with a sharding, tracers under explicit mesh axes)
and lowers the level to the largest that fits, or folds the last axis instead
when that keeps a higher level. Explicit ``FoldSpec``s are never changed: one
that straddles shards raises ``ValueError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax

from foam_jax._src import folding
from foam_jax._src.placement import shard_shape

__all__ = [
    "FoldSpec",
    "Level",
    "concrete_spec",
    "int_level",
    "FoldSpecTree",
    "default_fold_specs",
    "requested_fold_specs",
    "resolve_fold_specs",
    "is_spec_leaf",
    "straddle",
]

# A fold level: blocks of 2**level entries, or "whole_axis" (one block).
Level = int | str

# Name fragments (lower case) of leaves the default policy leaves unfolded.
UNFOLDED_NAME_FRAGMENTS = ("embed", "lm_head")


@dataclasses.dataclass(frozen=True)
class FoldSpec:
  """How to fold one parameter's Adam moments.

  Attributes:
    axis: the axis averaged in blocks. ``-2`` is the input-feature axis of a
      Flax ``Dense`` kernel ``(in, out)`` and of scan-stacked kernels
      ``(layers, in, out)``, the axis the paper folds.
    level: blocks hold ``2**level`` entries, so the state along ``axis`` is
      ``2**level`` times smaller. ``0`` is plain Adam (times ``alpha``);
      a level whose block exceeds the axis folds it into a single block.
      ``"whole_axis"`` folds the whole axis into one block, whatever its
      length (FOAM-Mini). ``None`` (the default) takes the transform's
      ``fold_level``.

  Examples:
    >>> import jax.numpy as jnp, foam_jax
    >>> params = {"w": jnp.zeros((64, 8)), "b": jnp.zeros((8,))}
    >>> specs = {"w": foam_jax.FoldSpec(axis=-1, level=3), "b": None}
    >>> tx = foam_jax.scale_by_foam(fold_spec=specs)
    >>> tx.init(params).mu["w"].shape
    (64, 1)
    >>> specs = {"w": foam_jax.FoldSpec(axis=-2, level="whole_axis"), "b": None}
    >>> foam_jax.scale_by_foam(fold_spec=specs).init(params).mu["w"].shape
    (1, 8)
  """

  axis: int = -2
  level: Level | None = None

  def __post_init__(self):
    if isinstance(self.axis, bool) or not isinstance(self.axis, int):
      raise TypeError(f"FoldSpec.axis must be an int, got {self.axis!r}.")
    if isinstance(self.level, str):
      if self.level != folding.WHOLE_AXIS:
        raise ValueError(
            f"FoldSpec.level must be an int, {folding.WHOLE_AXIS!r} or None, "
            f"got {self.level!r}.")
      return
    if self.level is not None and (
        isinstance(self.level, bool) or not isinstance(self.level, int)
    ):
      raise TypeError(
          f"FoldSpec.level must be an int, {folding.WHOLE_AXIS!r} or None, "
          f"got {self.level!r}."
      )
    if self.level is not None and self.level < 0:
      raise ValueError(f"FoldSpec.level must be >= 0, got {self.level}.")


FoldSpecTree = Any  # A pytree of `FoldSpec | None` shaped like the params.
FoldSpecLike = None | FoldSpecTree | Callable[[Any], FoldSpecTree]


def is_spec_leaf(x: Any) -> bool:
  """True for the leaves of a spec tree: a ``FoldSpec`` or ``None``."""
  return x is None or isinstance(x, FoldSpec)


def _path_str(path) -> str:
  return jax.tree_util.keystr(path) or "<root>"


def _level_fits(n: int, shard_n: int, level: int) -> bool:
  """A block of ``level`` lies inside one shard of an axis cut to ``shard_n``."""
  if shard_n >= n:  # Not sharded along this axis.
    return True
  return shard_n % folding.block_size(n, level) == 0


def _largest_fitting_level(n: int, shard_n: int, level: int) -> int:
  while level > 0 and not _level_fits(n, shard_n, level):
    level -= 1
  return level


def concrete_spec(spec: FoldSpec, fold_level: Level, leaf: Any) -> FoldSpec:
  """``spec`` with an integer level for ``leaf``.

  ``level=None`` takes ``fold_level``; ``"whole_axis"`` becomes the smallest
  level whose block covers ``leaf``'s fold axis.

  Examples:
    >>> import jax.numpy as jnp
    >>> concrete_spec(FoldSpec(axis=0, level="whole_axis"), 2, jnp.zeros((100, 3)))
    FoldSpec(axis=0, level=7)
  """
  level = fold_level if spec.level is None else spec.level
  if level == folding.WHOLE_AXIS:
    level = folding.whole_axis_level(leaf.shape[spec.axis])
  return dataclasses.replace(spec, level=level)


def _fit_default_spec(spec: FoldSpec, level: Level, leaf: Any) -> FoldSpec:
  """``spec`` at ``level``, lowered or moved to axis -1 so blocks stay inside shards.

  Of the requested axis and the last one, the axis whose level must be
  lowered least wins (the requested one on a tie); ``level`` is an int or
  ``"whole_axis"`` (resolved per axis).
  """
  local = shard_shape(leaf)
  if local is None:
    return concrete_spec(spec, level, leaf)
  shape = tuple(leaf.shape)
  candidates = []  # (how far the level is lowered, spec); the requested axis first.
  for axis in dict.fromkeys((spec.axis % len(shape), len(shape) - 1)):
    wanted = level if isinstance(level, int) else folding.whole_axis_level(shape[axis])
    fitted = _largest_fitting_level(shape[axis], local[axis], wanted)
    candidates.append((wanted - fitted, FoldSpec(axis=axis - len(shape), level=fitted)))
  return min(candidates, key=lambda c: c[0])[1]


def int_level(spec: FoldSpec) -> int:
  """``spec``'s level, which must be concrete (:func:`concrete_spec`)."""
  if not isinstance(spec.level, int):
    raise ValueError(f"{spec} has no concrete level; resolve it with concrete_spec.")
  return spec.level


def straddle(spec: FoldSpec, leaf: Any) -> tuple[int, int] | None:
  """``(block, shard)`` sizes if ``spec``'s blocks would cross shards of ``leaf``.

  ``None`` when every block lies inside one shard or the sharding is unknown.
  ``spec.level`` must be resolved (not ``None``).
  """
  local = shard_shape(leaf)
  if local is None:
    return None
  axis = spec.axis % leaf.ndim
  n, shard_n = leaf.shape[axis], local[axis]
  if _level_fits(n, shard_n, int_level(spec)):
    return None
  return folding.block_size(n, int_level(spec)), shard_n


def _check_explicit_spec(spec: FoldSpec, leaf: Any, path) -> None:
  found = straddle(spec, leaf)
  if found is not None:
    block, shard_n = found
    raise ValueError(
        f"FoldSpec(axis={spec.axis}, level={spec.level}) for the parameter at "
        f"{_path_str(path)} (shape {tuple(leaf.shape)}) would put a block of "
        f"{block} entries across two shards: axis "
        f"{spec.axis} is sharded into pieces of {shard_n}. Use a level whose "
        f"block divides {shard_n}, another axis, or fold_spec=None to let the "
        "default policy choose."
    )


def default_fold_specs(params: Any, fold_level: Level = 2) -> FoldSpecTree:
  """The paper's policy: which leaves to fold, as a spec tree.

  Leaves with ``ndim >= 2`` get ``FoldSpec(axis=-2, level=fold_level)``,
  except those whose tree path contains ``embed`` or ``lm_head``
  (case-insensitive); those and every leaf with ``ndim < 2`` get ``None``
  (plain Adam). The result has ``None`` where Adam is used, so it is a valid
  ``fold_spec`` argument to start an override from.

  Args:
    params: the parameter pytree (arrays or ``jax.ShapeDtypeStruct`` s).
    fold_level: the level of the folded leaves.

  Returns:
    A pytree of ``FoldSpec | None`` shaped like ``params``.

  Examples:
    >>> import jax.numpy as jnp, foam_jax
    >>> params = {"embed_tokens": jnp.zeros((256, 64)),
    ...           "mlp": {"kernel": jnp.zeros((64, 128)),
    ...                   "bias": jnp.zeros((128,))}}
    >>> specs = foam_jax.default_fold_specs(params)
    >>> specs["embed_tokens"], specs["mlp"]["bias"], specs["mlp"]["kernel"]
    (None, None, FoldSpec(axis=-2, level=2))
  """

  def choose(path, leaf):
    if getattr(leaf, "ndim", 0) < 2:
      return None
    name = _path_str(path).lower()
    if any(fragment in name for fragment in UNFOLDED_NAME_FRAGMENTS):
      return None
    return FoldSpec(axis=-2, level=fold_level)

  return jax.tree_util.tree_map_with_path(choose, params)


def requested_fold_specs(
    params: Any, fold_spec: FoldSpecLike, fold_level: Level
) -> FoldSpecTree:
  """The spec tree a ``fold_spec`` argument asks for, before any checks.

  ``None`` gives :func:`default_fold_specs` (not yet fitted to shardings), a
  callable is called on ``params``, and a tree is returned as it is.
  """
  if fold_spec is None:
    return default_fold_specs(params, fold_level)
  if callable(fold_spec) and not isinstance(fold_spec, FoldSpec):
    return fold_spec(params)
  return fold_spec


def resolve_fold_specs(
    params: Any, fold_spec: FoldSpecLike, fold_level: Level
) -> FoldSpecTree:
  """Turns a ``fold_spec`` argument into a checked spec tree for ``params``.

  ``level=None`` entries get ``fold_level``. For the default policy the
  level is adapted to each parameter's sharding when that is known (see the
  module docstring); explicit specs are checked against it instead.

  Args:
    params: the parameter (or gradient) pytree.
    fold_spec: ``None``, a spec pytree, or a callable returning one.
    fold_level: the level for the default policy and ``level=None`` specs.

  Returns:
    A pytree of ``FoldSpec | None`` with the structure of ``params``.

  Raises:
    ValueError: the spec tree does not match ``params``; an axis is out of
      range for its leaf; a spec sits on a scalar; a spec straddles shards.
    TypeError: a spec tree leaf is neither ``FoldSpec`` nor ``None``.
  """
  is_default = fold_spec is None
  specs = requested_fold_specs(params, fold_spec, fold_level)
  params_is_leaf = jax.tree_util.treedef_is_leaf(jax.tree.structure(params))
  if isinstance(specs, FoldSpec) and not params_is_leaf:
    raise TypeError(
        "fold_spec must be a pytree of FoldSpec | None shaped like the params "
        "(or a callable returning one), not a single FoldSpec; use "
        "`lambda params: jax.tree.map(lambda _: FoldSpec(...), params)` to "
        "apply one spec to every leaf."
    )

  def check(path, spec, leaf):
    if leaf is None or isinstance(leaf, optax.MaskedNode):
      return None  # An absent parameter: its spec entry is ignored.
    if not is_spec_leaf(spec):
      raise TypeError(
          f"fold_spec leaf at {_path_str(path)} must be a FoldSpec or None, "
          f"got {spec!r}."
      )
    if spec is None:
      return None
    ndim = leaf.ndim
    if ndim == 0:
      raise ValueError(
          f"fold_spec puts {spec} on the scalar parameter at {_path_str(path)};"
          " scalars cannot be folded (use None)."
      )
    if not -ndim <= spec.axis < ndim:
      raise ValueError(
          f"fold_spec axis {spec.axis} is out of range for the parameter at "
          f"{_path_str(path)} with shape {tuple(leaf.shape)}."
      )
    if is_default:
      return _fit_default_spec(spec, fold_level if spec.level is None else spec.level, leaf)
    spec = concrete_spec(spec, fold_level, leaf)
    _check_explicit_spec(spec, leaf, path)
    return spec

  try:
    jax.tree.map(lambda *_: None, specs, params, is_leaf=is_spec_leaf)
  except (ValueError, TypeError) as e:
    raise ValueError(
        "fold_spec does not match the params tree: it must have the params' "
        f"structure with a FoldSpec or None per leaf. JAX said: {e}"
    ) from None
  return jax.tree_util.tree_map_with_path(
      check, specs, params, is_leaf=is_spec_leaf
  )
