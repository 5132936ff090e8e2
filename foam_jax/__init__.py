"""foam_jax: FOAM, Adam with folded moments, as an Optax optimizer.

Replace ``optax.adamw(lr)`` with ``foam_jax.foam(lr)``: same training loop,
75-90% less optimizer state on the model's matrices.
"""

from foam_jax.alias import foam
from foam_jax.alias import foam_mini
from foam_jax.alias import paper_schedule
from foam_jax.folding import fold
from foam_jax.folding import residual
from foam_jax.folding import unfold
from foam_jax.folding import WHOLE_AXIS_LEVEL
from foam_jax.memory import state_bytes
from foam_jax.memory import tree_bytes
from foam_jax import sharding
from foam_jax.sharding import abstract_state
from foam_jax.sharding import count_collectives
from foam_jax.sharding import fitted_fold_specs
from foam_jax.sharding import state_shardings
from foam_jax.sharding import straddling_blocks
from foam_jax.specs import default_fold_specs
from foam_jax.specs import FoldSpec
from foam_jax.transform import scale_by_foam
from foam_jax.transform import ScaleByFoamState

__version__ = "0.1.0"

__all__ = [
    "FoldSpec",
    "ScaleByFoamState",
    "WHOLE_AXIS_LEVEL",
    "abstract_state",
    "count_collectives",
    "default_fold_specs",
    "fitted_fold_specs",
    "foam",
    "foam_mini",
    "fold",
    "paper_schedule",
    "residual",
    "scale_by_foam",
    "sharding",
    "state_shardings",
    "state_bytes",
    "straddling_blocks",
    "tree_bytes",
    "unfold",
]
