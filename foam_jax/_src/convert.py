"""``convert_state``: move a running job onto folded moments without a restart.

An Adam/AdamW, Muon or Lion state (or one of ours at another level or fold)
becomes the state of a transformation holding folded moments: each folded
moment is the block mean of the source moment, each unfolded one is the
source moment itself, and the step counts carry over.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonState

from foam_jax._src import folding
from foam_jax._src import lion
from foam_jax._src import moment
from foam_jax._src import muon
from foam_jax._src import quantize
from foam_jax._src import quantized_state
from foam_jax._src import transform
from foam_jax._src.specs import FoldSpec

__all__ = ["convert_state"]

# Our states with folded moments, and the moment fields each holds.
_FOLDED = {
    transform.ScaleByFoamState: ("mu", "nu"),
    muon.FoldedMuonState: ("mu",),
    lion.ScaleByFoldedLionState: ("mu",),
}
# States a conversion can read moments from: first and (maybe) second.
_SOURCES = {
    optax.ScaleByAdamState: ("mu", "nu"),
    MuonState: ("mu",),
    optax.ScaleByLionState: ("mu",),
    **_FOLDED,
}


class _Missing:
  """No source moment for this parameter (a leaf, not a pytree node)."""


def _is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def _is_folded(x: Any) -> bool:
  return type(x) in _FOLDED  # pylint: disable=unidiomatic-typecheck


def _is_source(x: Any) -> bool:
  return type(x) in _SOURCES  # pylint: disable=unidiomatic-typecheck


def _state_types(tree: Any) -> list[str]:
  """Names of the state types (NamedTuples) in ``tree``, outermost first."""
  names = []

  def walk(x):
    if hasattr(x, "_fields"):
      names.append(type(x).__name__)
    if isinstance(x, dict):
      children = x.values()
    elif isinstance(x, (tuple, list)):
      children = x
    else:
      return
    for child in children:
      walk(child)

  walk(tree)
  return list(dict.fromkeys(names))


def _full_size(params: Any, tree: Any, where: str, *, signed: bool) -> Any:
  """A source moment tree with every leaf unfolded to its parameter's shape.

  Int8 moments (:class:`~foam_jax._src.quantized_state.QuantizedMoments`) are
  dequantized; ``signed``: the tree holds first moments.
  """
  def unfold_leaf(path, p, m):
    if _is_masked(m) or _is_masked(p):
      return m
    if isinstance(m, quantize.QuantizedMoment):
      m = quantize.dequantize(m)
    shape = tuple(p.shape)
    if tuple(m.shape) == shape:
      return m
    try:
      geom = moment.geometry(FoldSpec(), shape, m.shape)
    except ValueError as e:
      raise ValueError(
          f"convert_state: the moment at {where}{jax.tree_util.keystr(path)} "
          f"has shape {tuple(m.shape)}, not a fold of its parameter's "
          f"{shape}: {e}") from None
    return folding.unfold(m, geom.axis, geom.level, shape[geom.axis])

  try:
    tree = quantized_state.stored_moments(tree, params, signed=signed,
                                 field=f"moment at {where}")
    return jax.tree_util.tree_map_with_path(
        unfold_leaf, params, tree, is_leaf=_is_masked)
  except quantized_state.OldInt8LayoutError:
    raise
  except ValueError as e:
    if "convert_state" in str(e):
      raise
    raise ValueError(
        f"convert_state: the moments at {where} do not match the params' "
        f"tree; was opt_state made for other params? JAX said: {e}") from None


def _first_present(params: Any, trees: list[Any]) -> Any:
  """Per parameter, the first tree's leaf that is not masked, else _Missing."""

  def pick(_, *leaves):
    for leaf in leaves:
      if not _is_masked(leaf):
        return leaf
    return _Missing()

  return jax.tree.map(pick, params, *trees, is_leaf=_is_masked)


def _place_like(x: jax.Array, target: Any) -> Any:
  """``x`` in ``target``'s dtype, and on its sharding when that is committed.

  An int8 ``target`` (:class:`~foam_jax._src.quantize.QuantizedMoment`)
  gets ``x`` quantized (rounded to nearest) with its block size and code.
  """
  if isinstance(target, quantize.QuantizedMoment):
    q = quantize.quantize(jnp.real(jnp.asarray(x)), target)
    return type(target)(*(_place_like(a, b) for a, b in zip(q, target)))
  if jnp.iscomplexobj(x) and not jnp.issubdtype(target.dtype,
                                                jnp.complexfloating):
    x = jnp.real(x)
  x = jnp.asarray(x).astype(target.dtype)
  if getattr(target, "committed", False):
    x = jax.device_put(x, target.sharding)
  return x


def convert_state(opt_state: optax.OptState,
                  tx: optax.GradientTransformation,
                  params: optax.Params) -> optax.OptState:
  r"""Converts a running optimizer's state into ``tx``'s, moments folded.

  ``tx`` is any transformation holding one of foam_jax's folded transforms
  (:func:`foam_jax.foam`, :func:`foam_jax.foam_muon`,
  :func:`foam_jax.foam_lion`, their ``scale_by_*``, inside ``optax.chain``,
  ``optax.partition``, ``optax.inject_hyperparams``, ...). Its state is
  filled from ``opt_state``:

  * moments stored in 8 bits (``mu_dtype=jnp.int8``) on either side are
    dequantized when read and quantized (to nearest) when written, so float
    and int8 states convert both ways;
  * the moments come from every ``optax.ScaleByAdamState`` (``mu``, ``nu``),
    ``optax.contrib.MuonState`` and ``optax.ScaleByLionState`` (``mu``) in
    ``opt_state``, or from a foam_jax state at any level or fold (first
    unfolded to full size, then refolded); per parameter, the first source
    that holds it wins. A folded target moment is the block mean
    :math:`F(m)` of the source moment :math:`m`; an unfolded one is
    :math:`m` itself;
  * second moments (FOAM's, the AdamW part of ``foam_muon``) need a source
    with second moments (Adam or FOAM);
  * every step count of ``tx``'s state takes the count at the same place in
    ``opt_state`` (e.g. ``inject_hyperparams``' and schedules' counts when
    both are wrapped alike), else the count of the first source state;
  * everything else (hyperparameters, Newton-Schulz coefficients) is
    ``tx.init(params)``'s.

  The result has exactly the tree, shapes, dtypes and shardings of
  ``tx.init(params)``, which it calls for that template (so it runs eagerly,
  on concrete params, and briefly holds the template as well). To halve a
  running AdamW job's memory: ``state =
  convert_state(state, foam_jax.foam(lr), params)``, then keep training with
  ``foam``.

  Args:
    opt_state: the state to convert (e.g. restored from a checkpoint).
    tx: the transformation the result is for.
    params: the parameters (concrete arrays; sharded ones give sharded
      states).

  Returns:
    A state for ``tx``, structured exactly as ``tx.init(params)``.

  Raises:
    ValueError: ``tx`` holds no folded transform; ``opt_state`` holds no
      convertible moments (the message lists what it holds), lacks moments
      ``tx`` needs, or does not match ``params``.

  Examples:
    >>> import jax.numpy as jnp, optax, foam_jax
    >>> params = {"w": jnp.ones((8, 4))}
    >>> adamw = optax.adamw(1e-3)
    >>> state = adamw.init(params)
    >>> updates, state = adamw.update(params, state, params)
    >>> tx = foam_jax.foam(1e-3)
    >>> new = foam_jax.convert_state(state, tx, params)
    >>> new[0].mu["w"].shape, int(new[0].count)
    ((2, 4), 1)
  """
  target = tx.init(params)
  if not any(_is_folded(x)
             for x in jax.tree.leaves(target, is_leaf=_is_folded)):
    raise ValueError(
        "convert_state: tx holds none of foam_jax's folded transformations "
        f"(its state holds {_state_types(target)}); use foam_jax.foam, "
        "foam_muon, foam_lion or their scale_by_* transforms.")
  sources = [
      (jax.tree_util.keystr(path), node)
      for path, node in jax.tree_util.tree_flatten_with_path(
          opt_state, is_leaf=_is_source)[0]
      if _is_source(node)
  ]
  if not sources:
    raise ValueError(
        "convert_state: found no convertible moments in opt_state. It holds "
        f"{_state_types(opt_state) or [type(opt_state).__name__]}; convertible "
        "states are optax.ScaleByAdamState (adam, adamw), "
        "optax.contrib.MuonState, optax.ScaleByLionState and foam_jax's "
        "states.")
  found = [type(node).__name__ for _, node in sources]
  full = {
      field: [
          _full_size(params, getattr(node, field), f"{where}.{field}",
                     signed=field == "mu")
          for where, node in sources
          if field in _SOURCES[type(node)]
      ]
      for field in ("mu", "nu")
  }
  present = {
      field: _first_present(params, trees) if trees else None
      for field, trees in full.items()
  }
  count = sources[0][1].count

  def fill(field, node_name):
    def fill_leaf(path, p, t, s):
      if _is_masked(t):
        return t
      if isinstance(s, _Missing) or s is None:
        raise ValueError(
            f"convert_state: {node_name}.{field} needs a moment for the "
            f"parameter at {jax.tree_util.keystr(path)}, and opt_state has "
            f"none there (it holds {found}"
            + ("; none of them has second moments" if field == "nu" else "")
            + ").")
      if tuple(t.shape) != tuple(p.shape):
        geom = moment.geometry(FoldSpec(), tuple(p.shape), t.shape)
        wide = jnp.promote_types(s.dtype, jnp.float32)
        s = folding.fold(s.astype(wide), geom.axis, geom.level)
      return _place_like(s, t)
    return fill_leaf

  def convert_node(node):
    if not _is_folded(node):
      return node
    name = type(node).__name__
    values = {"count": _place_like(count, node.count)}
    for field in _FOLDED[type(node)]:
      src = present[field]
      if src is None:
        src = jax.tree.map(lambda _: None, params, is_leaf=_is_masked)
      targets = quantized_state.unpack(getattr(node, field), signed=field == "mu")
      values[field] = quantized_state.pack(jax.tree_util.tree_map_with_path(
          fill(field, name), params, targets, src, is_leaf=_is_masked))
    return node._replace(**values)

  converted = jax.tree.map(convert_node, target, is_leaf=_is_folded)
  source_leaves = dict(jax.tree_util.tree_flatten_with_path(opt_state)[0])
  # (Quantized moments' codes and scales are not counts: carry_count skips
  # them by name and rank.)

  def carry_count(path, leaf):
    if _is_folded(leaf) or not path:
      return leaf
    last = path[-1]
    if getattr(last, "name", None) != "count" or getattr(leaf, "ndim", 1):
      return leaf
    same_place = source_leaves.get(path)
    value = same_place if getattr(same_place, "ndim", 1) == 0 else count
    return _place_like(value, leaf)

  return jax.tree_util.tree_map_with_path(
      carry_count, converted, is_leaf=_is_folded)
