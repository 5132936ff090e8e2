"""The convergence benchmark's plan: lr grids, seeds, ablation; resumable runs.

``run_plan`` walks the phases of a plan (per model and corpus: each
optimizer's lr grid, extended at its edges, then its extra seeds at the best
lr; then FOAM's ablation), calling ``train`` for every run that is not in the
``Store`` yet.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ABLATION", "PLANS", "Store", "View", "around", "best_lr", "base_grid",
           "plan_phases", "provenance", "run_id", "run_plan", "tuned_grid"]


def run_id(spec) -> str:
  extra = ",".join(f"{k}={v}" for k, v in sorted(spec.get("foam", {}).items()))
  return (f"{spec['model']}/{spec['dataset']}/{spec['optimizer']}"
          f"[{extra}]/lr={spec['lr']:.3g}/seed={spec['seed']}"
          f"/{spec['steps']}x{spec['batch']}x{spec['seq_len']}")


def provenance(meta: dict[str, Any] | None) -> list[dict[str, Any]]:
  """Who produced a store's runs: one entry per command, oldest first, no repeats.

  An entry is ``{"command", "date", "cpu", "notes"}`` (only ``command`` for
  the oldest stores). A store keeps the entries of the stores it resumed or
  merged as a flat ``meta["history"]``; stores written before that nested
  whole metas (``previous``, ``merged``), which are read here too.

  Examples:
    >>> meta = {"machine": {"command": "b", "date": "d", "cpu": "c"},
    ...         "history": [{"command": "a", "notes": ["n"]}]}
    >>> [e["command"] for e in provenance(meta)]
    ['a', 'b']
  """
  if not meta:
    return []
  entries = list(meta.get("history", [])) + provenance(meta.get("previous"))
  for merged in meta.get("merged", []):
    # The oldest stores kept merged runs' commands as plain strings.
    entries += ([{"command": c} for c in merged] if isinstance(merged, list)
                else provenance(merged))
  if "machine" in meta:
    m = meta["machine"]
    entries.append({"command": m["command"], "date": m["date"], "cpu": m["cpu"],
                    "notes": meta.get("notes", [])})
  return _unique(entries)


def _unique(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """``entries`` without repeats, in the order of their first appearance."""
  return list({json.dumps(e, sort_keys=True): e for e in entries}.values())


class Store:
  """Run results in a JSON file, written after every run.

  Resuming a file keeps its runs, and its provenance in ``meta["history"]``;
  ``merge`` adds another store's runs and provenance.
  """

  def __init__(self, path: str, meta: dict[str, Any]):
    self.path = path
    self.data = {"meta": meta, "runs": {}}
    if os.path.exists(path):
      with open(path) as f:
        old = json.load(f)
      self.data["runs"] = old.get("runs", {})
      meta["history"] = provenance(old.get("meta"))

  def merge(self, other: dict[str, Any]) -> None:
    """Adds the runs and the provenance of another store's data."""
    self.data["runs"].update(other["runs"])
    meta = self.data["meta"]
    meta["history"] = _unique(meta.get("history", []) + provenance(other["meta"]))

  def get(self, spec):
    return self.data["runs"].get(run_id(spec))

  def put(self, result):
    self.data["runs"][run_id(result)] = result
    self.put_all()

  def put_all(self):
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(self.data, f)
    os.replace(tmp, self.path)


class View:
  """Read-only :class:`Store` lookalike over loaded data."""

  def __init__(self, data):
    self.data = data

  def get(self, spec):
    return self.data["runs"].get(run_id(spec))


def base_grid(p, model: str, dataset: str, optimizer: str) -> list[float]:
  """The lr grid plan ``p`` starts ``optimizer`` on, before any extension.

  ``p["lrs"]`` is one grid for every optimizer, or a dict of grids keyed
  ``"model/dataset/optimizer"`` (the long-horizon plan: each optimizer's own
  grid around its best lr at the short horizon).
  """
  lrs = p["lrs"]
  return list(lrs[f"{model}/{dataset}/{optimizer}"] if isinstance(lrs, dict) else lrs)


def best_lr(store, base, optimizer, lrs):
  """The grid lr with the lowest final validation loss (seed 0)."""
  scored = []
  for lr in lrs:
    r = store.get({**base, "optimizer": optimizer, "lr": lr, "seed": 0})
    if r and r["final_val_loss"] is not None:
      scored.append((r["final_val_loss"], lr))
  return min(scored)[1] if scored else None


# Half-decade learning rates: where a grid is extended past its ends.
LR_LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)


def _ladder_step(lr: float, direction: int) -> float | None:
  i = min(range(len(LR_LADDER)),
          key=lambda k: abs(math.log(LR_LADDER[k] / lr)))
  j = i + direction
  return LR_LADDER[j] if 0 <= j < len(LR_LADDER) else None


def around(lr: float) -> list[float]:
  """``lr`` and the half-decade values either side of it (3 points)."""
  return [x for x in (_ladder_step(lr, -1), lr, _ladder_step(lr, 1)) if x is not None]


def tuned_grid(store, base, optimizer, lrs, extend, run=None):
  """The lr grid ``optimizer`` was tuned on: ``lrs``, extended at its edges.

  While the best lr (seed 0) is at an end of the grid, the next half-decade
  value beyond that end is added, at most ``extend`` times: the same rule
  for every optimizer, so none is judged at a learning rate that is only
  best because the grid stopped there. ``run(lr)`` trains a missing point;
  without it (the report) the grid stops at the first point not run.
  """
  grid = sorted(lrs)
  if run is not None:
    for lr in grid:
      run(lr)
  for _ in range(extend):
    best = best_lr(store, base, optimizer, grid)
    if best is None or best not in (grid[0], grid[-1]) or len(grid) < 2:
      break
    new = _ladder_step(best, 1 if best == grid[-1] else -1)
    if new is None:
      break
    if store.get({**base, "optimizer": optimizer, "lr": new, "seed": 0}) is None:
      if run is None:
        break
      run(new)
    grid = sorted(grid + [new])
  return grid


def execute(store, spec, train: Callable[[dict[str, Any]], dict[str, Any]], log):
  """Runs ``spec`` with ``train`` unless the store has it; returns the result."""
  if store.get(spec) is not None:
    return store.get(spec)
  start = time.perf_counter()
  result = train(spec)
  store.put(result)
  log(f"{run_id(spec)}: val {result['final_val_loss']} "
      f"({result['wall_s']:.1f}s train, {time.perf_counter() - start:.1f}s "
      "total)")
  return result


def plan_phases(p, only=None):
  """The phases of the benchmark, most important first.

  Per model and dataset, each optimizer's lr grid is followed at once by its
  extra seeds, so a run cut short still has complete optimizers.
  """
  phases = []
  for model_name, datasets, opts in p["suites"]:
    for dataset in datasets:
      if only and f"{model_name}/{dataset}" not in only:
        continue
      base = {"model": model_name, "dataset": dataset, **p["shape"][model_name],
              "evals": p["evals"], "foam": {}}
      for opt in opts:
        phases.append(("grid", base, opt))
        phases.append(("seeds", base, opt))
      if model_name == p["ablation"][0] and dataset == p["ablation"][1]:
        phases.append(("ablation", base, "foam"))
  return phases


ABLATION = (
    {"fold_level": 0}, {"fold_level": 1}, {"fold_level": 3},
    {"fold_level": 4}, {"residual_scale": 0.0},
    {"second_moment": "square_of_mean"}, {"alpha": 1.0}, {"alpha": 0.5},
)


def run_plan(p, store, train, log, only=None):
  """Runs every phase of plan ``p`` (``train(spec) -> result``), skipping done runs."""
  for kind, base, opt in plan_phases(p, only):
    lrs = base_grid(p, base["model"], base["dataset"], opt)
    extend = p.get("extend_edges", 0)
    point = lambda lr, seed, foam=None, o=opt, b=base: {
        **b, "optimizer": o, "lr": lr, "seed": seed, "foam": foam or {}}
    if kind == "grid":
      tuned_grid(store, base, opt, lrs, extend,
                 run=lambda lr, point=point: execute(store, point(lr, 0), train, log))
    elif kind == "seeds":
      lr = best_lr(store, base, opt, tuned_grid(store, base, opt, lrs, extend))
      seeds = p["seeds"]
      for seed in range(1, seeds) if lr is not None else ():
        execute(store, point(lr, seed), train, log)
    else:
      lrs = base_grid(p, base["model"], base["dataset"], "foam")
      lr = best_lr(store, base, "foam", tuned_grid(store, base, "foam", lrs, extend))
      for change in p.get("ablation_changes", ABLATION):
        execute(store, point(lr, 0, change, "foam"), train, log)


FULL_PLAN = {
    # (model, datasets, optimizers) in order of importance.
    "suites": [
        ("20m", ["shakespeare", "builtin"],
         ("adamw", "foam", "foam_mini", "lion", "adafactor", "muon",
          "galore", "foam_muon", "foam_lion", "foam_int8")),
        ("tiny", ["shakespeare", "builtin"],
         ("adamw", "foam", "foam_mini", "lion", "adafactor", "muon",
          "galore", "foam_muon", "foam_lion", "foam_int8")),
    ],
    "shape": {"tiny": {"steps": 200, "batch": 8, "seq_len": 128},
              "20m": {"steps": 200, "batch": 8, "seq_len": 128}},
    "lrs": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2],
    "extend_edges": 2,
    "seeds": 3,
    "evals": 5,
    "ablation": ("tiny", "shakespeare"),
}

QUICK_PLAN = {
    "suites": [("tiny", ["builtin"], ("adamw", "foam"))],
    "shape": {"tiny": {"steps": 4, "batch": 2, "seq_len": 16,
                       "model_overrides": {"num_layers": 1, "hidden_size": 32,
                                           "intermediate_size": 64,
                                           "num_heads": 2}}},
    "lrs": [1e-3, 1e-2],
    "extend_edges": 1,
    "seeds": 2,
    "evals": 2,
    "ablation": ("tiny", "builtin"),
    "ablation_changes": ({"fold_level": 0}, {"residual_scale": 0.0}),
}


# A few minutes on one GPU (benchmarks/gpu.sh): LLaMA-60M, FOAM vs AdamW.
GPU_PLAN = {
    "suites": [("60m", ["shakespeare"], ("adamw", "foam"))],
    "shape": {"60m": {"steps": 400, "batch": 32, "seq_len": 256}},
    "lrs": [3e-3, 1e-2],  # The two that won on tiny (results/convergence.md).
    "seeds": 1,
    "evals": 10,
    "ablation": (None, None),
}

# The longer horizon (``long_plan`` in ``convergence.py`` fills in each
# optimizer's grid from the 200-step results): 5x the steps on ``tiny``.
LONG_PLAN = {
    "suites": [("tiny", ["shakespeare", "builtin"],
                ("adamw", "foam", "muon", "foam_muon"))],
    "shape": {"tiny": {"steps": 1000, "batch": 8, "seq_len": 128}},
    "extend_edges": 1,
    "seeds": 3,
    "evals": 10,
    "ablation": (None, None),
}

PLANS = {"full": FULL_PLAN, "quick": QUICK_PLAN, "gpu": GPU_PLAN, "long": LONG_PLAN}


