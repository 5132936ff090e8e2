"""The equal-tuning study: every optimizer tuned alike, pinned to one commit.

The protocol is ``benchmarks/protocols/equal_tuning.md``; the plan in code is
:mod:`benchmarks.equal_tuning_plan`. Byte-level LLaMA (the example's ``tiny`` and
``20m``) trained on the CPython standard library (:mod:`benchmarks.stdlib_corpus`),
a run never seeing a training byte twice (:func:`benchmarks.horizon.disjoint_batches`),
evaluated on the same 1,024 held-out windows from validation files that are
not near-copies of training files (:mod:`benchmarks.heldout`; the removed
list is ``results/equal_tuning/heldout.json``).

The study runs from its own git worktree at one commit, so that changes on
main cannot move it mid-way: the store (``results/equal_tuning/runs.json``)
records that commit when it is created, every run records the commit it ran
on, and a process at another commit, or with uncommitted changes, refuses to
add runs. Resumable: results are written after every run, and a rerun skips
what is there. To resume in a new checkout::

    git worktree add ../equal-tuning <the commit in runs.json's meta>
    cd ../equal-tuning && XLA_FLAGS="--xla_cpu_multi_thread_eigen=false \\
        intra_op_parallelism_threads=1" python -m benchmarks.equal_tuning \\
        --out <main checkout>/benchmarks/results/equal_tuning

Examples:
  python -m benchmarks.equal_tuning --phases 1 --out ../main/benchmarks/results/equal_tuning
  python -m benchmarks.equal_tuning --quick --out /tmp/quick --allow-dirty
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Any

import jax
import numpy as np
import optax

import foam_jax
from benchmarks import adam_mini
from benchmarks import common
from benchmarks import equal_tuning_plan
from benchmarks import grid
from benchmarks import heldout
from benchmarks import stdlib_corpus
from benchmarks.convergence import train_run
from benchmarks.convergence_plan import Store
from benchmarks.horizon import disjoint_batches
from examples.llama import configs
from examples.llama import data
from examples.llama import optimizers

__all__ = ["build_optimizer", "main", "run_study"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_RESULTS = os.path.join(_HERE, "results", "equal_tuning")


def _commit() -> tuple[str, bool]:
  """This code's commit and whether its worktree has uncommitted changes."""
  git = lambda *a: subprocess.run(["git", "-C", _HERE, *a], capture_output=True,
                                  text=True, check=True).stdout.strip()
  return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))


def _folded_mask(params: Any) -> Any:
  """True on the leaves FOAM's default policy folds (the matrices it scales by alpha)."""
  return jax.tree.map(lambda s: s is not None, foam_jax.default_fold_specs(params),
                      is_leaf=lambda x: x is None or isinstance(x, foam_jax.FoldSpec))


def build_optimizer(spec: dict[str, Any], plan: dict[str, Any],
                    config: configs.LlamaConfig) -> optax.GradientTransformation:
  """The study's optimizer for ``spec`` at peak lr 1 (the step's ``lr`` scales it).

  Every optimizer clips the global norm at ``plan["clip"]`` first and follows
  the paper's schedule (warmup, cosine to 0.1x); the Adam family's ``b2`` is
  ``plan["adam_b2"]`` (Muon's Adam part's too). ``spec["weight_decay"]`` is
  decoupled: Muon's and folded Muon's value is their matrices', and their
  Adam part takes 0.1 with it (0 without).
  """
  name, wd, steps = spec["optimizer"], spec["weight_decay"], spec["steps"]
  b2, clip, warmup = plan["adam_b2"], plan["clip"], plan["warmup_fraction"]
  common_args = {"warmup_fraction": warmup, "clip": clip, "hidden_size": config.hidden_size}
  sched = optimizers.schedule(1.0, steps, warmup)
  if name in ("adamw", "foam", "foam_mini", "foam_int8", "galore"):
    tx = grid.make_optimizer(name, 1.0, steps, b2=b2, weight_decay=wd, **common_args)
  elif name in ("adafactor", "lion"):
    tx = grid.make_optimizer(name, 1.0, steps, weight_decay=wd, **common_args)
  elif name in ("muon", "foam_muon", "muon_adamw_lr"):
    family = "foam_muon" if name == "foam_muon" else "muon"
    tx = grid.make_optimizer(family, 1.0, steps, b2=b2, weight_decay=wd,
                             adam_weight_decay=0.1 if wd else 0.0,
                             adam_lr_ratio=spec.get("adam_lr_ratio", 1.0), **common_args)
  elif name == "adam_mini":
    tx = optax.chain(optax.clip_by_global_norm(clip),
                     adam_mini.adam_mini(sched, num_heads=config.num_heads,
                                         num_kv_heads=config.num_kv_heads, b2=b2,
                                         weight_decay=wd))
  elif name == "adam_alpha":
    tx = optax.chain(optax.clip_by_global_norm(clip),
                     optax.scale_by_adam(b1=0.9, b2=b2, eps=1e-8),
                     optax.masked(optax.scale(optimizers.FOAM_ALPHA), _folded_mask),
                     optax.add_decayed_weights(wd),
                     optax.scale_by_learning_rate(sched))
  else:
    raise ValueError(f"Unknown study optimizer {name!r}; choose one of {equal_tuning_plan.ALL}.")
  return optax.chain(tx, grid.scale_by_lr_arg())


class _StudyStore(Store):
  """The convergence benchmark's store, keyed by :func:`equal_tuning_plan.run_key`."""

  def get(self, spec):
    return self.data["runs"].get(equal_tuning_plan.run_key(spec))

  def put(self, result):
    self.data["runs"][equal_tuning_plan.run_key(result)] = result
    self.put_all()


def _eval_set(plan, corpus_files, removed) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  windows, info = heldout.windows(corpus_files, removed, plan["seq_len"],
                                  plan["eval_windows"])
  b = plan["eval_batch"]
  stacked = windows.reshape(-1, b, plan["seq_len"] + 1)
  return {"inputs": stacked[..., :-1], "targets": stacked[..., 1:]}, info


def run_study(plan: dict[str, Any], store: _StudyStore, dataset: data.TokenDataset,
              val: dict[str, np.ndarray], log, only=None, commit: str = "") -> None:
  """Trains every run of ``plan``'s phases (``only``: these phases) not in ``store``."""

  def train(spec):
    start = time.perf_counter()
    batch_at = disjoint_batches(dataset.train, spec["batch"], spec["seq_len"],
                                spec["steps"], spec["seed"])
    result = train_run(spec, dataset, batch_at,
                       make_tx=lambda config: build_optimizer(spec, plan, config), val=val)
    return {**result, "process_s": time.perf_counter() - start, "commit": commit}

  def spec_of(model, steps, opt, k_or_lr, wd, seed):
    lr = equal_tuning_plan.lr_at(k_or_lr) if isinstance(k_or_lr, int) else k_or_lr
    spec = {"model": model, "dataset": "stdlib", "optimizer": opt, "lr": lr,
            "weight_decay": wd, "seed": seed, "steps": steps, "batch": plan["batch"],
            "seq_len": plan["seq_len"], "evals": plan["evals"],
            "settings": {"weight_decay": wd}}
    if plan.get("model_overrides"):
      spec["model_overrides"] = plan["model_overrides"]
    if opt == "muon_adamw_lr":
      adamw = equal_tuning_plan.best_setting(plan, model, steps, "adamw", loss_of(model, "adamw"))
      if adamw is None:
        return None
      spec["adam_lr_ratio"] = adamw[0] / lr
      spec["settings"]["adam_lr_ratio"] = spec["adam_lr_ratio"]
    return spec

  def run(spec):
    if store.get(spec) is None:
      result = train(spec)
      store.put(result)
      log(f"{equal_tuning_plan.run_key(spec)}: val {result['final_val_loss']} "
          f"({result['process_s']:.0f} s)")
    return store.get(spec)

  def loss_of(model, opt, train_missing=True):
    def loss_at(steps, k, wd):
      spec = spec_of(model, steps, opt, k, wd, 0)
      if spec is None:
        return equal_tuning_plan.MISSING
      if store.get(spec) is None and not train_missing:
        return equal_tuning_plan.MISSING
      return run(spec)["final_val_loss"]
    return loss_at

  for phase, model, steps, opt, seeds in equal_tuning_plan.phases(plan, only):
    best = equal_tuning_plan.best_setting(plan, model, steps, opt, loss_of(model, opt))
    if best is None:
      log(f"phase {phase} {model}/{steps}/{opt}: waiting for the setting it is centred on")
      continue
    lr, wd = best
    for seed in range(1, seeds):
      spec = spec_of(model, steps, opt, lr, wd, seed)
      if spec is not None:
        run(spec)


def _open_store(path: str, meta: dict[str, Any], allow_other_commit: bool) -> _StudyStore:
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)["meta"]
    for key in ("commit", "corpus", "heldout", "plan"):
      if old.get(key) != meta.get(key) and not (key == "commit" and allow_other_commit):
        raise ValueError(
            f"{path} was made with another {key} ({str(old.get(key))[:80]}); this "
            f"process has {str(meta.get(key))[:80]}. Resume it from a worktree at its "
            "commit (see this module's docstring), or give another --out.")
  return _StudyStore(path, meta)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=_RESULTS)
  parser.add_argument("--quick", action="store_true",
                      help="two tiny horizons of a shrunken model (tests)")
  parser.add_argument("--phases", nargs="*", type=int, help="run only these phases")
  parser.add_argument("--allow-dirty", action="store_true",
                      help="run with uncommitted changes (tests only: the runs then "
                      "do not belong to the study's commit)")
  parser.add_argument("--note", action="append", default=[],
                      help="a sentence the report shows about this run; repeatable")
  args = parser.parse_args(argv)
  plan = equal_tuning_plan.QUICK_PLAN if args.quick else equal_tuning_plan.PLAN
  commit, dirty = _commit()
  if dirty and not args.allow_dirty:
    raise SystemExit("The study runs from a clean worktree at one commit; this one has "
                     "uncommitted changes (git worktree add, see the docstring).")
  corpus = stdlib_corpus.load(any_version=args.quick)
  train_files, val_files = stdlib_corpus.split_files()
  if args.quick:
    removed = {"removed": heldout.near_copies(train_files, val_files)}
  else:
    with open(heldout.REMOVED_LIST) as f:
      removed = json.load(f)
    if removed["corpus_sha256"] != corpus.info["sha256"]:
      raise SystemExit(f"{heldout.REMOVED_LIST} was made for another corpus; "
                       "write it again with `python -m benchmarks.heldout`.")
  val, eval_info = _eval_set(plan, val_files, [r["file"] for r in removed["removed"]])
  dataset = data.TokenDataset.from_splits(corpus.train, corpus.val, plan["seq_len"])
  os.makedirs(args.out, exist_ok=True)
  meta = {"machine": common.machine_info(), "plan": json.loads(json.dumps(plan)),
          "corpus": corpus.info, "heldout": eval_info, "commit": commit,
          "jax": jax.__version__, "optax": optax.__version__, "notes": args.note}
  store = _open_store(os.path.join(args.out, "runs.json"), meta, args.quick)
  log = lambda s: print(s, flush=True)
  run_study(plan, store, dataset, val, log, args.phases, commit)
  log(f"runs in {store.path}: {len(store.data['runs'])}")
  return store.data


if __name__ == "__main__":
  main()
