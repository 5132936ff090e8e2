"""The default policy: which axis of each parameter FOAM folds, in any stack.

FOAM folds each weight matrix along its input-feature axis (the paper's
PyTorch code folds the last axis of an ``(out, in)`` weight), never an axis
that stacks layers, and keeps Adam's moments for embeddings, output heads
and every vector (stacked per-layer vectors included). The policy reads, for
each parameter, the most specific description the tree gives of it:

1. **Tree path.** A parameter whose path contains one of
   ``FoldPolicy.unfolded_paths`` (case-insensitive; by default ``embed``,
   ``lm_head``, ``logits_dense``, ``wte``, ``wpe``) keeps Adam's moments.
   Path rules never look at axis names.
2. **Module type.** Inside a standard layer the layer says what each field
   is. Equinox (``eqx.filter`` keeps the module tree): ``nn.Linear``,
   ``nn.GRUCell`` and ``nn.LSTMCell`` weights ``(out, in)`` fold axis ``-1``;
   ``nn.Conv*`` and ``nn.ConvTranspose*`` weights ``(out, in, *kernel)`` fold
   their ``in`` axis; biases, ``nn.Embedding`` and the norms keep Adam's
   moments. haliax: ``nn.Linear`` folds one of its ``In`` axes (the last one
   long enough, see below; ``out_first`` does not matter since axes are
   found by name); its bias and ``nn.Embedding`` keep Adam's moments.
3. **Axis names.** Flax Linen ``Partitioned``/``LogicallyPartitioned``
   boxes, NNX ``Variable`` sharding metadata (``out_sharding``, where
   ``nnx.vmap``/``nnx.scan`` record ``transform_metadata={nnx.PARTITION_NAME:
   ...}``) and haliax ``NamedArray`` axes. Axes named in
   ``FoldPolicy.layer_axis_names`` (``layers``, ``layer``, ``stage``) stack
   layers: never folded, and a parameter with fewer than two other axes is
   a stacked vector (Adam). A Flax kernel folds its first other axis (Flax
   puts input features first: ``(in, out)``, ``DenseGeneral``'s ``(in...,
   out...)``); a haliax array outside a ``Linear`` its last (haliax's
   default layout is ``(Out..., In...)``).
4. **Shape.** Without names or types: rank 0 and 1 keep Adam's moments;
   rank 2 and more fold axis ``-2`` (a Flax kernel ``(in, out)``,
   scan-stacked ``(layers, in, out)``, ``DenseGeneral``'s ``(in, heads,
   head_dim)`` out-projection input ``(heads, head_dim, out)``: its
   innermost input), never a leading (stacking) axis; except the query, key
   and value kernels of Flax's attention layers (a path ending in
   ``query``, ``key`` or ``value``, then ``kernel``), ``(..., in, heads,
   head_dim)``, which fold their input axis ``-3`` (their ``(heads,
   head_dim)`` biases keep Adam's moments).

LoRA adapters keep Adam's moments: NNX's ``nnx.LoRAParam`` variables, and
paths containing ``lora_a`` or ``lora_b`` (Flax and qwix name them so;
Levanter and peft-style code ``lora_A``/``lora_B``). They are a few percent
of the weights, and an adapter that starts at zero (``lora_b``) has block
means of about zero: its update would be almost all residual.

Where several axes are inputs (haliax's ``o_proj`` with ``In=(heads,
head_size)``), the innermost one folds: blocks of contiguous entries of the
flattened input, as the paper's fold of the flattened ``in`` axis, and not
the ``heads`` axis that tensor parallelism shards. An input axis shorter
than a block (or not a multiple of it) gives way to the next one outwards
that fits; if none fits, the first candidate folds whole.

Sharding may then move a fold to another of the parameter's candidate
axes or lower its level (see :mod:`foam_jax.specs`).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import NamedTuple

import jax

from foam_jax._src import folding
from foam_jax._src import stack_nodes

__all__ = ["ATTENTION_PROJECTIONS", "FoldPolicy", "LAYER_AXIS_NAMES", "MatrixAxes",
           "UNFOLDED_PATH_FRAGMENTS", "fold_axes"]

LAYER_AXIS_NAMES = ("layers", "layer", "stage")
UNFOLDED_PATH_FRAGMENTS = ("embed", "lm_head", "logits_dense", "wte", "wpe", "lora_a",
                           "lora_b")
# The query, key and value projections of Flax's attention layers (NNX
# ``MultiHeadAttention``, Linen ``MultiHeadDotProductAttention``): kernels
# ``(..., in, heads, head_dim)`` whose input axis is third from last.
ATTENTION_PROJECTIONS = ("query", "key", "value")


@dataclasses.dataclass(frozen=True)
class FoldPolicy:
  """The default policy's options; pass it as ``fold_spec=`` to change them.

  Attributes:
    layer_axis_names: axis names that stack layers (matched exactly, case
      sensitive, as the stack names them).
    unfolded_paths: fragments of tree paths (lower case) whose parameters
      keep Adam's moments: embeddings, output heads and LoRA adapters.

  Examples:
    >>> import jax.numpy as jnp, foam_jax
    >>> policy = foam_jax.FoldPolicy(unfolded_paths=("embed", "head"))
    >>> params = {"head": jnp.zeros((64, 10)), "w": jnp.zeros((64, 64))}
    >>> state = foam_jax.foam(1e-3, fold_spec=policy).init(params)
    >>> state[0].mu["head"].shape, state[0].mu["w"].shape
    ((64, 10), (16, 64))
  """

  layer_axis_names: tuple[str, ...] = LAYER_AXIS_NAMES
  unfolded_paths: tuple[str, ...] = UNFOLDED_PATH_FRAGMENTS

  def __post_init__(self):
    for field in ("layer_axis_names", "unfolded_paths"):
      value = getattr(self, field)
      if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"FoldPolicy.{field} must be a tuple of str, got {value!r}.")
      object.__setattr__(self, field, tuple(value))


_EQX_OUT_IN = ("Linear", "GRUCell", "LSTMCell")
_EQX_CONV = ("Conv", "ConvTranspose")
_EQX_ADAM = ("Embedding", "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm", "PReLU")


def _is_context(node: Any) -> bool:
  """Nodes whose type or metadata describes the arrays inside them."""
  return (stack_nodes.is_named_node(node)
          or stack_nodes.is_class_of(node, "haliax", "Linear", "Embedding")
          or stack_nodes.is_class_of(node, "equinox", *_EQX_OUT_IN, *_EQX_CONV, *_EQX_ADAM))


def _is_layer_name(name: Any, layer_names: tuple[str, ...]) -> bool:
  entries = name if isinstance(name, (tuple, list)) else (name,)
  return any(isinstance(e, str) and e in layer_names for e in entries)


def _fits(size: int, level: Any) -> bool:
  if level == folding.WHOLE_AXIS:
    return size >= 2
  block = 2 ** level
  return size >= block and size % block == 0


def _order(candidates: list[int], shape: tuple[int, ...], level: Any) -> tuple[int, ...]:
  """``candidates`` (most preferred first), the first that fits the level moved to the front."""
  fitting = [a for a in candidates if _fits(shape[a], level)]
  first = fitting[0] if fitting else candidates[0]
  return (first,) + tuple(a for a in candidates if a != first)


def _negative(axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
  return tuple(a - ndim for a in axes)


class MatrixAxes(NamedTuple):
  """A weight's axes as the policy reads them (negative ints).

  ``candidates``: fold axes, preferred first; ``inputs``/``outputs``: its
  input- and output-feature axes in array order (other axes are batch axes,
  such as stacked layers).
  """

  candidates: tuple[int, ...]
  inputs: tuple[int, ...]
  outputs: tuple[int, ...]


def _matrix(ndim, candidates, inputs, outputs) -> MatrixAxes:
  return MatrixAxes(_negative(tuple(candidates), ndim), _negative(tuple(sorted(inputs)), ndim),
                    _negative(tuple(sorted(outputs)), ndim))


def _leaf_axes(shape, names, layer_names, inputs_first, level):
  """A weight's axes from its shape and (optional) axis names; ``None``: not a matrix."""
  ndim = len(shape)
  if ndim < 2:
    return None
  if names is None or len(names) != ndim:
    return _matrix(ndim, (ndim - 2, ndim - 1), (ndim - 2,), (ndim - 1,))
  other = [a for a in range(ndim) if not _is_layer_name(names[a], layer_names)]
  if len(other) < 2:
    return None  # A (stacked) vector.
  if inputs_first:  # Flax: the first axis is an input, the last an output.
    inputs, outputs = other[:-1], [other[-1]]
    return _matrix(ndim, _order(inputs, shape, level) + tuple(outputs), other[:1], other[1:])
  inputs, outputs = other[1:][::-1], [other[0]]  # haliax: (Out..., In).
  return _matrix(ndim, _order(inputs, shape, level) + tuple(outputs), other[-1:], other[:-1])


def _module_axes(module, field_path: str, shape, names, policy, level):
  """Candidate fold axes of an array in a standard layer (``None``: Adam)."""
  ndim = len(shape)
  field = field_path.lstrip(".").split(".")[0].split("[")[0]
  if (stack_nodes.is_class_of(module, "equinox", *_EQX_ADAM)
      or stack_nodes.is_class_of(module, "haliax", "Embedding")):
    return None
  if not field.startswith("weight"):
    return None  # Biases.
  if ndim < 2:
    return None
  if stack_nodes.is_class_of(module, "equinox", *_EQX_OUT_IN):
    return _matrix(ndim, (ndim - 1, ndim - 2), (ndim - 1,), (ndim - 2,))
  if stack_nodes.is_class_of(module, "equinox", *_EQX_CONV):
    in_axis = ndim - module.num_spatial_dims - 1
    return _matrix(ndim, (in_axis, in_axis - 1), (in_axis,), (in_axis - 1,))
  # haliax Linear: its In axes by name, innermost first.
  inputs = module.In if isinstance(module.In, (tuple, list)) else (module.In,)
  in_names = [getattr(a, "name", a) for a in inputs]
  if names is None:
    return _matrix(ndim, (ndim - 1, ndim - 2), (ndim - 1,), (ndim - 2,))
  candidates = [names.index(n) for n in reversed(in_names) if n in names]
  outputs = [a for a in range(ndim) if a not in candidates
             and not _is_layer_name(names[a], policy.layer_axis_names)]
  if not candidates or not outputs:
    return None
  return _matrix(ndim, _order(candidates, shape, level) + tuple(outputs[-1:]),
                 candidates, outputs)


def _path_text(path) -> str:
  return jax.tree_util.keystr(tuple(path)).lower()


def fold_axes(params: Any, policy: FoldPolicy, level: Any, *, flax_names: bool = True,
              ) -> list[MatrixAxes | None]:
  """Per leaf of ``params``: its :class:`MatrixAxes`, or ``None`` for Adam's moments.

  ``level`` (an int or ``"whole_axis"``) decides which input axes are long
  enough. The list follows ``jax.tree.leaves(params)``. ``flax_names=False``
  ignores the names in Flax boxes and NNX Variables (which stacks strip
  before ``update``), for choices that must be the same at ``init`` and
  ``update``.
  """
  decisions = []
  for path, node in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_context)[0]:
    if not _is_context(node):
      decisions.append(_decide(policy, level, path, node))
      continue
    is_module = not stack_nodes.is_named_node(node)
    stop_at_named = lambda x, root=node: x is not root and stack_nodes.is_named_array(x)
    for sub, leaf in jax.tree_util.tree_flatten_with_path(node, is_leaf=stop_at_named)[0]:
      if stack_nodes.is_named_array(leaf) and not jax.tree.leaves(leaf):
        continue  # An absent parameter (None, optax.MaskedNode) in a NamedArray.
      names = stack_nodes.axis_names(leaf if stack_nodes.is_named_array(leaf) else node)
      if not flax_names and (stack_nodes.is_flax_box(node) or stack_nodes.is_nnx_variable(node)):
        names = None
      if stack_nodes.is_named_array(leaf):
        leaf = leaf.array
      if stack_nodes.is_class_of(node, "flax", "LoRAParam"):
        decisions.append(None)  # Adapters keep Adam's moments.
        continue
      decisions.append(_decide(
          policy, level, tuple(path) + tuple(sub), leaf, names,
          module=node if is_module else None,
          field_path=jax.tree_util.keystr(tuple(sub)),
          inputs_first=not stack_nodes.is_named_array(node)))
  return decisions


def _key_names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def _attention_axes(path, shape) -> MatrixAxes | None:
  """An unnamed attention projection ``(..., in, heads, head_dim)``: fold ``in``."""
  keys = _key_names(path)
  if keys[-1:] in (["value"], ["raw_value"]) and keys[-2:-1] in (["kernel"], ["bias"]):
    keys = keys[:-1]  # The field of an NNX Variable, not the layer's "value".
  if len(keys) < 2 or keys[-2] not in ATTENTION_PROJECTIONS:
    return None
  if keys[-1] == "bias":
    return MatrixAxes((), (), ())  # (heads, head_dim): a bias, Adam's moments.
  if len(shape) < 3 or keys[-1] != "kernel":
    return None
  ndim = len(shape)
  return _matrix(ndim, (ndim - 3,), (ndim - 3,), (ndim - 2, ndim - 1))


def _decide(policy, level, path, leaf, names=None, module=None, field_path="",
            inputs_first=True):
  shape = tuple(getattr(leaf, "shape", ()))
  if any(f in _path_text(path) for f in policy.unfolded_paths):
    return None
  if module is not None:
    return _module_axes(module, field_path, shape, names, policy, level)
  if names is None or len(names) != len(shape):
    attention = _attention_axes(path, shape)
    if attention is not None:
      return attention if attention.candidates else None
  return _leaf_axes(shape, names, policy.layer_axis_names, inputs_first, level)
