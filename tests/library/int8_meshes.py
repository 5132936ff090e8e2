"""The 2 x 4 mesh and sharded params the int8 sharding tests share (library and clients)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def mesh(axis_type=AxisType.Explicit):
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)


def sharded_params(mesh, narrow=True):
  """A (64, 2048) weight over both axes, a bias over ``model`` and, if
  ``narrow``, a (64,) vector over ``data`` (too short for 256-entry blocks)."""
  return {
      "w": jax.device_put(jnp.asarray(
          np.random.default_rng(6).standard_normal((64, 2048)), jnp.float32),
          NamedSharding(mesh, P("data", "model"))),
      "b": jax.device_put(jnp.ones((2048,)), NamedSharding(mesh, P("model"))),
      **({"n": jax.device_put(jnp.ones((64,)), NamedSharding(mesh, P("data")))}
         if narrow else {}),
  }
