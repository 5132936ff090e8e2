"""Horizon study: does an optimizer's lead over tuned AdamW survive longer training?

Byte-level LLaMA (the example's ``tiny`` and ``20m`` presets) trained on the
CPython standard library's sources (:mod:`benchmarks.stdlib_corpus`) for
200, 1000 and 4000 steps of 8 x 128 bytes, each optimizer re-tuned at each
horizon (:mod:`benchmarks.horizon_plan`), 3 seeds at its best learning
rate. A run never sees a byte twice: step ``i`` of seed ``s`` trains on
windows ``8i .. 8i+7`` of a permutation (seeded by ``s``) of the training
split's disjoint 128-byte windows, the same data for every optimizer.

Results go to ``benchmarks/results/horizon/horizon.json`` after every run; a
rerun resumes (and refuses a file made on another corpus, by checksum), so
the study can run in the background for hours, as one process or as one
per model size (``--only tiny`` / ``--only 20m``), and be stopped at any
time. The report (``horizon_report``) is rendered from the JSON alone:
``--report-only``. ``--skip`` leaves optimizers out of this run and
``--horizons`` keeps only the given horizons (what is left out is reported
as cut or waiting).

Examples:
  python -m benchmarks.horizon --only tiny --skip foam_muon \\
      --note "one single-threaded process beside development work"
  python -m benchmarks.horizon --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks import horizon_plan
from benchmarks import stdlib_corpus
from benchmarks.convergence import train_run
from benchmarks.convergence_plan import best_lr
from benchmarks.convergence_plan import execute
from benchmarks.convergence_plan import Store
from examples.llama import data

__all__ = ["disjoint_batches", "main", "run_study"]

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "horizon")


def disjoint_batches(train: np.ndarray, batch: int, seq_len: int, steps: int,
                     seed: int):
  """``batch_at(i)``: step ``i``'s windows, no training byte used twice in a run.

  Raises:
    ValueError: if the split has fewer than ``batch * steps`` disjoint windows.

  Examples:
    >>> batch_at = disjoint_batches(np.arange(100), batch=2, seq_len=4, steps=3, seed=0)
    >>> seen = np.concatenate([batch_at(i)["inputs"].ravel() for i in range(3)])
    >>> len(seen) == len(set(seen.tolist())) == 24
    True
  """
  windows = (len(train) - 1) // seq_len
  if windows < batch * steps:
    raise ValueError(f"The training split has {windows} windows of {seq_len} bytes; "
                     f"{steps} steps of {batch} need {batch * steps}.")
  starts = np.random.default_rng(seed).permutation(windows)[:batch * steps] * seq_len
  offsets = np.arange(seq_len + 1)

  def batch_at(i: int) -> dict[str, np.ndarray]:
    window = train[starts[i * batch:(i + 1) * batch, None] + offsets[None, :]]
    return {"inputs": window[:, :-1], "targets": window[:, 1:]}

  return batch_at


def run_study(plan: dict[str, Any], store: Store, corpus: stdlib_corpus.Corpus, log,
              only=None, skip=(), horizons=None) -> None:
  """Runs every phase of ``plan`` not in ``store`` yet, most important first."""
  dataset = data.TokenDataset.from_splits(corpus.train, corpus.val, plan["seq_len"])
  name = corpus.info["name"]

  def train(spec):
    start = time.perf_counter()
    batch_at = disjoint_batches(dataset.train, spec["batch"], spec["seq_len"],
                                spec["steps"], spec["seed"])
    result = train_run(spec, dataset, batch_at)
    return {**result, "process_s": time.perf_counter() - start}

  for model, steps, opt in horizon_plan.phases(plan, only, skip, horizons):
    base = horizon_plan.base_spec(plan, name, model, steps)
    point = lambda lr, seed, b=base, o=opt: {**b, "optimizer": o, "lr": lr, "seed": seed}
    lrs = horizon_plan.grid_of(plan, store, name, model, steps, opt,
                               run=lambda lr, p=point: execute(store, p(lr, 0), train, log))
    if lrs is None:
      log(f"{model}/{steps}/{opt}: waiting for the grid that centres it")
      continue
    lr = best_lr(store, base, opt, lrs)
    for seed in range(1, plan["seeds"]) if lr is not None else ():
      execute(store, point(lr, seed), train, log)


def _open_store(path: str, meta: dict[str, Any]) -> Store:
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)["meta"].get("corpus", {})
    if old.get("sha256") != meta["corpus"]["sha256"]:
      raise ValueError(
          f"{path} was made on corpus {old.get('name')} (sha256 {old.get('sha256')}); "
          f"this run's corpus is {meta['corpus']['name']} (sha256 "
          f"{meta['corpus']['sha256']}). Resume it on the same corpus, or give "
          "another --out.")
  return Store(path, meta)


def _merged(path: str, others: list[str], cuts=()) -> dict[str, Any]:
  """The store at ``path`` with the runs and provenance of ``others`` added (and saved).

  ``cuts`` (``{"model", "steps", "reason"}``) replace the recorded cuts of
  the same horizons.
  """
  stores = []
  for p in ([path] if os.path.exists(path) else []) + list(others):
    with open(p) as f:
      stores.append(json.load(f))
  if not stores:
    raise ValueError(f"No results at {path}; run the study first.")
  data = stores[0]
  for other in stores[1:]:
    if other["meta"]["corpus"]["sha256"] != data["meta"]["corpus"]["sha256"]:
      raise ValueError("The stores to merge were made on different corpora.")
    view = Store.__new__(Store)
    view.data = data
    view.merge(other)
  if cuts:
    replaced = {(c["model"], c["steps"]) for c in cuts}
    keep = [c for c in data["meta"].get("cuts", [])
            if (c["model"], c["steps"]) not in replaced]
    data["meta"]["cuts"] = keep + list(cuts)
  if others or cuts:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
      json.dump(data, f)
  return data


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=_RESULTS)
  parser.add_argument("--quick", action="store_true",
                      help="two short horizons of a shrunken model (tests)")
  parser.add_argument("--only", nargs="*", metavar="MODEL", help="model sizes to run")
  parser.add_argument("--skip", nargs="*", default=[], metavar="OPTIMIZER",
                      help="optimizers to leave out of this run")
  parser.add_argument("--horizons", nargs="*", type=int, metavar="STEPS",
                      help="horizons to run (default: all of the plan's)")
  parser.add_argument("--corpus", metavar="DIR",
                      help="a corpus written by `python -m benchmarks.stdlib_corpus "
                      "--write DIR` instead of this Python's stdlib")
  parser.add_argument("--any-python", action="store_true",
                      help="take this Python's stdlib even if it is not the pinned "
                      "version (recorded under its own name)")
  parser.add_argument("--report-only", action="store_true",
                      help="render the report from the JSON, train nothing")
  parser.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                      help="--report-only: first add the runs of these stores (the "
                      "processes run side by side, one per model size)")
  parser.add_argument("--cut", nargs=3, action="append", default=[],
                      metavar=("MODEL", "STEPS", "REASON"),
                      help="--report-only: record that a horizon was cut on purpose, "
                      "and why (the report shows it); repeatable")
  parser.add_argument("--note", action="append", default=[],
                      help="a sentence the report shows about this run (load, "
                      "processes beside it); repeatable")
  args = parser.parse_args(argv)
  plan = horizon_plan.QUICK_PLAN if args.quick else horizon_plan.PLAN
  path = os.path.join(args.out, "horizon.json")
  log = lambda s: print(s, flush=True)
  if args.report_only:
    results = _merged(path, args.merge, [
        {"model": m, "steps": int(s), "reason": r} for m, s, r in args.cut])
  else:
    corpus = stdlib_corpus.load(args.corpus, any_version=args.any_python or args.quick)
    os.makedirs(args.out, exist_ok=True)
    meta = {"machine": common.machine_info(), "plan": plan, "corpus": corpus.info,
            "quick": args.quick, "notes": args.note}
    store = _open_store(path, meta)
    run_study(plan, store, corpus, log, args.only, set(args.skip), args.horizons)
    results = json.loads(json.dumps(store.data))
  from benchmarks import horizon_report  # Imports matplotlib; only when reporting.
  horizon_report.write_report(results, args.out)
  log(f"wrote {os.path.join(args.out, 'horizon.md')}")
  return results


if __name__ == "__main__":
  main()
