"""Which leaves FOAM folds, along which axis, at which level.

A :class:`FoldSpec` says how one parameter's moments are folded; ``None``
says the parameter gets plain Adam moments. ``scale_by_foam(fold_spec=...)``
takes:

* ``None``: the default policy (:func:`default_fold_specs`, described in
  :class:`FoldPolicy`): fold every weight matrix along its input-feature
  axis at ``fold_level``, reading axis names and module types where the
  tree has them; embeddings, output heads, vectors and stacked per-layer
  vectors keep Adam's moments.
* a :class:`FoldPolicy`: the default policy with other layer-axis names or
  path rules;
* a pytree shaped like the params whose leaves are ``FoldSpec`` or ``None``
  (an entry at an absent parameter, ``None`` or ``optax.MaskedNode`` in the
  params, is ignored: the parameter has no moments);
* a callable ``params -> such a pytree`` (Optax's ``mask`` convention).

When a parameter is sharded along its fold axis, a block must not straddle
two shards (else the update needs communication): with the axis split ``s``
ways, ``(n / s) % k == 0`` must hold. The default policy reads the
parameter's sharding when it is known (concrete ``jax.Array``s,
``jax.ShapeDtypeStruct`` s with a sharding, tracers under explicit mesh axes)
and moves the fold to another of the parameter's candidate axes or lowers the
level, whichever keeps the highest level (the preferred axis on a tie); a
parameter that no axis lets fold at level 1 or more keeps Adam's moments.
Explicit ``FoldSpec``s are never changed: one that straddles shards raises
``ValueError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax

from foam_jax._src import folding
from foam_jax._src.fold_policy import fold_axes
from foam_jax._src.fold_policy import FoldPolicy
from foam_jax._src.placement import shard_shape

__all__ = [
    "FoldPolicy",
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
FoldSpecLike = None | FoldPolicy | FoldSpecTree | Callable[[Any], FoldSpecTree]


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


def _fit_default_spec(axes: tuple[int, ...], level: Level, leaf: Any) -> FoldSpec | None:
  """The default policy's spec for ``leaf``: blocks inside shards.

  ``axes`` are the candidate fold axes, preferred first. Without a known
  sharding the first folds at ``level``. Otherwise the axis whose level must
  be lowered least wins (the earlier on a tie); if every axis would have to
  drop to level 0, the parameter keeps Adam's moments (``None``). ``level``
  is an int or ``"whole_axis"`` (resolved per axis).
  """
  local = shard_shape(leaf)
  shape = tuple(leaf.shape)
  if local is None:
    return concrete_spec(FoldSpec(axis=axes[0]), level, leaf)
  candidates = []  # (how far the level is lowered, spec), preferred first.
  for axis in axes:
    axis %= len(shape)
    wanted = level if isinstance(level, int) else folding.whole_axis_level(shape[axis])
    fitted = _largest_fitting_level(shape[axis], local[axis], wanted)
    candidates.append((wanted - fitted, fitted, FoldSpec(axis=axis - len(shape), level=fitted)))
  lowered, fitted, spec = min(candidates, key=lambda c: c[0])
  return None if fitted == 0 and lowered > 0 else spec


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


def _policy_axes(params: Any, fold_level: Level, policy: FoldPolicy | None) -> Any:
  """The default policy's candidate axes per leaf (a tuple or ``None``), as a tree."""
  axes = fold_axes(params, policy or FoldPolicy(), fold_level)
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params),
                                      [_Axes(a.candidates) if a else None for a in axes])


@dataclasses.dataclass(frozen=True)
class _Axes:
  """A leaf's candidate fold axes (a tuple is a pytree; this is a leaf)."""

  axes: tuple[int, ...]


def default_fold_specs(params: Any, fold_level: Level = 2,
                       policy: FoldPolicy | None = None) -> FoldSpecTree:
  """The default policy's spec tree for ``params`` (before any sharding fit).

  Each weight matrix folds along its input-feature axis at ``fold_level``;
  embeddings, output heads, vectors and stacked per-layer vectors get
  ``None`` (Adam). How the axis is found in each stack (tree paths, module
  types, axis names, shapes) is :class:`FoldPolicy`'s description. The
  result is a valid ``fold_spec`` argument to start an override from.

  Args:
    params: the parameter pytree (arrays or ``jax.ShapeDtypeStruct`` s),
      possibly holding Flax boxes, NNX Variables, Equinox or haliax modules.
    fold_level: the level of the folded leaves.
    policy: the policy's options; ``None`` for :class:`FoldPolicy` ``()``.

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
  axes = _policy_axes(params, fold_level, policy)
  return jax.tree.map(lambda a: None if a is None else FoldSpec(axis=a.axes[0], level=fold_level),
                      axes, is_leaf=lambda x: x is None or isinstance(x, _Axes))


def requested_fold_specs(
    params: Any, fold_spec: FoldSpecLike, fold_level: Level
) -> FoldSpecTree:
  """The spec tree a ``fold_spec`` argument asks for, before any checks.

  ``None`` or a :class:`FoldPolicy` gives :func:`default_fold_specs` (not
  yet fitted to shardings), a callable is called on ``params``, and a tree
  is returned as it is.
  """
  if fold_spec is None or isinstance(fold_spec, FoldPolicy):
    return default_fold_specs(params, fold_level, fold_spec)
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
  is_default = fold_spec is None or isinstance(fold_spec, FoldPolicy)
  if is_default:
    return _fitted_default(params, fold_level,
                           fold_spec if isinstance(fold_spec, FoldPolicy) else None)
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


def _fitted_default(params: Any, fold_level: Level, policy: FoldPolicy | None) -> FoldSpecTree:
  """The default policy's specs for ``params``, fitted to their known shardings."""
  axes = _policy_axes(params, fold_level, policy)

  def fit(a, leaf):
    if a is None or leaf is None or isinstance(leaf, optax.MaskedNode):
      return None
    return _fit_default_spec(a.axes, fold_level, leaf)

  return jax.tree.map(fit, axes, params,
                      is_leaf=lambda x: x is None or isinstance(x, _Axes))
