"""The horizon study's GPU piece: AdamW against FOAM at ``60m`` in a time budget.

For a lent accelerator (``benchmarks/gpu.sh``, piece 5): the example's
``60m`` preset (bytes) trained on the machine's own CPython stdlib corpus
(:mod:`benchmarks.stdlib_corpus`, recorded under its version and checksum),
AdamW and FOAM each at its best learning rate of the CPU study's longest
finished ``tiny`` horizon (``results/horizon/horizon.json``), for as many
steps as fit ``--seconds`` of training for both, measured on a few timed
steps first. Writes ``horizon_gpu.json`` and ``horizon_gpu.md``.

Examples:
  python -m benchmarks.horizon_gpu --out /tmp/h --seconds 40
  python -m benchmarks.horizon_gpu --quick --out /tmp/h   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from benchmarks import common
from benchmarks import horizon
from benchmarks import horizon_plan
from benchmarks import stdlib_corpus
from benchmarks.convergence import train_run
from benchmarks.convergence_plan import View
from examples.llama import data

__all__ = ["main", "study_lrs"]

_STUDY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "horizon",
                      "horizon.json")
OPTIMIZERS = ("adamw", "foam")


def study_lrs(study: dict[str, Any]) -> tuple[int, dict[str, float]]:
  """Each optimizer's best lr at the longest ``tiny`` horizon the study finished for both."""
  plan, store = study["meta"]["plan"], View(study)
  name = study["meta"]["corpus"]["name"]
  horizons = next(h for m, h, _ in plan["sizes"] if m == "tiny")
  for steps in sorted(horizons, reverse=True):
    lrs = {o: horizon_plan.best_of(plan, store, name, "tiny", steps, o) for o in OPTIMIZERS}
    if None not in lrs.values():
      return steps, lrs
  raise ValueError("The horizon study has no tiny horizon tuned for both AdamW and FOAM.")


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--seconds", type=float, default=40.0,
                      help="training seconds for both optimizers together")
  parser.add_argument("--study", default=_STUDY)
  parser.add_argument("--quick", action="store_true", help="a shrunken model (CPU smoke test)")
  args = parser.parse_args(argv)
  with open(args.study) as f:
    horizon_steps, lrs = study_lrs(json.load(f))
  corpus = stdlib_corpus.load(any_version=True)
  model, batch, seq_len = ("tiny", 2, 16) if args.quick else ("60m", 32, 256)
  overrides = horizon_plan.QUICK_PLAN["model_overrides"] if args.quick else {}
  dataset = data.TokenDataset.from_splits(corpus.train, corpus.val, seq_len)
  base = {"model": model, "dataset": corpus.info["name"], "batch": batch, "seq_len": seq_len,
          "evals": 5, "val_batches": 4, "foam": {}, "seed": 0, "model_overrides": overrides}

  def run(opt, steps):
    spec = {**base, "optimizer": opt, "lr": lrs[opt], "steps": steps}
    return train_run(spec, dataset, horizon.disjoint_batches(
        dataset.train, batch, seq_len, steps, 0))

  # Time a short run of each (compiled ahead, so its wall-clock is steps only),
  # from its last 10 steps: the first ones also pay for dispatch warm-up.
  probe = 30

  def seconds_per_step(opt):
    curve = run(opt, probe)["train_curve"]  # (tokens, wall, loss) every 10 steps.
    return (curve[-1][1] - curve[-2][1]) / 10

  per_step = max(seconds_per_step(o) for o in OPTIMIZERS)
  steps = max(probe, int(args.seconds / (len(OPTIMIZERS) * per_step)))
  windows = (len(dataset.train) - 1) // seq_len
  steps = min(steps, windows // batch)
  start = time.perf_counter()
  results = {o: run(o, steps) for o in OPTIMIZERS}
  out = {"machine": common.machine_info(), "corpus": corpus.info,
         "study_horizon": horizon_steps, "lrs": lrs, "steps": steps,
         "seconds_per_step_probe": per_step, "elapsed_s": time.perf_counter() - start,
         "runs": results}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "horizon_gpu.json"), "w") as f:
    json.dump(out, f)
  lines = [f"# AdamW against FOAM at `{model}` on {corpus.info['name']}", "",
           f"Each at its best lr of the CPU study's `tiny` {horizon_steps}-step horizon; "
           f"{steps} steps of {batch} x {seq_len} bytes (as many as fit "
           f"{args.seconds:g} s for both), seed 0, corpus sha256 "
           f"`{corpus.info['sha256'][:16]}...`.", "",
           "| optimizer | lr | final val loss | train s |", "|---|---|---|---|"]
  for o, r in results.items():
    loss = "diverged" if r["final_val_loss"] is None else f"{r['final_val_loss']:.3f}"
    lines.append(f"| {o} | {lrs[o]:g} | {loss} | {r['wall_s']:.1f} |")
  lines += [""] + common.provenance_lines(out["machine"], None)
  with open(os.path.join(args.out, "horizon_gpu.md"), "w") as f:
    f.write("\n".join(lines).rstrip("\n") + "\n")
  return out


if __name__ == "__main__":
  main()
