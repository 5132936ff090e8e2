"""Device meshes from ``--mesh fsdp=2,tp=4`` and shardings for the state.

The model's weights carry ``PartitionSpec``s over the axes ``("fsdp", "tp")``
(``model.SHARDING``). Arrays whose dimensions a mesh axis does not divide
(e.g. a folded FOAM state of a few rows) are replicated along that axis
instead of failing.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["AXES", "batch_sharding", "fit_spec", "make_mesh", "parse_mesh",
           "variable_shardings"]

AXES = ("fsdp", "tp")


def parse_mesh(spec: str | None, num_devices: int) -> dict[str, int]:
  """Parses ``"fsdp=2,tp=4"`` into axis sizes; ``-1`` takes what is left.

  Missing axes have size 1; ``None`` or ``""`` is a single device.

  Examples:
    >>> parse_mesh("fsdp=2,tp=4", 8)
    {'fsdp': 2, 'tp': 4}
    >>> parse_mesh("fsdp=-1", 8)
    {'fsdp': 8, 'tp': 1}
    >>> parse_mesh(None, 8)
    {'fsdp': 1, 'tp': 1}
  """
  sizes = {axis: 1 for axis in AXES}
  if not spec:
    return sizes
  fill = None
  for part in spec.split(","):
    name, sep, value = part.partition("=")
    name = name.strip()
    if not sep or name not in AXES:
      raise ValueError(
          f"--mesh: cannot parse {part!r} in {spec!r}; expected e.g. "
          f"'fsdp=2,tp=4' with axes {AXES}."
      )
    try:
      size = int(value)
    except ValueError:
      raise ValueError(f"--mesh: size of {name!r} must be an int, got {value!r}.") from None
    if size == -1:
      if fill is not None:
        raise ValueError("--mesh: at most one axis may be -1.")
      fill = name
    elif size < 1:
      raise ValueError(f"--mesh: size of {name!r} must be >= 1 or -1, got {size}.")
    else:
      sizes[name] = size
  if fill is not None:
    rest = math.prod(v for k, v in sizes.items() if k != fill)
    if num_devices % rest:
      raise ValueError(
          f"--mesh {spec!r}: {num_devices} devices are not divisible by {rest}."
      )
    sizes[fill] = num_devices // rest
  total = math.prod(sizes.values())
  if total > num_devices:
    raise ValueError(
        f"--mesh {spec!r} needs {total} devices but only {num_devices} exist "
        "(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
        "simulates N)."
    )
  return sizes


def make_mesh(sizes: dict[str, int], devices=None) -> Mesh:
  """``jax.make_mesh`` over the first ``prod(sizes)`` devices, axes ``AXES``.

  The axes are ``Auto``: the weights' annotations and ``jit`` place arrays.

  Examples:
    >>> make_mesh({"fsdp": 1, "tp": 1}).axis_names
    ('fsdp', 'tp')
  """
  return jax.make_mesh(tuple(sizes[a] for a in AXES), AXES,
                       (AxisType.Auto,) * len(AXES), devices=devices)


def fit_spec(shape: tuple[int, ...], spec: P, mesh: Mesh) -> P:
  """``spec`` without the mesh axes that do not divide their dimension.

  A spec whose rank differs from the array's (e.g. an Adafactor factor that
  inherited its matrix's annotation) replicates the array.

  Examples:
    >>> mesh = jax.sharding.AbstractMesh((2, 4), AXES)
    >>> fit_spec((8, 6), P("fsdp", "tp"), mesh)
    P('fsdp', None)
    >>> fit_spec((6,), P("fsdp", "tp"), mesh)
    P()
  """
  if len(spec) != len(shape):
    return P()
  entries = list(spec)
  fitted = []
  for dim, entry in zip(shape, entries):
    names = (entry,) if isinstance(entry, str) else tuple(entry or ())
    size = math.prod(mesh.shape[n] for n in names)
    fitted.append(entry if dim % size == 0 else None)
  return P(*fitted)


def variable_shardings(state: Any, mesh: Mesh) -> Any:
  """``NamedSharding``s for an ``nnx.State`` from its variables' annotations.

  A variable's ``PartitionSpec`` comes from its sharding metadata (set by
  ``nnx.with_partitioning`` and copied onto optimizer states by
  ``nnx.Optimizer``), fitted to its shape by :func:`fit_spec`; other arrays
  are replicated. Empty nodes (``optax.MaskedNode``) are kept.
  """

  def one(x):
    value = x.get_value() if isinstance(x, nnx.Variable) else x
    if not hasattr(value, "shape"):  # e.g. a MaskedNode: no arrays inside.
      return x
    if not isinstance(x, nnx.Variable):
      return NamedSharding(mesh, P())
    spec = P(*(nnx.spmd.get_var_pspec(x) or ()))
    return x.replace(NamedSharding(mesh, fit_spec(tuple(value.shape), spec, mesh)))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches split over ``fsdp`` (data parallel), replicated over ``tp``."""
  return NamedSharding(mesh, P("fsdp"))
