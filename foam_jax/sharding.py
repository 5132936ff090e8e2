"""Sharded FOAM states: shardings, restore targets, the fitted layout pinned.

FOAM's folded moments keep their parameter's rank, so each moment takes its
parameter's ``PartitionSpec``, and with no fold block straddling two shards
the update needs no communication. See :mod:`foam_jax._src.sharding`.

Examples:
  >>> import jax, jax.numpy as jnp, foam_jax
  >>> from jax.sharding import NamedSharding, PartitionSpec as P
  >>> mesh = jax.make_mesh((jax.device_count(),), ("x",))
  >>> params = {"w": jax.ShapeDtypeStruct(
  ...     (64, 32), jnp.float32, sharding=NamedSharding(mesh, P("x")))}
  >>> tx = foam_jax.foam(1e-3)
  >>> foam_jax.sharding.abstract_state(tx, params)[0].mu["w"].sharding.spec
  P('x',)
"""

from foam_jax._src.sharding import abstract_state
from foam_jax._src.sharding import fitted_fold_specs
from foam_jax._src.sharding import pin_layout
from foam_jax._src.sharding import state_shardings
from foam_jax._src.sharding import Straddle
from foam_jax._src.sharding import straddling_blocks

__all__ = [
    "Straddle",
    "abstract_state",
    "fitted_fold_specs",
    "pin_layout",
    "state_shardings",
    "straddling_blocks",
]
