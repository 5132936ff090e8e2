"""Folded Muon: ``optax.contrib.muon`` whose momentum is stored folded.

Newton-Schulz needs whole matrices, so the momentum is read back at full
size (:math:`U \\tilde m + c R`) before it is orthogonalized; only the stored
state is folded. The orthogonalization and the shape scaling
(:mod:`foam_jax._src.newton_schulz`) follow Optax's arithmetic, so at
``fold_level=0`` with float32 momenta this equals ``optax.contrib.muon`` bit
for bit; a 16-bit momentum is orthogonalized as stored (rounded), Optax's
before rounding.
"""

from __future__ import annotations

from typing import Any
from typing import Literal
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

from foam_jax._src import fold_policy
from foam_jax._src import folded_moments
from foam_jax._src import moment
from foam_jax._src import named_scales
from foam_jax._src import newton_schulz
from foam_jax._src import param_shapes as param_shapes_lib
from foam_jax._src import placement
from foam_jax._src import quantize
from foam_jax._src import specs as specs_lib
from foam_jax._src import validation as _validation

__all__ = [
    "DEFAULT_NS_COEFFS",
    "FoldedMuonState",
    "is_dim_nums",
    "matrix_dimension_numbers",
    "scale_by_folded_muon",
]

DEFAULT_NS_COEFFS = newton_schulz.DEFAULT_NS_COEFFS
PRESETS = newton_schulz.PRESETS
is_dim_nums = newton_schulz.is_dim_nums


class FoldedMuonState(NamedTuple):
  """State of :func:`scale_by_folded_muon` (``optax.contrib.MuonState``'s tree).

  Attributes:
    count: number of updates applied so far (``int32``).
    mu: the momentum, folded like FOAM's first moment.
    ns_coeffs: the Newton-Schulz coefficients, as Optax's.
    param_shapes: each parameter's shape at ``init``, as tree metadata (no
      array leaf): ``update`` refuses gradients of other shapes.
  """

  count: jax.Array  # type: ignore[assignment]  # (tuple.count; Optax's name)
  mu: optax.Updates
  ns_coeffs: jax.Array
  param_shapes: param_shapes_lib.ParamShapes = param_shapes_lib.ParamShapes()


def matrix_dimension_numbers(params: Any) -> Any:
  """FOAM's matrix rule as Muon dimension numbers.

  The weight matrices of FOAM's default policy (:class:`foam_jax.FoldPolicy`)
  are Muon's hidden matrices: reduction axes their input features, output
  axes their output features, other axes (stacked layers) batch axes.
  Embeddings, output heads and vectors are ``None``: AdamW. Since
  ``optax.partition`` labels the gradients at ``update`` anew, the rule
  reads only what ``update`` sees in every stack: tree paths, module types
  (Equinox, haliax) and haliax axis names, not the axis names of Flax boxes
  or NNX Variables. Without those, a weight with ``ndim >= 2`` reduces
  over axis ``-2`` into axis ``-1``, as a Flax kernel ``(in, out)``.

  Args:
    params: the parameter pytree (arrays or ``jax.ShapeDtypeStruct`` s).

  Returns:
    A pytree of ``optax.contrib.MuonDimensionNumbers | None`` like ``params``.

  Examples:
    >>> import jax.numpy as jnp
    >>> dims = matrix_dimension_numbers(
    ...     {"embed": jnp.zeros((9, 4)), "w": jnp.zeros((4, 4))})
    >>> dims["embed"], dims["w"]
    (None, MuonDimensionNumbers(reduction_axis=-2, output_axis=-1))
  """
  single = lambda axes: axes[0] if len(axes) == 1 else axes
  dims = [None if a is None else MuonDimensionNumbers(single(a.inputs), single(a.outputs))
          for a in fold_policy.fold_axes(params, fold_policy.FoldPolicy(), 2,
                                         flax_names=False)]
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), dims)


def scale_by_folded_muon(
    ns_coeffs: Any = DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: float = 0.95,
    eps: float = 1e-8,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Literal[
        "frobenius", "spectral", "aol", "schatten"] = "frobenius",
    weight_dimension_numbers: Any = None,
    fold_level: specs_lib.Level | None = None,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
) -> optax.GradientTransformation:
  r"""Rescales updates with Muon, its momentum stored folded.

  ``optax.contrib.scale_by_muon`` with the momentum kept as block means and
  read back with the gradient's residual :math:`R_t = g_t - U F(g_t)`:

  .. math::

    \tilde m_t &= \beta \tilde m_{t-1} + (1 - \beta) F(g_t) \\
    M_t &= U \tilde m_t + c R_t \\
    \hat M_t &= \frac{\beta M_t}{1 - \beta^{t+1}}
               + \frac{(1 - \beta) g_t}{1 - \beta^t}
               \quad\text{(Nesterov; else } M_t / (1 - \beta^t)) \\
    u_t &= \operatorname{NewtonSchulz}(\hat M_t)

  Newton-Schulz, its preconditionings and ``adaptive`` are Optax's. With
  ``fold_level=0`` and a float32 momentum it is
  ``optax.contrib.scale_by_muon``; a 16-bit momentum is read as stored.

  Sharding: the momentum state is folded along its parameter's rank and
  sharded like the parameter, and the momentum update is block-local. The
  orthogonalization needs whole matrices, as Optax's Muon does: on a matrix
  sharded along its reduction or output axis, XLA gathers or all-reduces
  the products ``M M^T`` (collectives per Newton-Schulz step).

  Args:
    ns_coeffs: Newton-Schulz coefficients, shape ``(3,)`` or ``(n, 3)``.
    ns_steps: number of Newton-Schulz iterations.
    beta: decay of the momentum.
    eps: added to the preconditioning's denominator.
    mu_dtype: storage dtype of the momentum (default: the param's; bfloat16 for float16 params);
      ``jnp.int8`` (or ``"int8"``) stores it blockwise-quantized in 8 bits
      (codes plus one float32 scale per 256 entries, see
      :class:`foam_jax.QuantizedMoments`).
    nesterov: Nesterov momentum.
    adaptive: scale by the dual norm of the updates, as Optax's.
    preconditioning: ``"frobenius"``, ``"spectral"``, ``"aol"`` or
      ``"schatten"``, as Optax's.
    weight_dimension_numbers: a tree of ``optax.contrib.MuonDimensionNumbers``
      or a callable returning one; ``None`` means every leaf is 2-D.
    fold_level: level of the default policy; ``None`` is ``2``, ``0`` is
      Optax's Muon.
    residual_scale: ``c`` above.
    fold_spec: which momenta to fold how; see :func:`foam_jax.scale_by_foam`.

  Returns:
    An ``optax.GradientTransformation`` with state :class:`FoldedMuonState`.

  Examples:
    >>> import jax.numpy as jnp, foam_jax
    >>> tx = foam_jax.scale_by_folded_muon()
    >>> state = tx.init({"w": jnp.ones((16, 8))})
    >>> state.mu["w"].shape
    (4, 8)
    >>> updates, state = tx.update({"w": jnp.eye(16, 8)}, state)
    >>> updates["w"].shape
    (16, 8)

  References:
    Jordan, `modded-nanogpt: Speedrunning the NanoGPT baseline
    <https://github.com/KellerJordan/modded-nanogpt>`_, 2024

    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  _validation.check_number("beta", beta, low=0.0, high=1.0, high_inclusive=False)
  _validation.check_number("eps", eps, low=0.0)
  fold_level = _validation.fold_level_or_default(fold_level)
  _validation.check_number("residual_scale", residual_scale, low=0.0)
  if preconditioning not in newton_schulz.PRECONDITIONINGS:
    raise ValueError(
        f"preconditioning must be one of {newton_schulz.PRECONDITIONINGS}, got "
        f"{preconditioning!r}.")
  beta, residual_scale = map(_validation.real_part, (beta, residual_scale))
  mu_dtype = _validation.storage_dtype("mu_dtype", mu_dtype)

  def init_fn(params):
    params = _validation.as_arrays(params)
    _validation.check_inexact_leaves(params)
    specs = specs_lib.resolve_fold_specs(params, fold_spec, fold_level)
    (mu,) = moment.map_leaves(
        lambda spec, p: (moment.zeros(spec, p, mu_dtype),), specs, params,
        outputs=1)
    coeffs = jnp.asarray(ns_coeffs)
    if coeffs.ndim > 2 or coeffs.shape[-1] != 3:
      raise ValueError(
          f"ns_coeffs must have shape (3,) or (n, 3), got {coeffs.shape}.")
    if coeffs.ndim == 2:
      if not coeffs.shape[0] <= ns_steps:
        raise ValueError(
            f"ns_coeffs has {coeffs.shape[0]} rows, more than ns_steps="
            f"{ns_steps}.")
      coeffs = coeffs[-ns_steps:]
    # Placed with the params (as the count), so a jitted step's outputs are
    # placed as its inputs and its second call does not recompile.
    coeffs = placement.replicated_zeros(coeffs.shape, coeffs.dtype, params) + coeffs
    return FoldedMuonState(
        count=placement.count_zeros(params), mu=named_scales.stored(params, mu), ns_coeffs=coeffs,
        param_shapes=param_shapes_lib.record(params))

  def update_fn(updates, state, params=None):
    del params
    updates = _validation.as_arrays(updates)
    param_shapes_lib.check(state.param_shapes, updates)
    specs = specs_lib.resolve_fold_specs(updates, fold_spec, fold_level)
    dim_nums = (weight_dimension_numbers(updates)
                if callable(weight_dimension_numbers)
                else weight_dimension_numbers)
    if dim_nums is None:
      dim_nums = jax.tree.map(lambda _: None, specs,
                              is_leaf=specs_lib.is_spec_leaf)
    count = optax.safe_increment(state.count)

    leaves, (mu,) = folded_moments.update_moments(
        updates, specs, [folded_moments.MomentUpdate(state.mu, beta, "mean", "mu")],
        count=count, residual_scale=residual_scale, optax_order=True)

    def read(lm, g):
      """The momentum's read-back ``U m + c R`` and the gradient, whole.

      In the momentum's dtype, as Optax's Muon orthogonalizes it (its
      momentum is stored in that dtype): a bf16 read stays bf16; an 8-bit
      momentum is read in the gradient's dtype.
      """
      fg, (previous,), (mu_read,) = lm.gradient, lm.previous, lm.unfolded
      dtype = (g.dtype if isinstance(previous, quantize.QuantizedMoment)
               else jnp.promote_types(previous.dtype, g.dtype))
      return (fg.unblock(fg.read(mu_read, unfolded=True)).astype(dtype),
              fg.unblock(fg.blocks).astype(dtype))

    m, g = moment.map_leaves(
        lambda _, lm, g: (lm, lm) if not isinstance(lm, folded_moments.LeafMoments)
        else read(lm, g), specs, leaves, updates, outputs=2)
    # From here on, Optax's scale_by_muon on the read-back momentum, tree by
    # tree as Optax does it (so that level 0 is Optax's to the last bit).
    m_hat = moment.first_moment_hat(m, g, beta, count, nesterov)
    new_updates = jax.tree.map(
        lambda x, dim_num: newton_schulz.orthogonalize(
            x, state.ns_coeffs, ns_steps, preconditioning, eps,
            dim_num if is_dim_nums(dim_num) else None),
        m_hat, dim_nums, is_leaf=is_dim_nums)
    if adaptive:
      new_updates = jax.tree.map(
          lambda x, y: jnp.sum(x.conj() * y) * y, m_hat, new_updates)
    updates = jax.tree.map(lambda u, g: u.astype(g.dtype), new_updates,
                           updates)
    return updates, FoldedMuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs,
                                     param_shapes=state.param_shapes)

  return optax.GradientTransformation(init_fn, update_fn)
