"""FOAM, folded Lion and folded Muon as Levanter ``OptimizerConfig`` s.

Imported by :mod:`foam_jax.levanter` when Levanter is installed; importing
this module registers ``foam``, ``foam_lion`` and ``foam_muon`` with
``levanter.optim.OptimizerConfig`` (a ``draccus.ChoiceRegistry``), so that a
config file selects them as ``optimizer: {type: foam, ...}``.

Each takes Levanter's standard optimizer fields (``learning_rate``,
``weight_decay`` and its module mask ``weight_decay_modules`` /
``default_weight_decay_mask``, ``lr_schedule``, ``warmup``, ``decay``,
``rewarmup``, ``cycles``, ``min_lr_ratio``, ``cooldown``), builds its
schedule with Levanter's ``lr_scheduler``, clips by ``max_grad_norm`` and
decays weights as Levanter's ``AdamConfig`` does, and logs the learning rate
through ``optax.inject_hyperparams``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Literal

import haliax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from levanter.optim.config import OptimizerConfig

from foam_jax import sharding
from foam_jax._src import lion
from foam_jax._src import muon
from foam_jax._src import muon_alias
from foam_jax._src import transform

__all__ = ["FoamConfig", "FoamLionConfig", "FoamMuonConfig"]


def _dtype(name: str | None) -> Any:
  """A storage dtype from a config string (``"int8"``, ``"bfloat16"``; ``None``: default)."""
  return None if name in (None, "", "none") else jnp.dtype(name)


def _level(level: int | str) -> int | str:
  return level if level == "whole_axis" else int(level)


def _named_layout(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` whose ``init`` lays the state out for the params' named shardings.

  Levanter initialises the optimizer under ``jit`` with automatic mesh axes,
  where the params' shardings are hidden from ``init``; haliax's axis
  mapping names them. So ``init`` gives each ``NamedArray`` the sharding the
  current mapping implies (replicated if it maps none of its axes) and
  builds the state for those, as ``foam_jax.sharding.pin_layout`` does for
  given shardings: folds and int8 blocks inside shards.
  """

  def init(params):
    mapping = haliax.partitioning.current_thread_local_mapping()
    mesh = jax.sharding.get_abstract_mesh()
    if not mapping or mesh is None or mesh.empty:
      return tx.init(params)

    def placed(x):
      if haliax.is_named_array(x):
        if not jax.tree.leaves(x):
          return x  # Absent (optax.MaskedNode inside).
        spec = haliax.partitioning.pspec_for_axis(x.axis_names, mapping)
        return haliax.NamedArray(jax.ShapeDtypeStruct(
            x.array.shape, x.array.dtype, sharding=NamedSharding(mesh, spec)), x.axis_names)
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P()))

    abstract = jax.tree.map(placed, params, is_leaf=haliax.is_named_array)
    return sharding.pin_layout(tx, abstract).init(params)

  return tx._replace(init=init)


def _is_muon_matrix(value: bool):
  """A mask: ``value`` on foam_muon's Muon matrices, ``not value`` elsewhere."""

  def mask(params):
    dims = muon.matrix_dimension_numbers(params)
    return jax.tree.map(lambda _, d: (d is not None) == value, params, dims)

  return mask


def _masked(inner: optax.GradientTransformation, mask: Any) -> optax.GradientTransformation:
  return inner if mask is None else optax.masked(inner, mask)


def _adam_like_chain(config: Any, num_train_steps: int,
                     direction: optax.GradientTransformation) -> optax.GradientTransformation:
  """Levanter's AdamConfig chain around ``direction``: clip, decay (with the
  module mask), the scheduled learning rate logged by inject_hyperparams."""

  def optimizer(learning_rate):
    parts = [optax.clip_by_global_norm(config.max_grad_norm)] if config.max_grad_norm else []
    parts.append(direction)
    if config.weight_decay > 0:
      parts.append(optax.add_decayed_weights(config.weight_decay,
                                             config.build_weight_decay_mask()))
    parts.append(optax.scale(-learning_rate))
    return optax.chain(*parts)

  return _named_layout(optax.inject_hyperparams(optimizer)(
      learning_rate=config.lr_scheduler(num_train_steps)))


@OptimizerConfig.register_subclass("foam")
@dataclass(frozen=True)
class FoamConfig(OptimizerConfig):
  """``foam_jax.foam`` in Levanter: AdamConfig's fields and FOAM's options.

  ``fold_level``: 2 by default, ``"whole_axis"`` for FOAM-Mini; ``alpha``
  scales the folded leaves' updates (the paper's recipe: 0.25 at a learning
  rate of 1e-2); ``mu_dtype``/``nu_dtype``: ``"int8"`` stores a moment in 8
  bits, ``"bfloat16"`` in 16; ``bias_correction``: ``"step_size"`` (the
  authors' form), ``"moments"`` (Optax's ``scale_by_adam``, which
  ``AdamConfig`` uses: at ``fold_level=0, alpha=1`` this config then steps
  exactly as ``AdamConfig``) or ``"folded_moments"`` (the folded moments
  corrected before the residual is added: ``foam_jax.scale_by_foam``).
  """

  beta1: float = 0.9
  beta2: float = 0.95
  epsilon: float = 1e-8
  max_grad_norm: float | None = 1.0
  nesterov: bool = False
  fold_level: int | str = 2
  alpha: float = 1.0
  residual_scale: float = 1.0
  mu_dtype: str | None = None
  nu_dtype: str | None = None
  bias_correction: Literal["step_size", "moments", "folded_moments"] = "step_size"

  def build(self, num_train_steps: int) -> optax.GradientTransformation:
    return _adam_like_chain(self, num_train_steps, transform.scale_by_foam(
        self.beta1, self.beta2, self.epsilon, mu_dtype=_dtype(self.mu_dtype),
        nu_dtype=_dtype(self.nu_dtype), nesterov=self.nesterov,
        fold_level=_level(self.fold_level), alpha=self.alpha,
        residual_scale=self.residual_scale, bias_correction=self.bias_correction))


@OptimizerConfig.register_subclass("foam_lion")
@dataclass(frozen=True)
class FoamLionConfig(OptimizerConfig):
  """Folded Lion (``foam_jax.scale_by_folded_lion``) with LionConfig's fields."""

  beta1: float = 0.9
  beta2: float = 0.95
  max_grad_norm: float | None = 1.0
  fold_level: int | str = 2
  residual_scale: float = 1.0
  mu_dtype: str | None = None

  def build(self, num_train_steps: int) -> optax.GradientTransformation:
    return _adam_like_chain(self, num_train_steps, lion.scale_by_folded_lion(
        self.beta1, self.beta2, _dtype(self.mu_dtype), fold_level=_level(self.fold_level),
        residual_scale=self.residual_scale))


@OptimizerConfig.register_subclass("foam_muon")
@dataclass(frozen=True)
class FoamMuonConfig(OptimizerConfig):
  """``foam_jax.foam_muon`` with MuonConfig's fields.

  ``learning_rate`` (and its schedule) steps Muon's matrices: haliax
  ``Linear`` weights, reducing over their ``In`` axes, except the
  embeddings and ``lm_head``; ``adam_lr`` on the same schedule steps AdamW
  on every other parameter. ``use_kimi_scaling`` scales Muon's updates by
  ``0.2 sqrt(max(fan_in, fan_out))`` instead of ``sqrt(max(1, fan_out /
  fan_in))``.
  """

  learning_rate: float = 0.02
  adam_lr: float = 6e-4
  momentum: float = 0.95
  nesterov: bool = True
  backend_steps: int = 5
  weight_decay: float = 0.0
  adam_weight_decay: float | None = None
  beta1: float = 0.9
  beta2: float = 0.95
  epsilon: float = 1e-8
  max_grad_norm: float | None = 1.0
  use_kimi_scaling: bool = False
  fold_level: int | str = 2
  residual_scale: float = 1.0
  mu_dtype: str | None = None

  def build(self, num_train_steps: int) -> optax.GradientTransformation:
    adam_decay = self.weight_decay if self.adam_weight_decay is None else self.adam_weight_decay

    def optimizer(learning_rate, adam_lr):
      parts = [optax.clip_by_global_norm(self.max_grad_norm)] if self.max_grad_norm else []
      parts.append(muon_alias.foam_muon(
          learning_rate, ns_steps=self.backend_steps, beta=self.momentum, eps=self.epsilon,
          mu_dtype=_dtype(self.mu_dtype), nesterov=self.nesterov, adam_b1=self.beta1,
          adam_b2=self.beta2, adam_learning_rate=adam_lr,
          consistent_rms=0.2 if self.use_kimi_scaling else None,
          fold_level=_level(self.fold_level), residual_scale=self.residual_scale))
      # Weight decay after the partition, each part at its own rate and lr
      # (-lr wd W, as foam_muon's own decay): Levanter's module mask reads the
      # whole model, which a mask inside optax.partition would not get.
      for decay, lr, muon_part in ((self.weight_decay, learning_rate, True),
                                   (adam_decay, adam_lr, False)):
        if decay > 0:
          parts.append(_masked(optax.masked(optax.add_decayed_weights(-lr * decay),
                                            _is_muon_matrix(muon_part)),
                               self.build_weight_decay_mask()))
      return optax.chain(*parts)

    return _named_layout(optax.inject_hyperparams(optimizer)(
        learning_rate=self.lr_scheduler(num_train_steps),
        adam_lr=self.lr_scheduler(num_train_steps, override_lr=self.adam_lr)))
