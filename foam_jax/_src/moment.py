r"""The folded moment: an EMA of the gradient stored folded, read back whole.

Every folded optimizer here (FOAM's Adam, folded Muon, folded Lion) keeps
exponential moving averages of the gradient in the folded space and reads
them back at full size with the current gradient's residual. For one leaf
with fold operator :math:`F` (block means of :math:`k = 2^l` entries along
one axis), its broadcast back :math:`U` and residual scale :math:`c`:

.. math::

  \tilde m_t &= \beta \tilde m_{t-1} + (1 - \beta) F(g_t)
    && \text{(stored, } k \text{ times smaller)} \\
  R_t &= g_t - U F(g_t) && \text{(recomputed, never stored)} \\
  M_t &= U \tilde m + c R_t && \text{(the read)} \\
  V_t &= U \tilde v + c^2 |R_t|^2 && \text{(the read of a second moment)}

:class:`FoldedGradient` holds one leaf's gradient in the *blocked view*
(the fold axis reshaped to ``(num_blocks, block)``), where :math:`U` is a
broadcast and :math:`F` a sum of slices, so every read and update is
elementwise work that XLA fuses into one pass over the gradient. A leaf that
is not folded gets the same interface with :math:`F = U = \mathrm{id}` and
:math:`R = 0`: the transforms need no second code path.

The state is the source of truth for the geometry (:func:`geometry`):
``init`` may fit the level or axis to the parameter's sharding, and
``update`` (possibly traced without sharding information) folds as the state
was folded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from foam_jax._src import folding
from foam_jax._src import placement
from foam_jax._src import quantize
from foam_jax._src import specs as specs_lib

__all__ = [
    "EmaStep",
    "Geometry",
    "FoldedGradient",
    "GateChain",
    "gate_after",
    "gradient_maxima",
    "schedules_by_hand",
    "needs_statistics_pass",
    "geometry",
    "zeros",
    "ema",
    "map_leaves",
    "real_dtype",
    "first_moment_hat",
]


class Geometry(NamedTuple):
  """Where one leaf is folded: ``axis`` (non-negative) and ``level``."""

  axis: int
  level: int


def real_dtype(dtype) -> jnp.dtype:
  """The real dtype of a (possibly complex) inexact dtype's precision."""
  return jnp.finfo(dtype).dtype


def geometry(spec: specs_lib.FoldSpec | None, shape, state_shape
             ) -> Geometry | None:
  """Recovers a folded leaf's ``(axis, level)`` from its state's shape.

  Args:
    spec: the leaf's resolved spec; ``None`` means not folded. Its axis is
      used only when the state has the parameter's shape.
    shape: the parameter's (gradient's) shape.
    state_shape: the shape of the stored moment.

  Returns:
    ``None`` for a leaf that is not folded, else its :class:`Geometry`: the
    smallest level that folds the axis into the state's number of blocks.

  Raises:
    ValueError: the state is not a fold of a parameter of ``shape``.

  Examples:
    >>> geometry(specs_lib.FoldSpec(axis=-2, level=2), (8, 3), (2, 3))
    Geometry(axis=0, level=2)
  """
  if spec is None:
    return None
  ndim = len(shape)
  differing = [
      a for a in range(min(ndim, len(state_shape))) if shape[a] != state_shape[a]
  ]
  if len(state_shape) != ndim or len(differing) > 1:
    raise ValueError(
        f"Folded state of shape {tuple(state_shape)} does not fit a gradient "
        f"of shape {tuple(shape)}; was the state made for other params?"
    )
  axis = differing[0] if differing else spec.axis % ndim
  n, nb = shape[axis], state_shape[axis]
  # num_blocks only falls as the level grows; levels past the axis length all
  # give one block, so the smallest match is the fold.
  for level in range(max(n, 1).bit_length() + 1):
    if folding.num_blocks(n, level) == nb:
      return Geometry(axis, level)
  raise ValueError(
      f"Folded state of shape {tuple(state_shape)} is not a fold of shape "
      f"{tuple(shape)}."
  )


# Largest block whose mean the fused form recomputes in the update loop.
FUSED_MAX_BLOCK = 8
# Where the statistics pass runs: ``None`` on XLA:CPU with one device
# (GateChain), ``True`` wherever needs_statistics_pass says so, ``False``
# nowhere (tests and benchmarks set it to compare the two forms).
STATISTICS_PASS: bool | None = None


def needs_statistics_pass(dtype, shape: tuple[int, ...], geom: Geometry | None,
                          quantized: bool = False) -> bool:
  """Whether a leaf's block statistics get a pass of their own on XLA:CPU.

  The fused form recomputes each entry's block mean inside the update loop
  from the ``block`` entries around it. XLA:CPU vectorizes that loop for
  32-bit gradients in blocks of up to 8 entries along axis ``-2``, but not
  for 16-bit gradients folded along their last axis (one scalar per entry,
  3x AdamW's step), and in blocks of 16 or more entries the recomputation
  costs more than a pass (``benchmarks/results/perf-notes.md``). One block
  spanning a whole axis other than the last (FOAM-Mini) of a 32-bit
  gradient stays fused: XLA computes it as a reduction, 0.71x AdamW's step
  at 49M float32 params against 0.90x with the pass. Every folded leaf
  whose moments are ``quantized`` (8 bits) takes the pass: its block maxima
  and codes read the statistics again.

  Examples:
    >>> import jax.numpy as jnp
    >>> needs_statistics_pass(jnp.float32, (8, 8), Geometry(axis=0, level=2))
    False
    >>> needs_statistics_pass(jnp.bfloat16, (8, 8), Geometry(axis=1, level=2))
    True
    >>> needs_statistics_pass(jnp.float32, (64, 8), Geometry(axis=0, level=6))
    False
  """
  if geom is None or geom.level == 0:
    return False
  if quantized:
    return True
  block = folding.block_size(shape[geom.axis], geom.level)
  minor = geom.axis == len(shape) - 1
  wide = jnp.dtype(dtype).itemsize >= 4
  if wide and not minor and block == shape[geom.axis]:
    return False  # One block per axis (FOAM-Mini): a reduction XLA fuses well.
  return block > FUSED_MAX_BLOCK or (not wide and minor)


def gate_after(count: jax.Array, previous: Any = None) -> jax.Array:
  """An always-true predicate that XLA can only evaluate after ``previous``.

  The statistics pass runs behind ``jax.lax.cond`` on it: a conditional is
  a boundary XLA:CPU keeps (it drops ``optimization_barrier``), so the block
  statistics are computed once into their own buffers instead of being
  fused (and recomputed) into every consumer. Gating each leaf's pass on the
  previous leaf's new moment orders the leaves, so that XLA does not run
  every leaf's pass first and keep all their statistics (``2 N / 2^l``
  entries per leaf) alive at once.

  Args:
    count: the step count (``>= 0``).
    previous: the previous leaf's new moment (an array or quantized moment),
      or ``None`` for the first leaf.
  """
  gate = count >= 0
  if previous is None:
    return gate
  leaf = previous.codes if isinstance(previous, quantize.QuantizedMoment) else previous
  if not leaf.size:
    return gate
  first = jnp.real(jax.lax.slice(leaf.reshape(-1), (0,), (1,))[0])
  return gate | jnp.isnan(first)  # Never NaN-dependent: count >= 0 holds.


def schedules_by_hand() -> bool:
  """Whether the transforms order their XLA:CPU work themselves.

  ``STATISTICS_PASS`` if set, else: on XLA:CPU with one device. There the
  statistics pass (:class:`GateChain`) and the order of 8-bit writes
  (:class:`EmaStep`) apply; elsewhere reading one entry of a sharded leaf
  would be a collective, and other compilers schedule differently.
  """
  if STATISTICS_PASS is None:
    return jax.default_backend() == "cpu" and jax.device_count() == 1
  return STATISTICS_PASS


class GateChain:
  """:func:`gate_after` gates for a transform's leaves, in order.

  It hands out ``None`` (the fused form everywhere) off XLA:CPU, where the
  compilers fuse differently and a conditional would cost a host sync per
  leaf, and with more than one device, where ordering the leaves would make
  one device wait on another's shard (a collective).

  Args:
    count: the step count.
  """

  def __init__(self, count: jax.Array):
    self.count = count
    self.active = schedules_by_hand()
    self.previous = None

  def next(self) -> jax.Array | None:
    """The gate of the next leaf."""
    return gate_after(self.count, self.previous) if self.active else None

  def done(self, new_moment: Any) -> None:
    """Records a leaf's new moment: the next leaf's pass waits for it."""
    self.previous = new_moment


class FoldedGradient:
  """One leaf's gradient seen through a folded moment's geometry.

  Moments are in the folded view ``(.., num_blocks, ..)``; the gradient and
  every full-size read are in a *working view* (:attr:`blocks`) that
  :meth:`unblock` returns to the parameter's shape. By default the working
  view is the blocked view ``(.., num_blocks, block, ..)``, where :math:`U`
  is a broadcast and :math:`F` a sum of slices, so every read and update is
  elementwise work that XLA fuses into one pass over the gradient.

  With a ``gate`` (XLA:CPU) and where :func:`needs_statistics_pass` says so,
  :math:`F(g)` and :math:`F(|g|^2)` are computed in one pass of their own
  and read back as arrays; a leaf folded along its last axis then works on
  the gradient itself (:math:`U` a broadcast along that axis), which XLA:CPU
  vectorizes where it does not vectorize the blocked view.

  A leaf that is not folded gets the same interface with
  :math:`F = U = \\mathrm{id}` and :math:`R = 0`.

  Args:
    g: the gradient.
    geom: the leaf's :class:`Geometry`, or ``None`` if it is not folded
      (level 0, blocks of one entry, is the same: the gradient itself).
    residual_scale: ``c``, the weight of the residual in every read.
    count_dtype: dtype of the per-block entry counts (a tail block shorter
      than the rest is averaged over its true length).
    compute_dtype: the dtype ``g`` is read in (default: its own).
    gate: :func:`gate_after`'s predicate; ``None`` keeps the fused form.
    quantized: the leaf's moments are stored in 8 bits
      (:func:`needs_statistics_pass`).

  Examples:
    >>> import jax.numpy as jnp
    >>> g = jnp.array([1.0, 3.0, 5.0, 9.0])
    >>> fg = FoldedGradient(g, Geometry(axis=0, level=1))
    >>> fg.mean  # F(g): what the stored moment takes
    Array([2., 7.], dtype=float32)
    >>> fg.unblock(fg.read(jnp.array([10.0, 20.0])))  # U m + c R
    Array([ 9., 11., 18., 22.], dtype=float32)
  """

  def __init__(self, g: jax.Array, geom: Geometry | None, *,
               residual_scale: Any = 1.0, count_dtype=None, compute_dtype=None,
               gate: jax.Array | None = None, quantized: bool = False):
    if geom is not None and geom.level == 0:
      geom = None  # Blocks of one entry: F = U = id and R = 0 exactly.
    self.geom = geom
    self.length = None if geom is None else g.shape[geom.axis]
    self.residual_scale = residual_scale
    compute = jnp.dtype(compute_dtype or g.dtype)
    self._mean_of_squares = None
    self.flat = False
    if geom is None:
      self.blocks = self.mean = g.astype(compute)
      return
    axis, level = geom
    self._counts = folding.folded_counts(
        self.length, level, g.ndim, axis, count_dtype or real_dtype(compute))
    if gate is None or not needs_statistics_pass(g.dtype, g.shape, geom, quantized):
      self.blocks = folding.to_blocks(g.astype(compute), axis, level)
      # Block sums as slices + adds (folding.block_sums): elementwise work
      # that fuses into the consumers, no separate reduction pass.
      self.mean = folding.block_sums(self.blocks, axis) / self._counts
      return
    counts = self._counts

    def statistics():
      gb = folding.to_blocks(g.astype(compute), axis, level)
      return (folding.block_sums(gb, axis) / counts,
              folding.block_sums(gb, axis, square=True) / counts)

    # Both branches compute the statistics: the gate is always true, and a
    # constant branch would be materialized outside the conditional.
    self.mean, self._mean_of_squares = jax.lax.cond(gate, statistics, statistics)
    self.flat = axis == g.ndim - 1
    self.blocks = (g.astype(compute) if self.flat
                   else folding.to_blocks(g.astype(compute), axis, level))

  def mean_of_squares(self) -> jax.Array:
    """:math:`F(|g|^2)`: the block means of the squared magnitudes."""
    if self.geom is None:
      return folding.abs_sq(self.blocks)
    if self._mean_of_squares is not None:
      return self._mean_of_squares
    return (folding.block_sums(self.blocks, self.geom.axis, square=True)
            / self._counts)

  def expand(self, folded: jax.Array) -> jax.Array:
    """:math:`U`: a folded array broadcast into the working view."""
    if self.geom is None:
      return folded
    if self.flat:
      return folding.unfold(folded, self.geom.axis, self.geom.level, self.length)
    return jnp.expand_dims(folded, self.geom.axis + 1)

  @functools.cached_property
  def residual(self) -> jax.Array | None:
    """:math:`c R` in the working view; ``None`` (zero) if not folded."""
    if self.geom is None:
      return None
    return self.residual_scale * (self.blocks - self.expand(self.mean))

  def read(self, m: jax.Array) -> jax.Array:
    """:math:`U \\tilde m + c R`: a folded first moment at full size."""
    if self.residual is None:
      return self.expand(m)
    return self.expand(m) + self.residual

  def read_energy(self, v: jax.Array) -> jax.Array:
    """:math:`U \\tilde v + c^2 |R|^2`: a folded second moment at full size."""
    if self.residual is None:
      return self.expand(v)
    return self.expand(v) + folding.abs_sq(self.residual)

  def unblock(self, x_blocks: jax.Array) -> jax.Array:
    """From the working view back to the parameter's shape."""
    if self.geom is None or self.flat:
      return x_blocks
    return folding.from_blocks(x_blocks, self.geom.axis, self.length)


def _zero_after(x: jax.Array, like: Any) -> jax.Array:
  """A ``0`` that XLA computes from ``x``: orders a write after ``x``'s reads."""
  return jnp.isnan(x.reshape(-1)[0]).astype(jnp.asarray(like).dtype) if x.size else 0


class EmaStep(NamedTuple):
  """One :func:`ema` step: ``read`` for the update, ``store(after)`` to keep.

  ``store(after)`` returns the moment in its storage form. The update reads
  an 8-bit moment's new value before requantization, so its loop reads the
  old codes, which the requantization overwrites in place; XLA:CPU then
  copies every leaf's old codes first and keeps them to the end of the step
  (the whole int8 state again). Two ways out, for the two kinds of leaf:

  * a folded leaf (``ema(gate=...)``) computes its new moments behind a
    conditional, into float32 buffers at the folded size that the update
    and the codes read: the codes' loop is then the only reader of the old
    codes;
  * a leaf that is not folded would need such buffers at the parameter's
    size, so instead its codes are computed from a no-op ``0`` derived from
    ``after`` (the leaf's update): that dependency orders the writes after
    the update's reads, at the price of writing the update to a buffer of
    its own.

  Either keeps the int8 saving in the compiled peak of a bf16 7B train step
  (99 % per layer, ``benchmarks/results/memory.md``). ``store`` orders the
  writes only where :func:`schedules_by_hand` (one device: reading an entry
  of a sharded leaf would be a collective) and the moment was not computed
  behind a gate, so callers pass ``after`` unconditionally.
  """

  read: jax.Array
  store: Callable[..., Any]


def ema(moment: jax.Array | quantize.QuantizedMoment, target: jax.Array,
        decay: Any, compute_dtype=None, *, optax_order: bool = False,
        step: Any = None, target_max: jax.Array | None = None,
        gate: jax.Array | None = None) -> EmaStep:
  r"""``decay * moment + (1 - decay) * target``: the moment to store and to read.

  A float moment is rounded to its storage dtype, and the update reads it
  back as stored (so that XLA can overwrite a low-precision state in place,
  as the authors' in-place PyTorch code does). An 8-bit moment
  (:class:`~foam_jax._src.quantize.QuantizedMoment`) is dequantized, updated
  in float32 and requantized in one pass, and the update reads the float32
  value (as bitsandbytes' 8-bit optimizers do): reading the codes back would
  make XLA recompute them inside the update's loop. The new block scales are

  .. math:: s' = \beta s + (1 - \beta) \max_{\text{block}} |t|
            \ \ge\ \max_{\text{block}} |\beta m + (1 - \beta) t|,

  a bound that needs the target's block maxima only (an input, or the
  gradient's statistics), not a second pass over the new moment.

  Args:
    moment: the stored (folded) moment.
    target: what it averages: ``F(g)``, ``F(|g|^2)``, in the folded shape.
    decay: the EMA's decay rate.
    compute_dtype: dtype the stored moment is read in (default: its own).
    optax_order: write it ``(1 - decay) * target + decay * moment``, as
      ``optax.tree.update_moment`` does. The sum is the same, but under
      ``jit`` XLA may contract one product into a fused multiply-add, so
      the operand order decides the last bit: the transforms that mirror an
      Optax optimizer use Optax's order to equal it bit for bit at level 0.
    step: the step count; seeds the stochastic rounding of an 8-bit moment.
      Unused for floats.
    target_max: an 8-bit moment's ``max |target|`` per quantization block
      (:func:`~foam_jax._src.quantize.block_max`), when the caller has it
      more cheaply; default: computed from ``target``.
    gate: for an 8-bit folded moment on XLA:CPU, :func:`gate_after`'s
      predicate: the new float32 moment is computed behind a conditional on
      it (see :class:`EmaStep`); ``None``: fused into its readers.

  Returns:
    An :class:`EmaStep`: ``read``, the value the update reads (in
    ``compute_dtype``), and ``store(after)``, the new moment in its storage
    dtype (or requantized).

  Examples:
    >>> import jax.numpy as jnp
    >>> new = ema(jnp.zeros(2), jnp.array([1.0, 2.0]), 0.5)
    >>> new.store()
    Array([0.5, 1. ], dtype=float32)
  """
  quantized = isinstance(moment, quantize.QuantizedMoment)

  def average(moment, target):
    if quantized:
      m = moment.astype(compute_dtype or jnp.float32)
    else:
      m = moment if compute_dtype is None else moment.astype(compute_dtype)
    if optax_order:
      return (1.0 - decay) * target + decay * m
    return decay * m + (1.0 - decay) * target

  if quantized and gate is not None:
    # Both branches compute it: the gate is always true.
    new = jax.lax.cond(gate, average, average, moment, target)
  else:
    new = average(moment, target)
  if not quantized:
    stored = new.astype(moment.dtype)
    return EmaStep(stored.astype(compute_dtype or stored.dtype), lambda after=None: stored)
  if target_max is None:
    target_max = quantize.block_max(
        target, moment.block,
        nonnegative=not isinstance(moment, quantize.SignedQuantizedMoment))
  scale = decay * moment.bounds + (1.0 - decay) * target_max

  ordered = gate is None and step is not None and schedules_by_hand()

  def store(after=None):
    seed = step + _zero_after(after, step) if ordered and after is not None else step
    return quantize.quantize(new, moment, seed, scale=scale)

  return EmaStep(new, store)


def gradient_maxima(g: jax.Array, geom: Geometry | None, mu: Any, nu: Any = None
                    ) -> tuple[jax.Array | None, jax.Array | None]:
  """:func:`ema`'s ``target_max`` for ``mu`` (target ``g``) and ``nu`` (``|g|^2``).

  For a leaf that is not folded both come from one reduction of ``|g|``
  (``max |g|^2 = (max |g|)^2``); a folded leaf's targets are its block
  statistics, and ``(None, None)`` lets :func:`ema` reduce those. Float
  moments need none.
  """
  quantized = [x for x in (mu, nu) if isinstance(x, quantize.QuantizedMoment)]
  if geom is not None or not quantized or len({x.block for x in quantized}) > 1:
    return None, None
  top = quantize.block_max(g, quantized[0].block)
  return top, top * top


def zeros(spec: specs_lib.FoldSpec | None, param: Any, dtype, *,
          second: bool = False) -> Any:
  """A zero moment for ``param``: folded by ``spec``, placed like ``param``.

  ``spec=None`` gives the parameter's shape; an ``optax.MaskedNode`` passes
  through. Works on ``jax.ShapeDtypeStruct`` s under ``jax.eval_shape``.
  ``dtype=int8`` gives blockwise 8-bit storage
  (:class:`~foam_jax._src.quantize.QuantizedMoment`), with the code of a
  second moment when ``second`` (else a first moment's, signed).

  Examples:
    >>> import jax.numpy as jnp
    >>> zeros(specs_lib.FoldSpec(-2, 2), jnp.ones((8, 3)), jnp.float32).shape
    (2, 3)
  """
  if isinstance(param, optax.MaskedNode):
    return param
  shape = tuple(param.shape)
  if spec is not None:
    shape = folding.folded_shape(shape, spec.axis, spec.level)
  if quantize.is_quantized_dtype(dtype):
    if jnp.issubdtype(param.dtype, jnp.complexfloating):
      raise TypeError(
          "int8 moment storage is for real parameters; got a "
          f"{jnp.dtype(param.dtype).name} parameter of shape {tuple(param.shape)}.")
    return quantize.zeros(shape, param, signed=not second)
  return placement.zeros_like_placed(shape, dtype or param.dtype, param)


def map_leaves(fn, specs, *trees, outputs: int) -> tuple[Any, ...]:
  """``jax.tree.map`` of ``fn`` over a spec tree and trees shaped like it.

  ``fn`` returns a tuple of ``outputs`` values per leaf; the result is one
  tree per output. ``optax.MaskedNode`` leaves are handed to ``fn``, which
  must pass them through.
  """
  tuples = jax.tree.map(fn, specs, *trees, is_leaf=specs_lib.is_spec_leaf)
  return tuple(
      jax.tree.map(lambda _, t, i=i: t[i], specs, tuples,
                   is_leaf=specs_lib.is_spec_leaf)
      for i in range(outputs)
  )


def first_moment_hat(m: Any, g: Any, decay: Any, count: jax.Array,
                     nesterov: bool) -> Any:
  """Bias-corrected first moment (trees), as ``optax.scale_by_adam`` forms it.

  ``m / (1 - decay^t)``, or with Nesterov
  ``decay m / (1 - decay^(t+1)) + (1 - decay) g / (1 - decay^t)``, tree by
  tree in Optax's operation order, so a level-0 fold equals Optax's Adam and
  Muon to the last bit.

  Examples:
    >>> import jax.numpy as jnp
    >>> m_hat = first_moment_hat(jnp.array([0.1]), jnp.array([1.0]), 0.9,
    ...                          jnp.array(1), False)
    >>> round(float(m_hat[0]), 5)  # 0.1 / (1 - 0.9)
    1.0
  """
  if not nesterov:
    return optax.tree.bias_correction(m, decay, count)
  return jax.tree.map(
      lambda m, g: decay * m + (1 - decay) * g,
      optax.tree.bias_correction(m, decay, optax.safe_increment(count)),
      optax.tree.bias_correction(g, decay, count))
