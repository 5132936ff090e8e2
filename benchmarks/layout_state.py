"""FOAM's state size against AdamW's in each layout of ``tests/clients/layouts.py``.

``foam_jax.state_bytes`` of ``foam(lr)`` (level 2) and of ``optax.adamw``
on the tree each stack hands ``init`` (NNX ``Variable`` s, Linen boxes,
``eqx.filter``'d Equinox and haliax modules). Run it against another
foam_jax (``PYTHONPATH=/path/to/other/clone:.``) with ``--label`` to put two
versions side by side; the report is rendered from the JSON alone.

Examples:
  python -m benchmarks.layout_state --label after
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

import equinox as eqx
import optax
from flax import nnx

import foam_jax
from benchmarks import common
from tests.clients import layouts

__all__ = ["LAYOUTS", "main", "measure"]

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

LAYOUTS = {
    "NNX, nnx.vmap/nnx.scan with names": lambda: nnx.state(layouts.nnx_scanned()[0], nnx.Param),
    "NNX, unscanned, no names (control)": lambda: nnx.state(layouts.nnx_plain()[0], nnx.Param),
    "Linen nn.scan, params on axis 0, logical names": lambda: layouts.linen_scanned(0)[1],
    "Linen nn.scan, params on axis 1 (MaxText)": lambda: layouts.linen_scanned(1)[1],
    "haliax, Levanter-style stacked Llama": lambda: eqx.filter(
        layouts.haliax_model()[0], eqx.is_inexact_array),
    "Equinox MLP": lambda: eqx.filter(layouts.equinox_mlp()[0], eqx.is_inexact_array),
    "Equinox transformer, filter_vmap-stacked": lambda: eqx.filter(
        layouts.equinox_transformer()[0], eqx.is_inexact_array),
}


def measure() -> dict[str, dict[str, int]]:
  out = {}
  for name, build in LAYOUTS.items():
    params = build()
    out[name] = {"adamw": foam_jax.state_bytes(optax.adamw(1e-3), params),
                 "foam": foam_jax.state_bytes(foam_jax.foam(1e-3), params)}
  return out


def _commit(path: str) -> str:
  try:
    return subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def write_report(data: dict, out: str) -> None:
  labels = list(data["runs"])
  lines = ["# FOAM's state against AdamW's, per layout", "",
           "`foam_jax.state_bytes(foam(lr), params) / state_bytes(optax.adamw(lr), params)` "
           "at level 2 on the tree each stack hands `init` (`tests/clients/layouts.py`). Lower "
           "is smaller; 0.25 would be every weight folded 4x.", "",
           "| layout | " + " | ".join(
               f"{label} ({data['runs'][label]['foam_jax']})" for label in labels) + " |",
           "|---|" + "---|" * len(labels)]
  for name in LAYOUTS:
    cells = []
    for label in labels:
      row = data["runs"][label]["sizes"].get(name)
      cells.append("" if row is None else f"{row['foam'] / row['adamw']:.3f}")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += [""] + common.provenance_lines(
      data["machine"], data.get("notes"),
      [f"- {label}: `{run['command']}`" for label, run in data["runs"].items()])
  with open(os.path.join(out, "layout_state.md"), "w") as f:
    f.write("\n".join(lines).rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--label", default="this version")
  parser.add_argument("--out", default=_RESULTS)
  parser.add_argument("--note", action="append", default=[])
  args = parser.parse_args(argv)
  path = os.path.join(args.out, "layout_state.json")
  data = {"runs": {}}
  if os.path.exists(path):
    with open(path) as f:
      data = json.load(f)
  info = common.machine_info()
  source = os.path.dirname(os.path.dirname(os.path.abspath(foam_jax.__file__)))
  data["machine"] = info
  data["notes"] = args.note or data.get("notes", [])
  data["runs"][args.label] = {"foam_jax": f"foam_jax {foam_jax.__version__} at {_commit(source)}",
                              "command": info["command"], "sizes": measure()}
  os.makedirs(args.out, exist_ok=True)
  with open(path, "w") as f:
    json.dump(data, f, indent=1)
  write_report(data, args.out)
  print(open(os.path.join(args.out, "layout_state.md")).read())
  return data


if __name__ == "__main__":
  main()
