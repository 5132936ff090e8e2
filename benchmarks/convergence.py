"""Convergence benchmark: FOAM vs the optimizers users would pick instead.

Byte-level LLaMA (the example's ``tiny`` and ``20m`` shapes, vocabulary 256)
trained for a fixed token budget on Tiny Shakespeare and on the example's
built-in corpus. Fair tuning: every optimizer gets the same learning-rate grid
(log-spaced) and the same schedule (10% warmup, cosine to 0.1x), its other
settings from its docs (FOAM: the paper's recipe); the best lr on validation
is rerun with more seeds. Also an ablation of FOAM (level, residual, second
moment form, alpha). The plan is in ``convergence_plan``, the report in
``convergence_report``; the model, data, optimizers and train step are
``examples.llama``'s.

Results go to ``benchmarks/results/convergence.json`` after every run (a
rerun resumes, skipping runs already there), ``convergence.md`` and PNG
plots. ``--quick`` trains a few steps of a shrunken model (CI). ``--note``
records what the report should say about the run (e.g. other processes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import common
from benchmarks import grid
from benchmarks.convergence_plan import around
from benchmarks.convergence_plan import PLANS
from benchmarks.convergence_plan import run_plan
from benchmarks.convergence_plan import Store
from benchmarks.convergence_report import summarize
from benchmarks.convergence_report import write_report
from examples.llama import configs
from examples.llama import data
from examples.llama import sharding
from examples.llama import state
from examples.llama import steps
from examples.llama import tokenizers

__all__ = ["SETTINGS", "VAL_FRACTION", "load_dataset", "long_plan", "main", "train_run"]

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VAL_FRACTION = 0.1

# Each optimizer's settings here, over the registry's defaults (betas 0.9 /
# 0.95, no weight decay; FOAM level 2, alpha 0.25; GaLore rank hidden/4,
# scale 0.25, projection refreshed every quarter of the run):
# Lion and Muon keep Optax's defaults (Lion's weight decay 1e-3; Muon's Adam
# at the same lr, b2 0.999), and so do their folded versions.
SETTINGS: dict[str, dict[str, Any]] = {
    "lion": {"weight_decay": 1e-3},
    "muon": {"b2": 0.999, "adam_lr_ratio": 1.0},
    "foam_lion": {"weight_decay": 1e-3},
    "foam_muon": {"b2": 0.999, "adam_lr_ratio": 1.0},
}


def load_dataset(name: str, seq_len: int) -> data.TokenDataset:
  """Corpus ``name`` as bytes: train on the first 90%, validate on the rest.

  The committed runs never used the last byte of either split (their windows
  stopped one short), so it is dropped here: the same windows, the same draws.
  """
  tokens = tokenizers.ByteTokenizer().encode(data.load_corpus(name))
  cut = int(len(tokens) * (1 - VAL_FRACTION))
  return data.TokenDataset.from_splits(tokens[:cut - 1], tokens[cut:-1], seq_len)


def model_config(name: str, seq_len: int, **overrides) -> configs.LlamaConfig:
  """Byte-level, float32 (CPU) version of the example's preset ``name``."""
  return configs.get_config(name, vocab_size=256, max_seq_len=seq_len, dtype="float32",
                            param_dtype="float32", remat=False, **overrides)


def make_optimizer(name: str, total_steps: int, hidden_size: int,
                   **foam_kwargs) -> optax.GradientTransformation:
  """Optimizer ``name`` at peak lr 1 on the paper schedule, times the step's ``lr``.

  Every optimizer here is linear in its peak learning rate (weight decay
  included), so the compiled step takes ``lr`` as an argument and multiplies
  the unit-peak update by it: one compilation serves the lr grid and seeds.
  """
  settings = {**SETTINGS.get(name, {}), **foam_kwargs}
  tx = grid.make_optimizer(name, 1.0, total_steps, hidden_size=hidden_size, **settings)
  return optax.chain(tx, grid.scale_by_lr_arg())


_COMPILED: dict[Any, Any] = {}


def _compiled(spec, graphdef, st, val):
  """The compiled train step and stacked eval for ``spec``'s shapes and optimizer."""
  key = (spec["model"], json.dumps(spec.get("model_overrides", {}), sort_keys=True),
         spec["optimizer"], json.dumps(spec.get("foam", {}), sort_keys=True),
         json.dumps(spec.get("settings", {}), sort_keys=True),
         spec["steps"], spec["batch"], spec["seq_len"], val["inputs"].shape)
  if key not in _COMPILED:
    abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                         tree)
    b, t = spec["batch"], spec["seq_len"]
    batch = {k: jax.ShapeDtypeStruct((b, t), jnp.int32) for k in ("inputs", "targets")}
    train_c = steps.make_train_step(graphdef).lower(
        abstract(st), batch, lr=jax.ShapeDtypeStruct((), jnp.float32)).compile()
    eval_c = steps.make_eval_step(graphdef, stacked=True).lower(
        abstract(st), abstract(val)).compile()
    _COMPILED[key] = (train_c, eval_c)
  return _COMPILED[key]


def train_run(spec: dict[str, Any], dataset: data.TokenDataset,
              batch_at: Callable[[int], dict[str, np.ndarray]] | None = None,
              make_tx: Callable[[configs.LlamaConfig], optax.GradientTransformation]
              | None = None,
              val: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
  """Trains one model as ``spec`` says; returns its curves and final loss.

  Step ``i`` (from 0) trains on ``batch_at(i)``; by default on windows drawn
  at random offsets by a generator seeded with the run's seed. ``make_tx``
  (the model's config -> the optimizer at peak lr 1, ``lr`` scaling chained
  after it) replaces the registry's optimizer, and ``val`` (stacked batches,
  ``{"inputs", "targets"}`` of shape ``(batches, batch, seq_len)``) the
  dataset's validation batches; the compiled steps are shared by the runs
  whose ``spec`` differs only in ``lr`` and ``seed``.

  ``spec`` keys: ``model``, ``dataset``, ``optimizer``, ``lr``, ``seed``,
  ``steps``, ``batch``, ``seq_len``, ``evals`` (number of validation points),
  ``foam`` (extra FOAM settings) and optionally ``model_overrides``.
  Wall-clock counts the training steps (data sampling included, compiled
  ahead of time); the validation passes are not counted.
  """
  config = model_config(spec["model"], spec["seq_len"], **spec.get("model_overrides", {}))
  if make_tx is None:
    tx = make_optimizer(spec["optimizer"], spec["steps"], config.hidden_size,
                        **spec.get("foam", {}))
  else:
    tx = make_tx(config)
  mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
  graphdef, st, _ = state.create_state(config, tx, mesh, spec["seed"])
  b, t = spec["batch"], spec["seq_len"]
  if val is None:
    val = jax.tree.map(lambda *x: jnp.stack(x),
                       *dataset.val_batches(b, spec.get("val_batches", 4)))
  train_c, eval_c = _compiled(spec, graphdef, st, val)
  lr = jnp.float32(spec["lr"])

  if batch_at is None:
    rng = np.random.default_rng(spec["seed"])
    batch_at = lambda _: dataset.sample_batch(b, rng)
  n = spec["steps"]
  eval_at = sorted({int(round(i * n / spec["evals"])) for i in range(1, spec["evals"] + 1)})
  curve, train_curve = [], []
  wall = 0.0
  for i in range(1, n + 1):
    start = time.perf_counter()
    st, loss = train_c(st, batch_at(i - 1), lr=lr)
    loss = float(loss)  # Blocks, so the step's time is complete.
    wall += time.perf_counter() - start
    if i % 10 == 0 or i == n:
      train_curve.append((i * b * t, wall, loss))
    if i in eval_at:
      curve.append((i * b * t, wall, float(eval_c(st, val))))
  final = curve[-1][2]
  return {**spec, "val_curve": curve, "train_curve": train_curve,
          "final_val_loss": final if math.isfinite(final) else None,
          "wall_s": wall, "tokens": n * b * t,
          "params": optax.tree.size(nnx.to_pure_dict(st)[0])}


def long_plan(reference: dict[str, Any], report: str) -> dict[str, Any]:
  """The long-horizon plan, its grids set from the short runs in ``reference``.

  Each optimizer of ``PLANS["long"]`` gets, per suite, its tuned lr in the
  short runs (``reference``, a convergence store) and the half-decade values
  either side; the short horizon's results are kept in the plan so that its
  report can rank both horizons from its own file.
  """
  plan = json.loads(json.dumps(PLANS["long"]))
  short = summarize(reference, reference["meta"]["plan"])
  by_suite = {f"{s['model']}/{s['dataset']}": {r["optimizer"]: r for r in s["rows"]}
              for s in short}
  lrs, kept = {}, {}
  for model_name, datasets, opts in plan["suites"]:
    for dataset in datasets:
      suite = f"{model_name}/{dataset}"
      for opt in opts:
        row = by_suite.get(suite, {}).get(opt)
        if row is None or row["lr"] is None or not row["seeds"]:
          raise ValueError(f"{report} has no tuned {opt} on {suite}: run the "
                           "short benchmark first.")
        lrs[f"{suite}/{opt}"] = around(row["lr"])
        kept.setdefault(suite, {})[opt] = {
            "lr": row["lr"], "mean": row["mean"], "sd": row["sd"],
            "seeds": len(row["seeds"])}
  steps = max(shape["steps"] for shape in reference["meta"]["plan"]["shape"].values())
  plan["lrs"] = lrs
  plan["reference"] = {"steps": steps, "report": report, "suites": kept}
  return plan


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="a few steps of a shrunken model (CI).")
  parser.add_argument("--out", default=_RESULTS)
  parser.add_argument("--plan", choices=sorted(PLANS), default=None,
                      help="run set (default: full; --quick selects quick)")
  parser.add_argument("--reference", default=os.path.join(_RESULTS, "convergence.json"),
                      help="--plan long: the short runs whose tuned lrs center "
                      "its grids")
  parser.add_argument("--only", nargs="*", metavar="MODEL/DATASET",
                      help="run only these suites (e.g. 20m/shakespeare)")
  parser.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                      help="add the runs of other convergence.json files "
                      "(parallel runs) before reporting")
  parser.add_argument("--report-only", action="store_true",
                      help="render the report from the JSON, train nothing.")
  parser.add_argument("--note", action="append", default=[],
                      help="a sentence the report shows about this run (load, "
                      "processes beside it); repeatable")
  args = parser.parse_args(argv)
  name = args.plan or ("quick" if args.quick else "full")
  plan = PLANS[name]
  if name == "long":
    with open(args.reference) as f:
      plan = long_plan(json.load(f),
                       os.path.relpath(args.reference, os.path.dirname(_RESULTS))
                       .replace(".json", ".md"))
  os.makedirs(args.out, exist_ok=True)
  meta = {"machine": common.machine_info(), "plan": plan, "quick": args.quick}
  if args.note:
    meta["notes"] = args.note
  store = Store(os.path.join(args.out, "convergence.json"), meta)
  log = lambda s: print(s, flush=True)
  for path in args.merge:
    with open(path) as f:
      other = json.load(f)
    store.merge(other)
  if args.merge:
    store.put_all()
  if not args.report_only:
    datasets = {}

    def train(spec):
      key = (spec["dataset"], spec["seq_len"])
      if key not in datasets:
        datasets[key] = load_dataset(spec["dataset"], spec["seq_len"])
      return train_run(spec, datasets[key])

    run_plan(plan, store, train, log, args.only)
  store.data = json.loads(json.dumps(store.data))  # As the file has it.
  write_report(store.data, args.out)
  log(f"wrote {os.path.join(args.out, 'convergence.md')}")
  return store.data


if __name__ == "__main__":
  main()
