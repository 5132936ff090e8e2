"""Pre-training, then fine-tuning, with FOAM's three forms of bias correction.

``foam_jax.scale_by_foam(bias_correction=...)``: ``"step_size"`` (the
authors' form, the default), ``"moments"`` (Optax's) and
``"folded_moments"`` (the folded moments corrected before the residual is
added). The study, on the example's byte-level ``tiny`` LLaMA:

1. **Pre-training**: 1000 steps of 8 x 128 bytes on the CPython standard
   library's sources (``benchmarks.stdlib_corpus``), AdamW and FOAM in each
   form, the example's registry recipe (betas 0.9 / 0.95, 10% warmup and
   cosine to 0.1x; FOAM ``alpha=0.25``), 3 learning rates a quarter decade
   apart around the horizon study's best at 1000 steps, 3 seeds.
2. **Fine-tuning** the AdamW model pre-trained at lr 1e-3, seed 0, on Tiny
   Shakespeare for 300 steps of 8 x 128 bytes, as a user replacing
   ``optax.adamw(lr)`` would: ``optax.adamw`` and ``foam_jax.foam`` at their
   defaults (``b2=0.999``, ``alpha=1``, no weight decay) on the same
   schedule, fully (every weight) and with an ``nnx.LoRA`` adapter of rank 8
   on every attention and MLP projection (``nnx.Optimizer(wrt=nnx.LoRAParam)``;
   FOAM's default policy keeps the adapters on Adam's moments, where the
   three forms coincide but for ``eps``'s place, so one runs), and with the
   adapters folded (``lora_a`` and ``lora_b`` along their first axis, level
   2: what the default policy did before, in each form); 3 learning rates
   a half decade apart (full: 1e-4 to 1e-3, extended to 3e-3 when every
   optimizer was best at 1e-3, and to 1e-2 when FOAM's forms were best at
   3e-3; LoRA: 3e-4 to 3e-3, extended to 1e-2 when AdamW's was best at
   3e-3), 3 seeds (the adapters' initialisation and the
   batches).

Every run's final validation loss (nats per byte, 16 held-out batches) goes
to ``benchmarks/results/finetune/runs.json`` as it finishes (a rerun resumes),
and ``finetune.md`` is written from it: per phase, mode and optimizer, the
3-seed mean and spread at each learning rate and at the best.

Run: ``python -m benchmarks.finetune`` (``--quick`` for a few steps of a
one-layer model, as CI's test does). Processes that share ``--out`` may
split the runs by ``--seeds`` (each adds its runs to ``runs.json`` under a
file lock).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax import serialization

import foam_jax
from benchmarks import convergence
from benchmarks import stdlib_corpus
from examples.llama import data
from examples.llama import model as model_lib
from examples.llama import optimizers
from examples.llama import outputs
from examples.llama import sharding
from examples.llama import steps
from examples.llama import tokenizers

__all__ = ["FORMS", "add_lora", "main", "plan", "render"]

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "finetune")
FORMS = ("step_size", "moments", "folded_moments")
PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
               "mlp": ("gate_proj", "up_proj", "down_proj")}
LORA_RANK = 8


def plan(quick: bool = False) -> list[dict[str, Any]]:
  """Every run, in the order they run: the fine-tuning first."""
  steps_pre, steps_ft = (6, 4) if quick else (1000, 300)
  seeds = (0,) if quick else (0, 1, 2)
  optimizers_ = ["adamw"] + [f"foam:{f}" for f in FORMS]
  # Full fine-tuning was best at the grid's top (1e-3) for every optimizer,
  # then FOAM's forms at 3e-3 again: the grid was extended up twice by a half
  # decade. LoRA's adapters take larger steps: AdamW's LoRA was best at 3e-3,
  # its grid's top, so LoRA's grids reach 1e-2.
  ft_lrs = {"full": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2), "lora": (3e-4, 1e-3, 3e-3, 1e-2),
            "lora_folded": (3e-4, 1e-3, 3e-3, 1e-2)}
  pre_lrs = {"adamw": (5.62e-4, 1e-3, 1.78e-3), "foam": (5.62e-3, 1e-2, 1.78e-2)}
  runs = []
  modes = {"full": optimizers_, "lora": optimizers_[:2], "lora_folded": optimizers_[1:]}
  for mode, names in modes.items():
    for opt in names:
      for lr in ft_lrs[mode][:1 if quick else None]:
        for seed in seeds:
          runs.append({"phase": "finetune", "mode": mode, "optimizer": opt, "lr": lr,
                       "seed": seed, "steps": steps_ft})
  for opt in optimizers_:
    for lr in pre_lrs[opt.split(":")[0]][:1 if quick else 3]:
      for seed in seeds:
        runs.append({"phase": "pretrain", "mode": "full", "optimizer": opt, "lr": lr,
                     "seed": seed, "steps": steps_pre})
  return runs


def run_key(run: dict[str, Any]) -> str:
  return "|".join(str(run[k]) for k in ("phase", "mode", "optimizer", "lr", "seed", "steps"))


def add_lora(model: model_lib.Llama, rank: int, rngs: nnx.Rngs) -> None:
  """Wraps every attention and MLP projection of ``model`` in an ``nnx.LoRA``."""
  for block in model.layers:
    for part, names in PROJECTIONS.items():
      module = getattr(block, part)
      for name in names:
        base = getattr(module, name)
        setattr(module, name, nnx.LoRA(base.in_features, rank, base.out_features,
                                       base_module=base, rngs=rngs))


def _pretrain_tx(opt: str, lr: float, total: int) -> optax.GradientTransformation:
  family, _, form = opt.partition(":")
  settings = {"bias_correction": form} if form else {}
  return optimizers.make_optimizer(family, lr, total, **settings)


def _fold_every_leaf(params: Any) -> Any:
  return jax.tree.map(lambda _: foam_jax.FoldSpec(axis=-2, level=2), params)


def _finetune_tx(opt: str, lr: float, total: int, mode: str) -> optax.GradientTransformation:
  schedule = foam_jax.paper_schedule(lr, total)  # 10% warmup, cosine to 0.1x.
  family, _, form = opt.partition(":")
  if family == "adamw":
    return optax.adamw(schedule, weight_decay=0.0)
  fold_spec = _fold_every_leaf if mode == "lora_folded" else None
  return foam_jax.foam(schedule, weight_decay=0.0, bias_correction=form, fold_spec=fold_spec)


def _train(model, tx, wrt, dataset, run, batch=8) -> float:
  optimizer = nnx.Optimizer(model, tx, wrt=wrt)

  @nnx.jit
  def step(model, optimizer, batch):
    diff = nnx.DiffState(0, wrt)
    loss, grads = nnx.value_and_grad(steps.loss_fn, argnums=diff)(model, batch)
    optimizer.update(model, grads)
    return loss

  @nnx.jit
  def evaluate(model, batch):
    return steps.loss_fn(model, batch)

  rng = np.random.default_rng(run["seed"])
  for _ in range(run["steps"]):
    step(model, optimizer, dataset.sample_batch(batch, rng))
  val = [float(evaluate(model, b)) for b in dataset.val_batches(batch, 16)]
  return float(np.mean(val))


def _datasets(quick: bool, seq_len: int):
  corpus = stdlib_corpus.load(any_version=quick)
  stdlib = data.TokenDataset.from_splits(corpus.train, corpus.val, seq_len)
  text = tokenizers.ByteTokenizer().encode(data.load_corpus("shakespeare"))
  cut = int(len(text) * 0.9)
  shakespeare = data.TokenDataset.from_splits(text[:cut], text[cut:], seq_len)
  return stdlib, shakespeare, corpus.info["name"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=RESULTS)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--note", default="")
  parser.add_argument("--base-cache", default=None,
                      help="file to keep the base model in between resumed runs")
  parser.add_argument("--seeds", type=int, nargs="+", default=None,
                      help="run only these seeds (processes that share --out may split the "
                           "seeds between them)")
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "runs.json")
  store = json.load(open(path)) if os.path.exists(path) else {"runs": {}}
  store["note"] = args.note or store.get("note", "")
  seq_len = 128
  overrides = {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64} if args.quick else {}
  config = convergence.model_config("tiny", seq_len, **overrides)
  stdlib, shakespeare, corpus_name = _datasets(args.quick, seq_len)
  store["setup"] = {"corpus": corpus_name, "jax": jax.__version__,
                    "model": "tiny" + (" (quick)" if args.quick else ""), "seq_len": seq_len,
                    "batch": 8, "lora_rank": LORA_RANK, "backend": jax.default_backend()}
  with jax.set_mesh(sharding.make_mesh({"fsdp": 1, "tp": 1})):  # The example's model.
    _run_all(store, path, config, stdlib, shakespeare, args.quick, args.base_cache, args.seeds)
  store = _saved(path, store)
  with open(os.path.join(args.out, "finetune.md"), "w") as f:
    f.write(render(store))
  return store


def _base_model(store, config, stdlib, quick, cache: str | None):
  """The AdamW model fine-tuning starts from, trained once (or read from ``cache``)."""
  base_run = {"phase": "base", "mode": "full", "optimizer": "adamw", "lr": 1e-3, "seed": 0,
              "steps": 6 if quick else 1000}
  base = model_lib.Llama(config, rngs=nnx.Rngs(0))
  state = nnx.state(base, nnx.Param)
  if cache and os.path.exists(cache) and store.get("base"):
    with open(cache, "rb") as f:
      nnx.replace_by_pure_dict(state, serialization.from_bytes(nnx.to_pure_dict(state), f.read()))
    return state
  start = time.perf_counter()
  base_loss = _train(base, _pretrain_tx("adamw", 1e-3, base_run["steps"]), nnx.Param, stdlib,
                     base_run)
  store["base"] = {**base_run, "final_val_loss": base_loss,
                   "wall_s": round(time.perf_counter() - start, 1)}
  state = nnx.state(base, nnx.Param)
  if cache:
    with open(cache, "wb") as f:
      f.write(serialization.to_bytes(nnx.to_pure_dict(state)))
  return state


def _saved(path: str, store: dict[str, Any], key: str | None = None,
           result: dict[str, Any] | None = None) -> dict[str, Any]:
  """``store`` with the runs other processes saved to ``path``, and ``result`` added and saved.

  Holds an exclusive lock on ``path + ".lock"`` while it reads and writes, so
  that processes sharing ``--out`` (each with its own ``--seeds``) keep every
  run.
  """
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(path):
      with open(path) as f:
        store["runs"] = {**json.load(f)["runs"], **store["runs"]}
    if key is not None:
      store["runs"][key] = result
      with open(path + ".tmp", "w") as f:
        json.dump(store, f, indent=1)
      os.replace(path + ".tmp", path)
  return store


def _run_all(store, path, config, stdlib, shakespeare, quick, cache=None, seeds=None) -> None:
  runs = [r for r in plan(quick) if seeds is None or r["seed"] in seeds]
  commit = outputs.git_commit()
  base_state = _base_model(store, config, stdlib, quick, cache)
  for run in runs:
    key = run_key(run)
    # Another process sharing --out may have run it since the last read.
    if key in store["runs"] or key in _saved(path, store)["runs"]:
      continue
    start = time.perf_counter()
    if run["phase"] == "pretrain":
      model = model_lib.Llama(config, rngs=nnx.Rngs(run["seed"]))
      loss = _train(model, _pretrain_tx(run["optimizer"], run["lr"], run["steps"]), nnx.Param,
                    stdlib, run)
    else:
      model = model_lib.Llama(config, rngs=nnx.Rngs(0))
      nnx.update(model, jax.tree.map(jnp.copy, base_state))
      wrt = nnx.Param
      if run["mode"].startswith("lora"):
        add_lora(model, LORA_RANK, nnx.Rngs(100 + run["seed"]))
        wrt = nnx.LoRAParam
      loss = _train(model, _finetune_tx(run["optimizer"], run["lr"], run["steps"], run["mode"]),
                    wrt,
                    shakespeare, run)
    _saved(path, store, key, {**run, "final_val_loss": loss,
                              "wall_s": round(time.perf_counter() - start, 1), "commit": commit})
    print(key, round(loss, 4), flush=True)


def render(store: dict[str, Any]) -> str:
  """The report: per phase, mode and optimizer, seed means at each lr."""
  rows: dict[tuple, dict[float, list[float]]] = {}
  for run in store["runs"].values():
    cell = rows.setdefault((run["phase"], run["mode"], run["optimizer"]), {})
    cell.setdefault(run["lr"], []).append(run["final_val_loss"])
  setup = store.get("setup", {})
  lines = ["# Fine-tuning and pre-training with FOAM's bias-correction forms", "",
           f"Model `{setup.get('model')}`, batch {setup.get('batch')} x {setup.get('seq_len')} "
           f"bytes, LoRA rank {setup.get('lora_rank')}, corpus {setup.get('corpus')}, "
           f"jax {setup.get('jax')} on {setup.get('backend')}. Final validation loss, "
           "nats/byte: mean +- std over seeds (n seeds). Base model for fine-tuning: "
           f"AdamW lr 1e-3 seed 0, {store.get('base', {}).get('final_val_loss', float('nan')):.3f}"
           " on the stdlib validation split.", ""]
  if store.get("note"):
    lines += [store["note"], ""]
  for phase, mode in (("finetune", "full"), ("finetune", "lora"), ("finetune", "lora_folded"),
                      ("pretrain", "full")):
    keys = sorted(k for k in rows if k[:2] == (phase, mode))
    if not keys:
      continue
    lines += [f"## {phase}, {mode}", "", "| optimizer | lr: mean +- std (n) | best |",
              "|---|---|---|"]
    for key in keys:
      cells, best = [], None
      for lr, losses in sorted(rows[key].items()):
        mean, std = float(np.mean(losses)), float(np.std(losses, ddof=1) if len(losses) > 1
                                                  else 0.0)
        cells.append(f"{lr:g}: {mean:.3f} +- {std:.3f} ({len(losses)})")
        if len(losses) >= 3 and (best is None or mean < best[1]):
          best = (lr, mean)
      best_text = f"{best[1]:.3f} (lr {best[0]:g})" if best else "-"
      lines.append(f"| {key[2]} | {'; '.join(cells)} | {best_text} |")
    lines.append("")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
