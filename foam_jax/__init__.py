"""foam_jax: FOAM, Adam with folded moments, as an Optax optimizer.

Replace ``optax.adamw(lr)`` with ``foam_jax.foam(lr)``: same training loop,
75-90% less optimizer state on the model's matrices.

Public API:

* optimizers: :func:`foam` (``optax.adamw``'s signature), :func:`foam_mini`,
  and the transformation :func:`scale_by_foam` with its state
  :class:`ScaleByFoamState`;
* folding beyond Adam: :func:`foam_muon` (``optax.contrib.muon``'s
  signature) with :func:`scale_by_folded_muon`, :func:`foam_lion`
  (``optax.lion``'s) with :func:`scale_by_folded_lion`;
* moving a running job onto folded moments: :func:`convert_state`;
* what to fold: :class:`FoldSpec`, :func:`default_fold_specs`;
* the paper's learning-rate schedule: :func:`paper_schedule`;
* memory planning: :func:`state_bytes`; 8-bit moments
  (``mu_dtype=nu_dtype=jnp.int8``) are stored as :class:`QuantizedMoment`
  (second moments) and :class:`SignedQuantizedMoment` (first moments);
* sharded states and restore targets: the :mod:`foam_jax.sharding`
  namespace.
"""

import importlib as _importlib
import warnings as _warnings

from foam_jax import sharding
from foam_jax._src.alias import foam
from foam_jax._src.alias import foam_mini
from foam_jax._src.alias import paper_schedule
from foam_jax._src.convert import convert_state
from foam_jax._src.lion import foam_lion
from foam_jax._src.lion import scale_by_folded_lion
from foam_jax._src.memory import state_bytes
from foam_jax._src.muon import foam_muon
from foam_jax._src.muon import scale_by_folded_muon
from foam_jax._src.quantize import QuantizedMoment
from foam_jax._src.quantize import SignedQuantizedMoment
from foam_jax._src.specs import default_fold_specs
from foam_jax._src.specs import FoldSpec
from foam_jax._src.transform import scale_by_foam
from foam_jax._src.transform import ScaleByFoamState

__version__ = "0.2.0"

__all__ = [
    "FoldSpec",
    "QuantizedMoment",
    "ScaleByFoamState",
    "SignedQuantizedMoment",
    "convert_state",
    "default_fold_specs",
    "foam",
    "foam_lion",
    "foam_mini",
    "foam_muon",
    "paper_schedule",
    "scale_by_foam",
    "scale_by_folded_lion",
    "scale_by_folded_muon",
    "sharding",
    "state_bytes",
]

# Names that left the top level in 0.2.0: they keep working, with a
# DeprecationWarning, until 0.3.0. Name -> (module, attribute, replacement).
_DEPRECATED = {
    "abstract_state": ("foam_jax._src.sharding", "abstract_state",
                       "foam_jax.sharding.abstract_state"),
    "state_shardings": ("foam_jax._src.sharding", "state_shardings",
                        "foam_jax.sharding.state_shardings"),
    "fitted_fold_specs": ("foam_jax._src.sharding", "fitted_fold_specs",
                          "foam_jax.sharding.fitted_fold_specs"),
    "straddling_blocks": ("foam_jax._src.sharding", "straddling_blocks",
                          "foam_jax.sharding.straddling_blocks"),
    "count_collectives": ("foam_jax._src.hlo", "count_collectives",
                          "a count of collective opcodes in compiled.as_text()"),
    "tree_bytes": ("foam_jax._src.memory", "tree_bytes",
                   "foam_jax.state_bytes, or sum(x.nbytes for x in leaves)"),
    "fold": ("foam_jax._src.folding", "fold", "no public replacement"),
    "unfold": ("foam_jax._src.folding", "unfold", "no public replacement"),
    "residual": ("foam_jax._src.folding", "residual", "no public replacement"),
    "WHOLE_AXIS_LEVEL": ("foam_jax._src.folding", "WHOLE_AXIS_LEVEL",
                         "foam_jax.foam_mini"),
    # Former public modules, now private.
    "folding": ("foam_jax._src.folding", None, "no public replacement"),
    "specs": ("foam_jax._src.specs", None, "foam_jax.FoldSpec and "
              "foam_jax.default_fold_specs"),
    "transform": ("foam_jax._src.transform", None, "foam_jax.scale_by_foam"),
    "alias": ("foam_jax._src.alias", None, "foam_jax.foam"),
    "memory": ("foam_jax._src.memory", None, "foam_jax.state_bytes"),
}


def __getattr__(name):
  if name not in _DEPRECATED:
    raise AttributeError(f"module 'foam_jax' has no attribute {name!r}")
  module_name, attribute, replacement = _DEPRECATED[name]
  _warnings.warn(
      f"foam_jax.{name} is deprecated and will be removed in foam_jax 0.3.0; "
      f"use {replacement}.",
      DeprecationWarning,
      stacklevel=2,
  )
  module = _importlib.import_module(module_name)
  return module if attribute is None else getattr(module, attribute)
