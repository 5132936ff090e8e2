"""``foam_muon``: ``optax.contrib.muon`` with folded momenta and moments.

Optax's Muon is a partition: Muon on the hidden matrices, AdamW on every
other leaf. Here both parts keep their moments folded: the matrices'
momentum in :func:`~foam_jax._src.muon.scale_by_folded_muon`, the other
leaves' moments in :func:`~foam_jax._src.transform.scale_by_foam` in
Optax's Adam form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Literal

import jax
import optax

from foam_jax._src import newton_schulz
from foam_jax._src import specs as specs_lib
from foam_jax._src import transform
from foam_jax._src import validation as _validation
from foam_jax._src.muon import DEFAULT_NS_COEFFS
from foam_jax._src.muon import is_dim_nums
from foam_jax._src.muon import matrix_dimension_numbers
from foam_jax._src.muon import PRESETS
from foam_jax._src.muon import scale_by_folded_muon

__all__ = ["foam_muon"]


def foam_muon(
    learning_rate: optax.ScalarOrSchedule,
    ns_coeffs: Any = DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Any | Callable[[optax.Params], Any] | None = None,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Literal[
        "frobenius", "spectral", "aol", "schatten"] = "frobenius",
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps_root: float = 0.0,
    adam_weight_decay: float = 0.0,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: Any = None,
    consistent_rms: float | None = None,
    fold_level: specs_lib.Level | None = None,
    residual_scale: float = 1.0,
    fold_spec: specs_lib.FoldSpecLike = None,
    alpha: float = 1.0,
) -> optax.GradientTransformation:
  r"""Muon with folded momenta: a drop-in replacement for ``optax.contrib.muon``.

  ``optax.partition`` of two chains, as Optax's ``muon``:

  * hidden matrices: :func:`scale_by_folded_muon` (Newton-Schulz on the
    momentum read back from its folded state), Optax's ``scale_by_shape``,
    weight decay, learning rate;
  * every other leaf: AdamW in Optax's form whose moments are folded like
    FOAM's wherever FOAM's default policy would fold them, otherwise plain.

  Default policy: FOAM's. The hidden matrices are FOAM's weight matrices,
  reducing over their input features into their output features
  (``foam_jax._src.muon.matrix_dimension_numbers``: a Flax kernel ``(in,
  out)`` as ``MuonDimensionNumbers(-2, -1)``, an Equinox weight ``(out,
  in)`` as ``(-1, -2)``, a haliax ``Linear`` over its ``In`` axes); momenta
  and moments fold as FOAM's (:class:`foam_jax.FoldPolicy`) at
  ``fold_level``. Muon's state at level 2 is a quarter of
  Optax's. The positional and keyword parameters are ``optax.contrib.muon``'s,
  with its defaults; FOAM's options follow.

  With ``fold_level=0`` and float32 momenta it equals
  ``optax.contrib.muon(..., muon_weight_dimension_numbers=matrix_dimension_numbers)``
  bit for bit. With a 16-bit momentum (``mu_dtype``, or 16-bit params) it
  orthogonalizes the momentum as stored, rounded to that dtype, where Optax
  orthogonalizes it before rounding: the two differ by about that rounding
  (a relative ``2**-8`` of the update for bfloat16).

  Sharding: the states are sharded like their params and the AdamW part
  and the momentum updates need no collectives; Newton-Schulz needs whole
  matrices, as Optax's Muon does, so a sharded hidden matrix costs the
  collectives of its matrix products ``M M^T`` (all-gathers or
  all-reduces, per step of the iteration).

  Args:
    learning_rate: a float or an Optax schedule.
    ns_coeffs: Newton-Schulz coefficients, or a preset name (``"standard"``,
      ``"dion"``).
    ns_steps: number of Newton-Schulz iterations.
    beta: decay of the momentum.
    eps: Newton-Schulz's and AdamW's denominator term.
    weight_decay: Muon's weight decay.
    weight_decay_mask: which leaves get Muon's weight decay.
    mu_dtype: storage dtype of the first moments; ``jnp.int8`` stores them
      blockwise-quantized in 8 bits (:class:`foam_jax.QuantizedMoments`).
    nesterov: Nesterov momentum (Muon's and AdamW's).
    adaptive: Optax's adaptive scaling.
    preconditioning: Optax's Newton-Schulz preconditioning.
    adam_b1: AdamW's first-moment decay.
    adam_b2: AdamW's second-moment decay.
    adam_eps_root: AdamW's ``eps_root``.
    adam_weight_decay: AdamW's weight decay.
    adam_learning_rate: AdamW's learning rate (default: ``learning_rate``).
    muon_weight_dimension_numbers: a tree of ``MuonDimensionNumbers | None``
      (``None``: AdamW) or a callable returning one; ``None`` is FOAM's
      matrix rule (above).
    consistent_rms: Optax's consistent-RMS scaling (``None``: width scaling).
    fold_level: blocks hold ``2**fold_level`` entries; ``None`` is ``2``.
      Under ``optax.inject_hyperparams`` an explicit level needs
      ``static_args=("fold_level",)``.
    residual_scale: weight of the gradient residual in every read.
    fold_spec: which leaves to fold how (both parts); see
      :func:`foam_jax.scale_by_foam`.
    alpha: scale of the AdamW part's folded leaves' updates.

  Returns:
    An ``optax.GradientTransformation``.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, foam_jax
    >>> params = {"w": jnp.ones((16, 8)), "b": jnp.zeros((8,))}
    >>> tx = foam_jax.foam_muon(1e-2)
    >>> state = tx.init(params)
    >>> grads = jax.grad(lambda p: jnp.sum((p["w"] @ jnp.ones(8) - p["b"][0]) ** 2))(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)

  References:
    Jordan, `modded-nanogpt: Speedrunning the NanoGPT baseline
    <https://github.com/KellerJordan/modded-nanogpt>`_, 2024

    Wen et al., `FOAM: Blocked State Folding for Memory-Efficient LLM
    Training <https://arxiv.org/abs/2512.07112>`_, 2025.
  """
  for name, value in (("learning_rate", learning_rate),
                      ("weight_decay", weight_decay),
                      ("adam_weight_decay", adam_weight_decay)):
    _validation.check_number(name, value, low=0.0, allow_callable=True)
  if adam_learning_rate is not None:
    _validation.check_number("adam_learning_rate", adam_learning_rate, low=0.0,
                             allow_callable=True)
  _validation.check_number("beta", beta, low=0.0, high=1.0, high_inclusive=False)
  _validation.check_count("ns_steps", ns_steps)
  _validation.check_bool("nesterov", nesterov)
  for name, value in (("adam_b1", adam_b1), ("adam_b2", adam_b2)):
    _validation.check_number(name, value, low=0.0, high=1.0, high_inclusive=False)
  for name, value in (("eps", eps), ("adam_eps_root", adam_eps_root), ("alpha", alpha),
                      ("residual_scale", residual_scale)):
    _validation.check_number(name, value, low=0.0)
  if adam_learning_rate is None:
    adam_learning_rate = learning_rate
  if isinstance(ns_coeffs, str):
    if ns_coeffs not in PRESETS:
      raise ValueError(
          f"ns_coeffs preset must be one of {sorted(PRESETS)}, got "
          f"{ns_coeffs!r}.")
    ns_coeffs = PRESETS[ns_coeffs]
  if muon_weight_dimension_numbers is None:
    muon_weight_dimension_numbers = matrix_dimension_numbers

  def resolve_dim_nums(params):
    if callable(muon_weight_dimension_numbers):
      return muon_weight_dimension_numbers(params)
    return muon_weight_dimension_numbers

  def is_dim_leaf(x):
    return x is None or is_dim_nums(x) or isinstance(x, optax.MaskedNode)

  def param_labels(params):
    # Dimension numbers come first: they may be a prefix of the params.
    return jax.tree.map(
        lambda dim_num, x: jax.tree.map(
            lambda _: "adam" if dim_num is None else "muon", x),
        resolve_dim_nums(params), params, is_leaf=is_dim_leaf)

  def muon_dim_nums(params):
    # Shaped like the muon partition's (masked) tree: MaskedNode elsewhere.
    return jax.tree.map(
        lambda dim_num, x: jax.tree.map(
            lambda label: dim_num if label == "muon" else optax.MaskedNode(),
            x),
        resolve_dim_nums(params), param_labels(params), is_leaf=is_dim_leaf)

  return optax.partition(
      transforms={
          "muon": optax.chain(
              scale_by_folded_muon(
                  ns_coeffs=ns_coeffs,
                  ns_steps=ns_steps,
                  beta=beta,
                  eps=eps,
                  mu_dtype=mu_dtype,
                  nesterov=nesterov,
                  adaptive=adaptive,
                  preconditioning=preconditioning,
                  weight_dimension_numbers=muon_dim_nums,
                  fold_level=fold_level,
                  residual_scale=residual_scale,
                  fold_spec=fold_spec,
              ),
              newton_schulz.scale_by_shape(
                  weight_dimension_numbers=muon_dim_nums,
                  consistent_rms=consistent_rms,
              ),
              optax.add_decayed_weights(
                  weight_decay, _validation.checked_mask(weight_decay_mask, "weight_decay_mask")),
              optax.scale_by_learning_rate(learning_rate),
          ),
          "adam": optax.chain(
              transform.scale_by_foam(
                  adam_b1,
                  adam_b2,
                  eps,
                  adam_eps_root,
                  mu_dtype,
                  nesterov=nesterov,
                  fold_level=fold_level,
                  alpha=alpha,
                  residual_scale=residual_scale,
                  fold_spec=fold_spec,
                  bias_correction="moments",
              ),
              optax.add_decayed_weights(adam_weight_decay),
              optax.scale_by_learning_rate(adam_learning_rate),
          ),
      },
      param_labels=param_labels,
  )
