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
* what to fold: :class:`FoldSpec`, :class:`FoldPolicy`, :func:`default_fold_specs`;
* the paper's learning-rate schedule: :func:`paper_schedule`;
* memory planning: :func:`state_bytes`; 8-bit moments
  (``mu_dtype=nu_dtype=jnp.int8``) are stored as :class:`QuantizedMoments`
  (a tree of int8 codes and a tree of float32 scales);
* sharded states and restore targets: the :mod:`foam_jax.sharding`
  namespace.
"""

from foam_jax import sharding
from foam_jax._src.alias import foam
from foam_jax._src.alias import foam_mini
from foam_jax._src.alias import paper_schedule
from foam_jax._src.convert import convert_state
from foam_jax._src.fold_policy import FoldPolicy
from foam_jax._src.lion import foam_lion
from foam_jax._src.lion import scale_by_folded_lion
from foam_jax._src.memory import state_bytes
from foam_jax._src.muon import scale_by_folded_muon
from foam_jax._src.muon_alias import foam_muon
from foam_jax._src.quantized_state import QuantizedMoments
from foam_jax._src.specs import default_fold_specs
from foam_jax._src.specs import FoldSpec
from foam_jax._src.transform import scale_by_foam
from foam_jax._src.transform import ScaleByFoamState

__version__ = "0.3.0.dev0"

__all__ = [
    "FoldPolicy",
    "FoldSpec",
    "QuantizedMoments",
    "ScaleByFoamState",
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
