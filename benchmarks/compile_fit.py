"""The largest 7B-width LLaMA whose train step fits a chip, as its compiler says.

For each chip with its memory (H100 SXM5 80 GB, TPU v5p 95 GB, TPU v6e 32 GB:
``benchmarks.deviceless``, no device needed), each layout (one chip; eight
chips as ``fsdp=8``; eight as ``fsdp=4, tp=2``, sharded as
``examples/llama/sharding.py`` shards) and each optimizer (AdamW, FOAM with
bf16 and with int8 moments, FOAM-Mini, Adafactor: the example's registry),
it compiles the example's donated train step (forward, backward, update) of
LLaMA-7B's width (hidden 4096, MLP 11008, 32 heads, vocabulary 32000, the
preset's remat) with bf16 weights at 2 and 4 layers, reads the compiled peak
per chip (``memory_analysis()``: arguments + outputs - aliased +
temporaries), takes the peak as affine in the depth, and solves for the
most layers whose peak is at most 0.9 of the chip's memory. On one chip,
AdamW's and FOAM's depths are checked by compiling them; a check over the
budget (the peak grew faster than affinely) is solved again on the secant
through 4 layers and the check, and checked again, up to ``CHECKS`` compiles.
Each compile records the commit it ran on.

The batch is 4 sequences of 2048 tokens per data-parallel shard (global
``4 * fsdp``). Results go to ``benchmarks/results/compile/fit.json`` after
every compile (resumable) and ``fit.md``::

  python -m benchmarks.compile_fit --chips h100 v5p v6e
  python -m benchmarks.compile_fit --render
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from typing import Any

from benchmarks import deviceless

# Before anything starts JAX's backends (examples.llama does at import): the
# CUDA plugin must not look for a GPU.
deviceless.configure_environment()

# isort: split
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

from benchmarks import compile_report  # noqa: E402
from benchmarks import grid  # noqa: E402
from examples.llama import configs  # noqa: E402
from examples.llama import outputs  # noqa: E402
from examples.llama import sharding  # noqa: E402
from examples.llama import state as state_lib  # noqa: E402
from examples.llama import steps  # noqa: E402

RESULTS = compile_report.RESULTS
CHIPS = ("h100", "v5p", "v6e")
LAYOUTS = {"1 chip": {"fsdp": 1, "tp": 1}, "fsdp=8": {"fsdp": 8, "tp": 1},
           "fsdp=4, tp=2": {"fsdp": 4, "tp": 2}}
OPTIMIZERS = ("adamw", "foam", "foam_int8", "foam_mini", "adafactor")
BUDGET = 0.9
BATCH_PER_SHARD, SEQ_LEN = 4, 2048
DEPTHS = (2, 4)
PRESET_LAYERS = 32  # LLaMA-7B's depth.
# The solved depths checked by a full compile (minutes each, unrolled): one
# chip, AdamW and FOAM; the other rows are affine only, and say so.
CHECKED = {("1 chip", "adamw"), ("1 chip", "foam")}
CHECKS = 3  # Compiles at most per checked row (the first solve, then secants).


def mesh_for(chip: str, sizes: dict[str, int]) -> jax.sharding.Mesh:
  """The example's ``(fsdp, tp)`` mesh over ``chip``'s compile-only devices."""
  count = sizes["fsdp"] * sizes["tp"]
  devices = np.array(deviceless.devices(chip, count), dtype=object)
  return jax.sharding.Mesh(devices.reshape(sizes["fsdp"], sizes["tp"]), sharding.AXES,
                           axis_types=(AxisType.Auto,) * len(sharding.AXES))


def compiled_peak(chip: str, layout: str, optimizer: str, layers: int) -> dict[str, Any]:
  """Compiles one train step and returns its per-chip memory counts."""
  sizes = LAYOUTS[layout]
  mesh = mesh_for(chip, sizes)
  cfg = dataclasses.replace(configs.get_config("7b", num_layers=layers),
                            param_dtype="bfloat16")
  tx = grid.make_optimizer(optimizer, 1e-3, hidden_size=cfg.hidden_size)
  graphdef, st = state_lib.abstract_state(cfg, tx)
  shardings = sharding.variable_shardings(st, mesh)
  batch = sizes["fsdp"] * BATCH_PER_SHARD
  tokens = {k: jax.ShapeDtypeStruct((batch, SEQ_LEN), jnp.int32) for k in ("inputs", "targets")}
  step = steps.make_train_step(graphdef, shardings, sharding.batch_sharding(mesh))
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    compiled = step.lower(st, tokens).compile()
  counts = deviceless.counts(compiled)
  return {"peak_bytes": counts["peak_bytes"], "temp_bytes": counts["temp_bytes"],
          "argument_bytes": counts["argument_bytes"], "collectives": counts["collectives"],
          "compile_s": round(time.perf_counter() - start, 1), "batch": batch,
          "seq_len": SEQ_LEN, "commit": outputs.git_commit()}


def solve(a: dict[str, Any], b: dict[str, Any], memory: int) -> dict[str, Any]:
  """Most layers whose peak, affine through rows ``a`` and ``b``, is within budget.

  Examples:
    >>> fit = solve({"layers": 2, "peak_bytes": 10}, {"layers": 4, "peak_bytes": 14}, 40)
    >>> fit["per_layer_bytes"], fit["base_bytes"], fit["max_layers"]
    (2.0, 6.0, 15)
  """
  slope = (b["peak_bytes"] - a["peak_bytes"]) / (b["layers"] - a["layers"])
  base = a["peak_bytes"] - a["layers"] * slope
  layers = max(0, math.floor((BUDGET * memory - base) / slope)) if slope > 0 else None
  return {"per_layer_bytes": slope, "base_bytes": base, "max_layers": layers,
          "preset_peak_bytes": base + PRESET_LAYERS * slope}


def checks(rows: dict[tuple, dict[str, Any]], chip: str, layout: str, opt: str,
           fit: dict[str, Any]) -> list[dict[str, Any]]:
  """The check compiles of a row, in order: each solved from the one before.

  The first is at the affine depth; after one over the budget, the next is
  at the depth solved on the secant through 4 layers and that check. Stops at
  the first row missing from ``rows``, one that failed, one within budget,
  or ``CHECKS`` rows.
  """
  memory = deviceless.CHIPS[chip]["memory"]
  p4 = rows[(chip, layout, opt, DEPTHS[1])]
  out, layers = [], fit["max_layers"]
  while layers and len(out) < CHECKS:
    check = rows.get((chip, layout, opt, layers))
    if check is None:
      break
    out.append(check)
    if "error" in check or check["peak_bytes"] <= BUDGET * memory:
      break
    layers = solve(p4, check, memory)["max_layers"]
    if layers is None or layers <= DEPTHS[1]:
      break
  return out


def run(chips, layouts, optimizers, path, log=print) -> dict[str, Any]:
  data = compile_report.load(path)
  data["info"] = {**compile_report.versions(), "command": " ".join(sys.argv)}
  rows = {(r["chip"], r["layout"], r["optimizer"], r["layers"]): r for r in data["rows"]}

  def measured(chip, layout, opt, layers):
    key = (chip, layout, opt, layers)
    if key not in rows:
      row = {"chip": chip, "layout": layout, "optimizer": opt, "layers": layers}
      try:
        row.update(compiled_peak(chip, layout, opt, layers))
      except Exception as e:  # a failed compile is a result to report
        row["error"] = f"{type(e).__name__}: {e}"[:300]
      data["rows"].append(row)
      rows[key] = row
      compile_report.save(data, path)
      log(f"{chip} {layout} {opt} {layers} layers: "
          + (row.get("error") or f"peak {row['peak_bytes'] / 2**30:.2f} GiB, "
             f"{row['compile_s']} s"))
    return rows[key]

  for chip in chips:
    for layout in layouts:
      for opt in optimizers:
        p2, p4 = (measured(chip, layout, opt, d) for d in DEPTHS)
        if "error" in p2 or "error" in p4:
          continue
        fit = solve(p2, p4, deviceless.CHIPS[chip]["memory"])
        if (layout, opt) not in CHECKED or not fit["max_layers"]:
          continue
        # The same sequence of depths as checks() reads back.
        budget, layers = BUDGET * deviceless.CHIPS[chip]["memory"], fit["max_layers"]
        for _ in range(CHECKS):
          check = measured(chip, layout, opt, layers)
          if "error" in check or check["peak_bytes"] <= budget:
            break
          layers = solve(p4, check, deviceless.CHIPS[chip]["memory"])["max_layers"]
          if layers is None or layers <= DEPTHS[1]:
            break
  return data


def fits(data: dict[str, Any]) -> list[dict[str, Any]]:
  """One row per chip, layout and optimizer: the solved depth and its check."""
  rows = {(r["chip"], r["layout"], r["optimizer"], r["layers"]): r for r in data["rows"]}
  out = []
  for chip in CHIPS:
    for layout in LAYOUTS:
      for opt in OPTIMIZERS:
        p2, p4 = rows.get((chip, layout, opt, DEPTHS[0])), rows.get((chip, layout, opt, DEPTHS[1]))
        if not p2 or not p4:
          continue
        row = {"chip": chip, "layout": layout, "optimizer": opt}
        if "error" in p2 or "error" in p4:
          row["error"] = p2.get("error") or p4.get("error")
          out.append(row)
          continue
        memory = deviceless.CHIPS[chip]["memory"]
        row.update(solve(p2, p4, memory))
        row["checks"] = [{"layers": c["layers"], "peak_bytes": c.get("peak_bytes"),
                          "within_budget": "error" not in c and c["peak_bytes"] <= BUDGET * memory}
                         for c in checks(rows, chip, layout, opt, row)]
        out.append(row)
  return out


def params_at(layers: int) -> int:
  """Parameters of the 7B-width LLaMA at ``layers`` (affine in the depth)."""
  from benchmarks import common  # noqa: PLC0415
  from benchmarks import memory  # noqa: PLC0415

  at = [common.tree_size(memory.abstract_params(memory.llama_config("7b", num_layers=d)))
        for d in (1, 2)]
  return at[0] + (layers - 1) * (at[1] - at[0])


def render(data: dict[str, Any]) -> str:
  gib = 2**30
  lines = [
      "# The largest 7B-width LLaMA whose train step fits one chip's memory",
      "",
      "The example's donated train step (forward, backward, update), LLaMA-7B's "
      "width with bf16 weights and the preset's remat, compiled without a device "
      "for each chip (`benchmarks/compile_fit.py`), "
      f"{BATCH_PER_SHARD} x {SEQ_LEN} tokens per data-parallel shard. The compiled "
      "peak per chip is affine in the depth: measured at 2 and 4 layers, solved for "
      f"the most layers within {BUDGET:.0%} of the chip's memory; on one chip, AdamW's "
      "and FOAM's depths are checked by compiling them, and a check over the budget "
      "(the peak grew faster than affinely) is solved again on the secant through 4 "
      "layers and that check, and compiled again. `most layers` is the deepest check "
      "within the budget, or the affine solution where none was compiled. Counts "
      "from a compiler, not a run on the chip.",
      "",
      "| chip | layout | optimizer | per layer (GiB) | base (GiB) | "
      f"peak at {PRESET_LAYERS} layers (GiB) | most layers | params there | "
      "checked: layers: peak (GiB) |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for row in fits(data):
    if "error" in row:
      lines.append(f"| {row['chip']} | {row['layout']} | {row['optimizer']} | "
                   f"fails to compile: `{row['error'][:120]}` | | | | | |")
      continue
    fitting = [c["layers"] for c in row["checks"] if c["within_budget"]]
    if fitting:
      most, params = str(max(fitting)), f"{params_at(max(fitting)) / 1e9:.2f}B"
    elif row["checks"]:  # every compiled depth was over the budget
      most, params = f"under {min(c['layers'] for c in row['checks'])}", ""
    else:
      most, params = f"{row['max_layers']} (affine)", f"{params_at(row['max_layers']) / 1e9:.2f}B"
    checked = "; ".join(
        f"{c['layers']}: {c['peak_bytes'] / gib:.2f}" + ("" if c["within_budget"] else " (over)")
        for c in row["checks"]) or "not checked"
    lines.append(
        f"| {row['chip']} | {row['layout']} | {row['optimizer']} | "
        f"{row['per_layer_bytes'] / gib:.3f} | {row['base_bytes'] / gib:.2f} | "
        f"{row['preset_peak_bytes'] / gib:.1f} | {most} | {params} | {checked} |")
  done = {(r["chip"], r["layout"], r["optimizer"]) for r in fits(data)}
  missing = [f"{c}, {lay}, {o}" for c in CHIPS for lay in LAYOUTS for o in OPTIMIZERS
             if (c, lay, o) not in done]
  if missing:
    lines += ["", "Not compiled yet (the run is resumable: `python -m benchmarks.compile_fit` "
              "goes on where it stopped): " + "; ".join(missing) + "."]
  lines += ["", "## Provenance", ""]
  commits: dict[str, int] = {}
  for r in data["rows"]:
    commits[r.get("commit", "not recorded")] = commits.get(r.get("commit", "not recorded"), 0) + 1
  lines.append("- compiles per commit of the code: "
               + ", ".join(f"{c}: {n}" for c, n in sorted(commits.items())))
  lines += [f"- {k}: {v}" for k, v in sorted(data.get("info", {}).items())]
  lines.append("")
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--chips", nargs="+", default=list(CHIPS), choices=list(CHIPS))
  parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
  parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS))
  parser.add_argument("--out", default=os.path.join(RESULTS, "fit.json"))
  parser.add_argument("--render", action="store_true", help="only write the report")
  args = parser.parse_args(argv)
  if not args.render:
    run(args.chips, args.layouts, args.optimizers, args.out)
  with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
    f.write(render(compile_report.load(args.out)))


if __name__ == "__main__":
  main()
