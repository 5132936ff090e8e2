"""Convergence benchmark: FOAM vs the optimizers users would pick instead.

Byte-level LLaMA (the example's ``tiny`` and ``20m`` shapes, vocabulary 256)
trained for a fixed token budget on Tiny Shakespeare and on the example's
built-in corpus. Fair tuning: every optimizer gets the same learning-rate grid
(log-spaced) and the same schedule (10% warmup, cosine to 0.1x), its other
settings from its docs (FOAM: the paper's recipe); the best lr on validation
is rerun with more seeds. Also an ablation of FOAM (level, residual, second
moment form, alpha).

Results go to ``benchmarks/results/convergence.json`` after every run (a
rerun resumes, skipping runs already there), ``convergence.md`` and PNG
plots. ``--quick`` trains a few steps of a shrunken model (CI).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (_ROOT, os.path.join(_ROOT, "examples", "llama")):
  if _p not in sys.path:
    sys.path.insert(0, _p)

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from optax import contrib as optax_contrib

import configs as configs_lib  # examples/llama
import foam_jax
import model as model_lib  # examples/llama
from benchmarks import common
from benchmarks import memory as memory_bench

OPTIMIZERS = ("adamw", "adafactor", "lion", "muon", "galore", "foam",
              "foam_mini")
SHAKESPEARE = os.path.join(os.path.dirname(_ROOT), "shared", "data",
                           "tinyshakespeare.txt")


# --------------------------------------------------------------------------
# Data: bytes, a fixed validation split, random training windows.
# --------------------------------------------------------------------------


def builtin_corpus() -> bytes:
  """The example's built-in corpus: the stdlib's pydoc topics text."""
  import data as data_lib  # pylint: disable=g-import-not-at-top
  return data_lib.default_corpus().encode("utf-8")


def load_dataset(name: str) -> np.ndarray:
  """``uint8`` bytes of dataset ``name`` (``shakespeare`` or ``builtin``)."""
  if name == "shakespeare":
    with open(SHAKESPEARE, "rb") as f:
      return np.frombuffer(f.read(), np.uint8)
  if name == "builtin":
    return np.frombuffer(builtin_corpus(), np.uint8)
  raise ValueError(f"dataset must be 'shakespeare' or 'builtin', got {name!r}.")


def split(data: np.ndarray, val_fraction: float = 0.1):
  """Train on the first 90%, validate on the last 10% (no overlap)."""
  cut = int(len(data) * (1 - val_fraction))
  return data[:cut], data[cut:]


def val_batches(val: np.ndarray, num: int, batch: int, seq_len: int):
  """``num`` fixed batches of evenly spaced windows of the validation split."""
  starts = np.linspace(0, len(val) - seq_len - 2, num * batch).astype(int)
  windows = np.stack([val[s:s + seq_len + 1] for s in starts]).astype(np.int32)
  return windows.reshape(num, batch, seq_len + 1)


def train_windows(train: np.ndarray, batch: int, seq_len: int,
                  rng: np.random.Generator) -> np.ndarray:
  starts = rng.integers(0, len(train) - seq_len - 1, batch)
  return np.stack([train[s:s + seq_len + 1] for s in starts]).astype(np.int32)


# --------------------------------------------------------------------------
# Optimizers: one schedule for all, each one's documented other settings.
# --------------------------------------------------------------------------


def make_optimizer(name: str, lr: float, total_steps: int, *,
                   hidden_size: int = 128, **foam_kwargs
                   ) -> optax.GradientTransformation:
  """Optimizer ``name`` with peak lr ``lr`` on :func:`foam_jax.paper_schedule`.

  * ``adamw``: betas (0.9, 0.95), eps 1e-8, no weight decay (paper recipe).
  * ``adafactor``: Optax defaults (factored second moment, no momentum,
    update clipping 1, relative step scaled by parameter RMS).
  * ``lion``: Optax defaults (betas 0.9, 0.99, weight decay 1e-3).
  * ``muon``: Optax defaults (beta 0.95, Nesterov, 5 Newton-Schulz steps) on
    the hidden matrices; embeddings, head and norms get its Adam at the same
    lr.
  * ``galore``: the GaLore paper's recipe on the same matrices: rank
    ``hidden_size / 4`` (its 128 at width 512), scale 0.25, Adam with
    AdamW's betas here in the subspace; the projection is refreshed every
    ``total_steps / 4`` steps (the paper's 200 is for runs of 10k+ steps:
    Optax's default 200 would fix one subspace for a whole 200-step run).
  * ``foam``: the paper's recipe: level 2, alpha 0.25, betas (0.9, 0.95);
    ``foam_kwargs`` override it (the ablation).
  * ``foam_mini``: the same with the whole fold axis as one block.
  """
  sched = foam_jax.paper_schedule(lr, total_steps)
  if name == "adamw":
    return optax.adamw(sched, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0)
  if name == "adafactor":
    return optax.adafactor(sched)
  if name == "lion":
    return optax.lion(sched)
  if name == "muon":
    return optax_contrib.muon(sched, muon_weight_dimension_numbers=(
        memory_bench.matrix_dims(optax_contrib.MuonDimensionNumbers)))
  if name == "galore":
    return optax_contrib.galore(
        sched, rank=max(1, hidden_size // 4),
        update_proj_gap=max(1, total_steps // 4), scale=0.25,
        base_optimizer=optax.scale_by_adam(b1=0.9, b2=0.95, eps=1e-8),
        weight_dimension_numbers=memory_bench.matrix_dims(
            optax_contrib.GaLoreDimensionNumbers))
  if name in ("foam", "foam_mini"):
    kw = dict(b1=0.9, b2=0.95, weight_decay=0.0, alpha=0.25)
    kw.update(foam_kwargs)
    if name == "foam_mini":
      return foam_jax.foam_mini(sched, **kw)
    return foam_jax.foam(sched, **kw)
  raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}.")


# --------------------------------------------------------------------------
# One training run.
# --------------------------------------------------------------------------


def model_config(name: str, seq_len: int, **overrides):
  """Byte-level, float32 (CPU) version of the example's preset ``name``."""
  return configs_lib.get_config(name, vocab_size=256, max_seq_len=seq_len,
                                dtype="float32", param_dtype="float32",
                                remat=False, **overrides)


_COMPILED: dict[Any, Any] = {}


def _compiled(spec, graphdef, params, vb, hidden_size):
  """The compiled train step and eval for ``spec``'s shapes and optimizer.

  Every optimizer here is linear in its peak learning rate (the update is
  ``-lr * schedule(t) / lr * direction``, weight decay included), so the
  step takes ``lr`` as an argument and multiplies the unit-peak update by
  it: one compilation serves the whole lr grid and every seed.
  """
  key = (spec["model"], json.dumps(spec.get("model_overrides", {}),
                                   sort_keys=True),
         spec["optimizer"], json.dumps(spec.get("foam", {}), sort_keys=True),
         spec["steps"], spec["batch"], spec["seq_len"], vb.shape)
  if key in _COMPILED:
    return _COMPILED[key]
  tx = make_optimizer(spec["optimizer"], 1.0, spec["steps"],
                      hidden_size=hidden_size, **spec.get("foam", {}))

  def loss_fn(p, tokens_BT):
    logits_BTV = nnx.merge(graphdef, p)(tokens_BT[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits_BTV, tokens_BT[:, 1:]).mean()

  def step(p, s, tokens_BT, lr):
    loss, grads = jax.value_and_grad(loss_fn)(p, tokens_BT)
    updates, s = tx.update(grads, s, p)
    updates = jax.tree.map(lambda u: (lr * u).astype(u.dtype), updates)
    return optax.apply_updates(p, updates), s, loss

  b, t = spec["batch"], spec["seq_len"]
  opt_state = jax.eval_shape(tx.init, params)
  step_c = jax.jit(step, donate_argnums=(0, 1)).lower(
      params, opt_state, jax.ShapeDtypeStruct((b, t + 1), jnp.int32),
      jax.ShapeDtypeStruct((), jnp.float32)).compile()
  eval_c = jax.jit(lambda p, v: jax.vmap(lambda x: loss_fn(p, x))(v).mean()
                   ).lower(params, vb).compile()
  _COMPILED[key] = (tx, step_c, eval_c)
  return _COMPILED[key]


def train_run(spec: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
  """Trains one model as ``spec`` says; returns its curves and final loss.

  ``spec`` keys: ``model``, ``dataset``, ``optimizer``, ``lr``, ``seed``,
  ``steps``, ``batch``, ``seq_len``, ``evals`` (number of validation points),
  ``foam`` (extra FOAM kwargs) and optionally ``model_overrides``.
  Wall-clock counts the training steps (data sampling included, compiled
  ahead of time); the validation passes are not counted.
  """
  config = model_config(spec["model"], spec["seq_len"],
                        **spec.get("model_overrides", {}))
  with nnx.use_eager_sharding(False):
    model = model_lib.Llama(config, rngs=nnx.Rngs(spec["seed"]))
  graphdef, params = nnx.split(model, nnx.Param)
  train, val = data["train"], data["val"]
  b, t = spec["batch"], spec["seq_len"]
  vb = jnp.asarray(val_batches(val, spec.get("val_batches", 4), b, t))
  tx, step_c, eval_c = _compiled(spec, graphdef, params, vb,
                                 config.hidden_size)
  opt_state = tx.init(params)
  lr = jnp.float32(spec["lr"])

  rng = np.random.default_rng(spec["seed"])
  steps = spec["steps"]
  eval_at = sorted({int(round(i * steps / spec["evals"]))
                    for i in range(1, spec["evals"] + 1)})
  curve, train_curve = [], []
  wall = 0.0
  loss = None
  for i in range(1, steps + 1):
    start = time.perf_counter()
    tokens = train_windows(train, b, t, rng)
    params, opt_state, loss = step_c(params, opt_state, tokens, lr)
    loss = float(loss)  # Blocks, so the step's time is complete.
    wall += time.perf_counter() - start
    if i % 10 == 0 or i == steps:
      train_curve.append((i * b * t, wall, loss))
    if i in eval_at:
      curve.append((i * b * t, wall, float(eval_c(params, vb))))
  final = curve[-1][2]
  return {**spec, "val_curve": curve, "train_curve": train_curve,
          "final_val_loss": final if math.isfinite(final) else None,
          "wall_s": wall, "tokens": steps * b * t,
          "params": sum(x.size for x in jax.tree.leaves(params))}


# --------------------------------------------------------------------------
# The plan: grid, seeds, ablation; resumable.
# --------------------------------------------------------------------------


def run_id(spec) -> str:
  extra = ",".join(f"{k}={v}" for k, v in sorted(spec.get("foam", {}).items()))
  return (f"{spec['model']}/{spec['dataset']}/{spec['optimizer']}"
          f"[{extra}]/lr={spec['lr']:.3g}/seed={spec['seed']}"
          f"/{spec['steps']}x{spec['batch']}x{spec['seq_len']}")


class Store:
  """Run results in a JSON file, written after every run."""

  def __init__(self, path: str, meta: dict[str, Any]):
    self.path = path
    self.data = {"meta": meta, "runs": {}}
    if os.path.exists(path):
      with open(path) as f:
        old = json.load(f)
      self.data["runs"] = old.get("runs", {})
      self.data["meta"]["previous"] = old.get("meta")

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


def execute(store, spec, data, log):
  if store.get(spec) is not None:
    return store.get(spec)
  start = time.perf_counter()
  result = train_run(spec, data)
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


def run_plan(p, store, log, only=None):
  datasets = {}
  for kind, base, opt in plan_phases(p, only):
    lrs = p["lrs"]
    extend = p.get("extend_edges", 0)
    if base["dataset"] not in datasets:
      tr, va = split(load_dataset(base["dataset"]))
      datasets[base["dataset"]] = {"train": tr, "val": va}
    data = datasets[base["dataset"]]
    point = lambda lr, seed, foam=None, o=opt, b=base: {
        **b, "optimizer": o, "lr": lr, "seed": seed, "foam": foam or {}}
    if kind == "grid":
      tuned_grid(store, base, opt, lrs, extend,
                 run=lambda lr: execute(store, point(lr, 0), data, log))
    elif kind == "seeds":
      lr = best_lr(store, base, opt, tuned_grid(store, base, opt, lrs, extend))
      seeds = p["seeds"]
      for seed in range(1, seeds) if lr is not None else ():
        execute(store, point(lr, seed), data, log)
    else:
      lr = best_lr(store, base, "foam",
                   tuned_grid(store, base, "foam", lrs, extend))
      for change in p.get("ablation_changes", ABLATION):
        execute(store, point(lr, 0, change, "foam"), data, log)


def _runs_for(data, model, dataset):
  return [r for r in data["runs"].values()
          if r["model"] == model and r["dataset"] == dataset]


def _mean_sd(xs):
  xs = [x for x in xs if x is not None]
  if not xs:
    return None, None
  return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def tokens_to_reach(curve, target):
  """Tokens at which a validation curve first reaches ``target``.

  Linear interpolation between evaluation points; ``None`` if never.
  """
  prev = None
  for tokens, _, loss in curve:
    if loss is not None and loss <= target:
      if prev is None or prev[1] <= target:
        return tokens
      t0, l0 = prev
      return t0 + (tokens - t0) * (l0 - target) / (l0 - loss)
    prev = (tokens, loss)
  return None


def summarize(data, plan):
  """Per model/dataset/optimizer: best lr, seeds, mean +- sd, tokens-to-target."""
  out = []
  for model_name, datasets, opts in plan["suites"]:
    for dataset in datasets:
      runs = _runs_for(data, model_name, dataset)
      plain = [r for r in runs if not r["foam"]]
      base = {"model": model_name, "dataset": dataset,
              **plan["shape"][model_name], "evals": plan["evals"], "foam": {}}
      rows = []
      for opt in opts:
        lrs = tuned_grid(_View(data), base, opt,
                         plan["lrs"],
                         plan.get("extend_edges", 0))
        grid = {r["lr"]: r["final_val_loss"] for r in plain
                if r["optimizer"] == opt and r["seed"] == 0 and r["lr"] in lrs}
        lr = best_lr(_View(data), base, opt, lrs)
        seeds = sorted((r for r in plain if r["optimizer"] == opt
                        and r["lr"] == lr), key=lambda r: r["seed"])
        mean, sd = _mean_sd([r["final_val_loss"] for r in seeds])
        rows.append({"optimizer": opt, "grid": grid, "lrs": lrs, "lr": lr,
                     "seeds": seeds, "mean": mean, "sd": sd,
                     "wall": _mean_sd([r["wall_s"] for r in seeds])[0]})
      adam = next((r for r in rows if r["optimizer"] == "adamw"), None)
      target = adam["mean"] if adam else None
      for r in rows:
        if target is None or not r["seeds"]:
          continue
        reach = [tokens_to_reach(x["val_curve"], target) for x in r["seeds"]]
        r["reach"] = reach
      ablation = [r for r in runs if r["foam"]]
      out.append({"model": model_name, "dataset": dataset, "rows": rows,
                  "target": target, "ablation": ablation})
  return out


class _View:
  """Read-only :class:`Store` lookalike over loaded data."""

  def __init__(self, data):
    self.data = data

  def get(self, spec):
    return self.data["runs"].get(run_id(spec))


def _plot(suite, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for r in suite["rows"]:
    if not r["seeds"]:
      continue
    curves = [np.array(x["val_curve"], dtype=float) for x in r["seeds"]]
    n = min(len(c) for c in curves)
    stack = np.stack([c[:n] for c in curves])
    label = f"{r['optimizer']} (lr {r['lr']:g}, {len(curves)} seeds)"
    mean = stack[:, :, 2].mean(0)
    axes[0].plot(stack[0, :, 0] / 1e3, mean, marker="o", label=label)
    axes[1].plot(stack[:, :, 1].mean(0), mean, marker="o", label=label)
  if suite["target"] is not None:
    for ax in axes:
      ax.axhline(suite["target"], color="gray", ls=":", lw=1)
  axes[0].set_xlabel("training tokens (thousands)")
  axes[1].set_xlabel("training wall-clock (s, this shared CPU)")
  axes[0].set_ylabel("validation loss (nats/byte)")
  axes[0].legend(fontsize=8)
  fig.suptitle(f"LLaMA {suite['model']} (bytes) on {suite['dataset']}: "
               "best lr per optimizer, mean over seeds")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _fmt(x, nd=3):
  return "" if x is None else f"{x:.{nd}f}"


def _commands(meta) -> list[str]:
  """Commands that produced the runs of a store, oldest first."""
  out = []
  while meta:
    m = meta["machine"]
    out.insert(0, f"`{m['command']}` ({m['date']}, {m['cpu']})")
    for merged in meta.get("merged", []):
      # Older stores kept merged runs' commands as plain strings.
      out.extend([f"`{c}`" for c in merged] if isinstance(merged, list)
                 else _commands(merged))
    meta = meta.get("previous")
  return [c for c in dict.fromkeys(out) if "--report-only" not in c]


def write_report(data, plan, out):
  """Writes ``convergence.md`` (and one PNG per model/dataset)."""
  meta = data["meta"]
  lines = ["# Convergence benchmark", ""]
  lines += common.header_lines(meta["machine"])
  lines += ["- Runs produced by (resumed or in parallel; each command with "
            "the date and CPU it started on): "
            + "; ".join(_commands(meta)), ""]
  lines += [
      "Byte-level LLaMA (the example's presets with vocabulary 256, float32, "
      "no remat) trained with next-byte cross-entropy on random windows of "
      "the first 90% of each corpus, validated on fixed windows of the last "
      "10%. Every optimizer gets the same peak-lr grid "
      f"{plan['lrs']}, extended by the next half-decade value past an end "
      "while its best lr is at that end (at most "
      f"{plan.get('extend_edges', 0)} times; the same rule for all), on the "
      "same schedule (`foam_jax.paper_schedule`: 10% "
      "linear warmup, cosine to 0.1x), its other settings from its docs "
      "(see `make_optimizer` in `benchmarks/convergence.py`; FOAM: the "
      "paper's level 2, alpha 0.25, betas 0.9/0.95); best lr on seed 0's "
      f"final validation loss, then {plan['seeds']} seeds in all at that lr "
      "(seed = init + data order). Wall-clock is training steps only. The "
      "tiny grids ran on a CPU shared with other jobs whose load changed "
      "(the same run took 20-180 s); the 20m suites and the tiny grid "
      "extensions ran as two single-threaded processes side by side "
      "(`XLA_FLAGS=\"--xla_cpu_multi_thread_eigen=false "
      "intra_op_parallelism_threads=1\"`, one per corpus). The wall-clock "
      "column and plots are therefore no speed comparison; "
      "`results/step_time.md` measures speed.", ""]
  for suite in summarize(data, plan):
    model_name, dataset = suite["model"], suite["dataset"]
    shape = plan["shape"][model_name]
    done = [r for r in suite["rows"] if r["seeds"]]
    if not done:
      lines += [f"## {model_name} on {dataset}", "", "Not run (time).", ""]
      continue
    tokens = shape["steps"] * shape["batch"] * shape["seq_len"]
    lrs = sorted({lr for r in suite["rows"] for lr in r["lrs"]})
    params = done[0]["seeds"][0]["params"]
    lines += [f"## {model_name} ({params / 1e6:.2f}M weights) on {dataset}",
              "", f"{shape['steps']} steps x {shape['batch']} x "
              f"{shape['seq_len']} bytes = {tokens:,} tokens per run; "
              f"{plan['evals']} validation points per run.", "",
              "### Learning-rate grid (final val loss, seed 0; best in bold)",
              "", "| optimizer | " + " | ".join(f"{lr:g}" for lr in lrs)
              + " |", "|---|" + "---|" * len(lrs)]
    for r in suite["rows"]:
      cells = []
      for lr in lrs:
        v = r["grid"].get(lr)
        if lr not in r["lrs"]:
          cell = "-"
        elif lr not in r["grid"]:
          cell = "not run"
        else:
          cell = "diverged" if v is None else f"{v:.3f}"
        cells.append(f"**{cell}**" if lr == r["lr"] else cell)
      lines.append(f"| {r['optimizer']} | " + " | ".join(cells) + " |")
    if any(lr not in r["lrs"] for r in suite["rows"] for lr in lrs):
      lines += ["", "\"-\": outside that optimizer's grid (its best lr was "
                "not at that end, so its grid was not extended there)."]
    if any(r["lr"] in (r["lrs"][0], r["lrs"][-1]) for r in done):
      lines += ["", "\"(grid edge)\": the best lr is still at an end of the "
                "grid after the extensions, so a wider grid might improve "
                "that optimizer further."]
    short = [r["optimizer"] for r in suite["rows"]
             if r["grid"] and any(lr not in r["grid"] for lr in r["lrs"])]
    if short:
      lines += ["", f"Grid incomplete for {', '.join(short)} (time ran "
                "out): their \"best lr\" is the best of the points run, not "
                "a tuned value."]
    lines += ["", "### At the best lr", "",
              "| optimizer | best lr | seeds | final val loss (mean +- sd) | "
              "vs AdamW | tokens to AdamW's final loss (per seed) | train s "
              "per run |", "|---|---|---|---|---|---|---|"]
    adam = next((r for r in done if r["optimizer"] == "adamw"), None)
    for r in done:
      edge = (" (grid edge)" if r["lr"] in (r["lrs"][0], r["lrs"][-1])
              else "")
      diff = ("" if adam is None or r is adam
              else f"{r['mean'] - adam['mean']:+.3f}")
      reach = ", ".join("not reached" if x is None else f"{x / 1e3:.0f}k"
                        for x in r.get("reach", []))
      lines.append(
          f"| {r['optimizer']} | {r['lr']:g}{edge} | {len(r['seeds'])} | "
          f"{r['mean']:.3f} +- {r['sd']:.3f} | {diff} | {reach} | "
          f"{r['wall']:.1f} |")
    foam = next((r for r in done if r["optimizer"] == "foam"), None)
    if adam and foam and adam is not foam:
      lines += ["", f"FOAM (paper recipe) {foam['mean']:.3f} +- "
                f"{foam['sd']:.3f} ({len(foam['seeds'])} seeds, lr "
                f"{foam['lr']:g}) vs "
                + ("tuned AdamW" if all(lr in adam["grid"] for lr in adam["lrs"])
                   else "AdamW (not tuned here)")
                + f" {adam['mean']:.3f} +- "
                f"{adam['sd']:.3f} ({len(adam['seeds'])} seeds, lr "
                f"{adam['lr']:g}): difference {foam['mean'] - adam['mean']:+.3f}"
                " nats/byte."]
    png = f"convergence_{model_name}_{dataset}.png"
    _plot(suite, os.path.join(out, png))
    lines += ["", f"![loss curves]({png})", ""]
    if suite["ablation"]:
      foam = next((r for r in done if r["optimizer"] == "foam"), None)
      lines += ["### FOAM ablation (seed 0, FOAM's best lr; one change from "
                "the recipe each)", ""]
      if foam:
        base0 = next((x for x in foam["seeds"] if x["seed"] == 0), None)
        lines += [f"Recipe (level 2, residual 1, mean of squares, alpha "
                  f"0.25) at lr {foam['lr']:g}: seed 0 "
                  f"{_fmt(base0 and base0['final_val_loss'])}, "
                  f"{len(foam['seeds'])} seeds {foam['mean']:.3f} +- "
                  f"{foam['sd']:.3f} (the seed-to-seed noise to judge "
                  "differences by).", ""]
      lines += ["| change | lr | final val loss | vs recipe seed 0 |",
                "|---|---|---|---|"]
      for r in sorted(suite["ablation"], key=lambda r: json.dumps(r["foam"])):
        change = ", ".join(f"{k}={v}" for k, v in r["foam"].items())
        note = {"fold_level=0": " (= Adam x alpha)",
                "residual_scale=0.0": " (no residual)"}.get(change, "")
        diff = ("" if not foam or base0 is None or r["final_val_loss"] is None
                else f"{r['final_val_loss'] - base0['final_val_loss']:+.3f}")
        lines.append(f"| {change}{note} | {r['lr']:g} | "
                     f"{_fmt(r['final_val_loss'])} | {diff} |")
      lines += ["", "Level 0 is Adam whose matrices step `alpha * lr` while "
                "embeddings, head and norms step `lr`: comparing it with the "
                "recipe separates what folding does from what FOAM's split "
                "step size does. AdamW steps every weight at `lr`.", ""]
  with open(os.path.join(out, "convergence.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


FULL_PLAN = {
    # (model, datasets, optimizers) in order of importance.
    "suites": [
        ("20m", ["shakespeare", "builtin"],
         ("adamw", "foam", "foam_mini", "lion", "adafactor", "muon",
          "galore")),
        ("tiny", ["shakespeare", "builtin"],
         ("adamw", "foam", "foam_mini", "lion", "adafactor", "muon",
          "galore")),
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

PLANS = {"full": FULL_PLAN, "quick": QUICK_PLAN, "gpu": GPU_PLAN}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="a few steps of a shrunken model (CI).")
  parser.add_argument("--out", default=os.path.join(_ROOT, "benchmarks",
                                                    "results"))
  parser.add_argument("--plan", choices=sorted(PLANS), default=None,
                      help="run set (default: full; --quick selects quick)")
  parser.add_argument("--only", nargs="*", metavar="MODEL/DATASET",
                      help="run only these suites (e.g. 20m/shakespeare)")
  parser.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                      help="add the runs of other convergence.json files "
                      "(parallel runs) before reporting")
  parser.add_argument("--report-only", action="store_true",
                      help="render the report from the JSON, train nothing.")
  args = parser.parse_args(argv)
  plan = PLANS[args.plan or ("quick" if args.quick else "full")]
  os.makedirs(args.out, exist_ok=True)
  store = Store(os.path.join(args.out, "convergence.json"),
                {"machine": common.machine_info(), "plan": plan,
                 "quick": args.quick})
  log = lambda s: print(s, flush=True)
  for path in args.merge:
    with open(path) as f:
      other = json.load(f)
    store.data["runs"].update(other["runs"])
    store.data["meta"].setdefault("merged", []).append(other["meta"])
  if args.merge:
    store.put_all()
  if not args.report_only:
    run_plan(plan, store, log, args.only)
  write_report(store.data, plan, args.out)
  log(f"wrote {os.path.join(args.out, 'convergence.md')}")
  return store.data


if __name__ == "__main__":
  main()
