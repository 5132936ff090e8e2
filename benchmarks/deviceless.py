"""Compiling for an H100 or a TPU on a machine without one, and what it counts.

JAX compiles for a GPU or TPU that is not attached when it is given the
target's devices: the CUDA plugin reads a description of the GPU
(``benchmarks/targets/h100_sxm5_80gb.txtpb``, a ``GpuTargetConfigProto``
written from NVIDIA's published figures) and libtpu knows its chips by
topology name. The result cannot run, but its fusions, layouts, temporaries
and byte counts are the target compiler's:

* :func:`devices` gives the target's devices (``"h100"``, ``"v5e"``,
  ``"v5p"``, ``"v6e"``), one or eight;
* :func:`counts` reads a compiled program: the bytes its top-level kernels
  read and write (the compiler's cost analysis; for a compile-only GPU
  executable, XLA's generic analysis of the optimized module, the same
  accounting), its temporaries, its kernels (top-level fusions and custom
  calls) and its cross-device collectives.

The GPU cost analysis goes through a private JAX entry point
(``jax._src.lib._jax.hlo_module_cost_analysis``): it is checked against
:data:`TESTED_JAX` and fails with a clear error where it moved.

Run with ``JAX_PLATFORMS=cpu`` (the CUDA plugin cannot initialise without a
GPU); :func:`configure_environment` sets it and libtpu's quiet start before
JAX is imported.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

__all__ = ["CHIPS", "TARGETS", "TESTED_JAX", "configure_environment", "devices",
           "counts", "kernel_count", "pallas_kernel_bytes"]

_HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = os.path.join(_HERE, "targets")

# Chip name -> (platform, the topology one chip is taken from (libtpu names no
# single-chip topology), the 8-chip topology, memory bytes, label).
# TPU memory per chip: Google Cloud's TPU documentation (v5e 16 GiB HBM2,
# v5p 95 GiB HBM2e, v6e 32 GiB HBM); H100 SXM5: 80 GB (NVIDIA's datasheet).
CHIPS: dict[str, dict[str, Any]] = {
    "h100": {"platform": "cuda", "one": "1x1x1", "eight": "1x1x8",
             "memory": 80 * 2**30, "label": "H100 SXM5 80 GB (XLA GPU, CUDA plugin)"},
    "v5e": {"platform": "tpu", "one": "v5e:2x2", "eight": "v5e:2x4",
            "memory": 16 * 2**30, "label": "TPU v5e (libtpu)"},
    "v5p": {"platform": "tpu", "one": "v5p:2x2x1", "eight": "v5p:2x2x2",
            "memory": 95 * 2**30, "label": "TPU v5p (libtpu)"},
    "v6e": {"platform": "tpu", "one": "v6e:2x2", "eight": "v6e:2x4",
            "memory": 32 * 2**30, "label": "TPU v6e (libtpu)"},
}

# The jax release whose private GPU cost-analysis entry point this uses.
TESTED_JAX = ("0.10.2",)

_TPU_ACCELERATOR = {"v5e": "v5litepod-8", "v5p": "v5p-8", "v6e": "v6e-8"}


def configure_environment(chip: str | None = None) -> None:
  """Environment for a deviceless compile; call before ``import jax``.

  ``JAX_PLATFORMS=cpu`` keeps the CUDA plugin from looking for a GPU; libtpu
  is told it is on no TPU VM (no metadata query) and may be loaded by
  several processes.
  """
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  if chip in _TPU_ACCELERATOR:
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", _TPU_ACCELERATOR[chip])


def target_config(name: str = "h100_sxm5_80gb") -> str:
  """The text of a GPU target description in ``benchmarks/targets``."""
  with open(os.path.join(TARGETS, f"{name}.txtpb")) as f:
    return f.read()


@functools.cache
def devices(chip: str, count: int = 1) -> tuple[Any, ...]:
  """The devices of ``count`` (1 or 8) ``chip`` s, for a compile-only mesh."""
  from jax.experimental import topologies  # noqa: PLC0415 (after configure_environment)

  if chip not in CHIPS:
    raise ValueError(f"chip must be one of {tuple(CHIPS)}, got {chip!r}.")
  if count not in (1, 8):
    raise ValueError(f"count must be 1 or 8, got {count!r}.")
  spec = CHIPS[chip]
  topology = spec["one"] if count == 1 else spec["eight"]
  if spec["platform"] == "cuda":
    desc = topologies.get_topology_desc(
        platform="cuda", target_config=target_config(), topology=topology)
  else:
    desc = topologies.get_topology_desc(topology_name=topology, platform="tpu")
  found = tuple(desc.devices)[:count]
  if len(found) != count:
    raise RuntimeError(f"{chip} topology {topology!r} gave {len(found)} devices, not {count}.")
  return found


def _gpu_cost(compiled) -> dict[str, float]:
  import jax  # noqa: PLC0415

  if jax.__version__ not in TESTED_JAX:
    raise RuntimeError(
        f"benchmarks.deviceless reads GPU costs through a private JAX API tested "
        f"with jax {TESTED_JAX}; this is jax {jax.__version__}. Install a tested "
        "version or check that jax._src.lib._jax.hlo_module_cost_analysis still "
        "takes (client, hlo_module).")
  from jax._src.lib import _jax  # noqa: PLC0415

  module = compiled._executable.xla_extension_executable().hlo_modules()[0]
  return dict(_jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module))


_KERNEL_RE = re.compile(r"^\s+(?:ROOT\s+)?%\S+ = .*? (fusion|custom-call)\(")


def kernel_count(hlo_text: str) -> int:
  """Top-level fusions and custom calls of an optimized module's entry.

  Examples:
    >>> kernel_count("ENTRY %main {\\n  %f = f32[2] fusion(%p), kind=kLoop\\n}")
    1
  """
  entry = hlo_text[hlo_text.index("ENTRY"):] if "ENTRY" in hlo_text else hlo_text
  body = entry.split("\n}\n", 1)[0]
  return sum(1 for line in body.splitlines() if _KERNEL_RE.match(line))


_DEFINITION_RE = re.compile(r"^\s*(?:ROOT\s+)?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\((.*)$")
_ARRAY_RE = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
             "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def _shape_bytes(shape: str) -> int:
  """Bytes of the arrays in an HLO shape that live in HBM (not VMEM, ``S(1)``)."""
  total = 0
  for dtype, dims, layout in _ARRAY_RE.findall(shape):
    if "S(1)" in layout:
      continue  # In VMEM: the copy that put it there is in the compiler's count.
    size = 1
    for d in filter(None, dims.split(",")):
      size *= int(d)
    total += size * _ITEMSIZE.get(dtype, 4)
  return total


def pallas_kernel_bytes(hlo_text: str) -> int:
  r"""HBM bytes of the entry's Pallas TPU kernels: their operands and outputs.

  libtpu's cost analysis counts a Mosaic kernel (``tpu_custom_call``) as
  moving nothing. A kernel whose grid copies each block of each operand and
  output once (``foam_jax._src.tpu_folded.block_visits``) moves exactly its
  operands in and its outputs out, which this sums from the optimized HLO,
  leaving out those the compiler placed in VMEM (memory space ``S(1)``):
  the copies that move them are in the compiler's own count.

  Examples:
    >>> hlo = ("ENTRY %m {\n  %g = bf16[8,128]{1,0} parameter(0)\n"
    ...        '  %k = (bf16[8,128]{1,0}) custom-call(%g), custom_call_target="tpu_custom_call"\n}')
    >>> pallas_kernel_bytes(hlo)  # 2 KiB in, 2 KiB out
    4096
  """
  entry = hlo_text[hlo_text.index("ENTRY"):] if "ENTRY" in hlo_text else hlo_text
  shapes: dict[str, str] = {}
  total = 0
  for line in entry.split("\n}\n", 1)[0].splitlines():
    match = _DEFINITION_RE.match(line)
    if not match:
      continue
    name, shape, opcode, rest = match.groups()
    shapes[name] = shape
    if opcode == "custom-call" and 'custom_call_target="tpu_custom_call"' in rest:
      operands = re.findall(r"%([^\s,)]+)", rest.split(")", 1)[0])
      total += _shape_bytes(shape) + sum(_shape_bytes(shapes.get(o, "")) for o in operands)
  return total


def counts(compiled) -> dict[str, Any]:
  """What a compiler reports for ``compiled``: bytes, temporaries, kernels, collectives.

  Returns:
    ``bytes_accessed`` (the sum over the top-level kernels of what each
    reads and writes: ``compiler_bytes``, the compiler's cost analysis,
    plus ``kernel_bytes``, the Pallas TPU kernels' traffic that it leaves
    out, :func:`pallas_kernel_bytes`), ``temp_bytes`` (``memory_analysis()``'s temporaries),
    ``argument_bytes``, ``output_bytes``, ``alias_bytes``, ``peak_bytes``
    (argument + output - alias + temp), ``kernels`` and ``collectives``
    (cross-device ops by opcode, nonzero ones only).
  """
  from benchmarks import hlo  # noqa: PLC0415

  cost = compiled.cost_analysis()
  if isinstance(cost, list):
    cost = cost[0] if cost else None
  if not cost:
    cost = _gpu_cost(compiled)
  mem = compiled.memory_analysis()
  text = compiled.as_text()
  kernel_bytes = pallas_kernel_bytes(text)
  out = {
      "bytes_accessed": float(cost["bytes accessed"]) + kernel_bytes,
      "compiler_bytes": float(cost["bytes accessed"]),
      "kernel_bytes": kernel_bytes,
      "temp_bytes": int(mem.temp_size_in_bytes),
      "argument_bytes": int(mem.argument_size_in_bytes),
      "output_bytes": int(mem.output_size_in_bytes),
      "alias_bytes": int(mem.alias_size_in_bytes),
      "kernels": kernel_count(text),
      "collectives": {k: v for k, v in hlo.count_collectives(text).items() if v},
  }
  out["peak_bytes"] = (out["argument_bytes"] + out["output_bytes"]
                       - out["alias_bytes"] + out["temp_bytes"])
  return out
