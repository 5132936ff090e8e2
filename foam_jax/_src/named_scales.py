r"""int8 block scales for parameters whose stack names the quantized axis.

An int8 moment keeps one scale per block of ``B`` entries along its last
axis (:mod:`foam_jax._src.quantize`), so its scales are the moment's shape
with that axis shrunk to :math:`\lceil n / B \rceil`. A stack that names the
parameter's axes (Linen boxes, NNX ``Variable`` metadata, haliax
``NamedArray`` s) hands ``tx.init`` the names with the arrays, and the state
made by Optax's tree maps puts the same names on the scales, which the stack
then shards as it shards the parameter (``nn.get_sharding``,
``nnx.get_partition_spec``, haliax's axis mappings). A named last axis must
therefore leave the scales divisible by whatever mesh axes the name stands
for, with each block inside one shard, so that the update stays free of
collectives.

``init`` fits the block to the split when it can see it (an array placed
split along that axis, a mesh in context:
:func:`~foam_jax._src.quantize.block_size`). When it cannot
(``jax.eval_shape(init)`` outside a mesh, then
``jax.jit(init, out_shardings=...)``, as nanodo and MaxText do; an eager
``init`` before placement; weights kept whole until the trainer shards
them by their names, as Tunix's are), a named last axis of length :math:`n`
could be split any number of ways. The smallest block,
:data:`~foam_jax._src.quantize.MIN_BLOCK_SIZE` entries, lies inside a shard
for every split whose slices are multiples of it (the only splits int8
storage serves without collectives), and then :math:`n / B` is a multiple of
the split: the scales keep the name. If :math:`n` is not a multiple of it,
no split fits, and the scales' last axis loses its name (its scales are
replicated; the update is right, with a small collective over that axis).
The rule reads nothing of the devices, so ``init`` makes the same state
layout everywhere. The smaller block costs its scales 0.25 bytes an entry
(a block of 256: 1/64).
"""

from __future__ import annotations

from typing import Any

import jax

from foam_jax._src import placement
from foam_jax._src import quantize
from foam_jax._src import quantized_state
from foam_jax._src import stack_nodes

__all__ = ["stored", "unseen_split_block"]


def unseen_split_block(n: int) -> int | None:
  """The block for a named axis of length ``n`` split an unseen number of ways.

  Returns:
    ``MIN_BLOCK_SIZE`` if it divides ``n``, else ``None`` (no block fits
    a split).

  Examples:
    >>> unseen_split_block(4096)
    16
    >>> unseen_split_block(24) is None
    True
  """
  return quantize.MIN_BLOCK_SIZE if n % quantize.MIN_BLOCK_SIZE == 0 else None


def _fitted(param_node: Any, codes_node: Any, scales_node: Any) -> Any:
  """``scales_node`` fitted to ``param_node``'s name on the quantized axis."""
  names = stack_nodes.axis_names(param_node)
  (param,) = jax.tree.leaves(param_node) or (None,)
  scales_leaves = jax.tree.leaves(scales_node)
  if (not names or names[-1] is None or param is None or len(scales_leaves) != 1
      or placement.hidden_mesh_shape(param) is not None):
    return scales_node
  shard = placement.shard_shape(param)
  if shard is not None and shard[-1] != param.shape[-1]:
    return scales_node  # The split is visible: quantize.block_size fitted the block.
  (codes,), (scales,) = jax.tree.leaves(codes_node), scales_leaves
  if len(names) != codes.ndim:
    return scales_node
  n = codes.shape[-1]
  block = unseen_split_block(n)
  if block is None:
    return stack_nodes.rebuild(scales_node, scales, names[:-1] + (None,))
  shape = codes.shape[:-1] + (n // block,)
  if shape == scales.shape:
    return scales_node
  return stack_nodes.rebuild(scales_node, placement.zeros_like_placed(shape, scales.dtype, scales),
                             names)


def stored(params: Any, moments: Any) -> Any:
  """The moment field ``init`` stores: packed, int8 scales fitted to axis names.

  Args:
    params: the params ``init`` was given (boxes, Variables, NamedArrays
      included).
    moments: the per-parameter zero moments ``init`` made from them.

  Returns:
    ``quantized_state.pack(moments)``: a float tree as it is, or a
    :class:`~foam_jax._src.quantized_state.QuantizedMoments` whose scales
    are fitted, for each parameter that names its last axis (module
    docstring).
  """
  packed = quantized_state.pack(moments)
  if not isinstance(packed, quantized_state.QuantizedMoments):
    return packed
  fit = lambda p, c, s: _fitted(p, c, s) if stack_nodes.is_named_node(p) else s  # noqa: E731
  scales = jax.tree.map(fit, params, packed.codes, packed.scales,
                        is_leaf=stack_nodes.is_named_node)
  return packed._replace(scales=scales)
