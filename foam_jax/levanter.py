"""FOAM in Levanter's optimizer registry: ``import foam_jax.levanter``.

Importing this module registers three optimizers with Levanter's
``OptimizerConfig`` registry, so a Levanter config selects them by name:

.. code-block:: yaml

  optimizer:
    type: foam          # or foam_lion, foam_muon
    learning_rate: 1e-2
    alpha: 0.25
    weight_decay: 0.1
    warmup: 0.1
    mu_dtype: int8      # optional: 8-bit moments
    nu_dtype: int8

* ``foam``: :class:`FoamConfig`, ``foam_jax.foam`` with the fields of
  Levanter's ``AdamConfig`` (``beta1``, ``beta2``, ``epsilon``,
  ``max_grad_norm``, ``nesterov``) and FOAM's (``fold_level``, ``alpha``,
  ``residual_scale``, ``mu_dtype``, ``nu_dtype``);
* ``foam_lion``: :class:`FoamLionConfig`, folded Lion;
* ``foam_muon``: :class:`FoamMuonConfig`, folded Muon with the fields of
  Levanter's ``MuonConfig``.

All three take Levanter's standard fields: ``learning_rate``,
``weight_decay`` with its module mask, ``lr_schedule``, ``warmup``,
``decay``, ``min_lr_ratio``, ``cooldown`` and cycles.

This module imports without Levanter installed (nothing is registered
then, and the config classes raise ``ImportError``); with it installed, the
import registers them.

Examples:
  >>> import foam_jax.levanter
  >>> foam_jax.levanter.is_available() in (True, False)
  True
"""

from __future__ import annotations

import importlib.util
from typing import Any
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from foam_jax._src.levanter_configs import FoamConfig
  from foam_jax._src.levanter_configs import FoamLionConfig
  from foam_jax._src.levanter_configs import FoamMuonConfig

__all__ = ["FoamConfig", "FoamLionConfig", "FoamMuonConfig", "is_available", "register"]

_CONFIGS = ("FoamConfig", "FoamLionConfig", "FoamMuonConfig")


def is_available() -> bool:
  """Whether Levanter can be imported here."""
  return importlib.util.find_spec("levanter") is not None


def register() -> None:
  """Registers ``foam``, ``foam_lion`` and ``foam_muon`` with Levanter (idempotent).

  Raises:
    ImportError: Levanter is not installed.
  """
  if not is_available():
    raise ImportError("foam_jax.levanter needs Levanter: pip install marin-levanter "
                      "(foam_jax's `levanter` extra pins the version it is tested with).")
  importlib.import_module("foam_jax._src.levanter_configs")


def __getattr__(name: str) -> Any:
  if name in _CONFIGS:
    register()
    return getattr(importlib.import_module("foam_jax._src.levanter_configs"), name)
  raise AttributeError(f"module 'foam_jax.levanter' has no attribute {name!r}")


if is_available():
  register()
