"""Optimizer step time: FOAM vs the optimizers users would pick instead.

Times the optimizer step alone (``tx.update`` + ``optax.apply_updates``,
jitted, params and state donated) on LLaMA-shaped pytrees from ~10M to ~100M
parameters, float32 and bfloat16, for AdamW, Adafactor, Lion, Muon, GaLore,
FOAM levels 1-4 (fold axis -2, the default, and -1), FOAM-Mini, FOAM with
int8 moments, and folded Lion and Muon. All
optimizers of one size are compiled and warmed up first, then timed
side by side in one process, interleaved repeat by repeat (so machine noise
hits all of them alike); each gets the median over repeats, reported as a
ratio to AdamW and as effective bandwidth against a plain jitted copy of the
same pytree (the memory-bandwidth floor). The compiled temporary memory of
each jitted, donated step is reported too (a full-size temporary shows up
there).

Optionally (``--train``) also times the whole train step (forward, backward,
update) of the LLaMA example (``examples.llama``) per optimizer, in tokens/s.
The pytrees are the example's ``Llama`` weights (``nnx.eval_shape``) at the
preset sizes or ``get_config`` overrides of ``tiny`` (``SIZES``); the
optimizers are the example's registry. ``--note`` records what the report
should say about the run (load, processes beside it).

Usage::

  python -m benchmarks.step_time --quick     # seconds, for CI
  python -m benchmarks.step_time --train tiny,20m   # the committed results:
      # benchmarks/results/step_time.md and .json (40 repeats per size and
      # dtype: about an hour on 2 busy cores)
  python -m benchmarks.step_time --sizes 1b --dtypes float32,bfloat16 \\
      --optimizers adamw,foam,foam_l4,foam_l2_ax1,foam_mini \\
      --repeats 10 --inner 5 --warmup 3 --out $OUT/step_time_gpu.md  # GPU
  python -m benchmarks.step_time --render benchmarks/results/step_time.json
      # re-render the Markdown from saved results
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import common
from benchmarks import grid
from benchmarks import step_time_runners as runners_lib
from benchmarks.step_time_report import _mb
from benchmarks.step_time_report import render
from examples.llama import configs
from examples.llama import model

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Sizes in LLaMA proportions (F ~ 2.7 D), matrices dominating like in a real
# LLaMA: the presets, or ``tiny`` with these fields replaced. "60m" is the
# paper's LLaMA-60M (vocab 32000, half its weights are the embedding and
# head, which FOAM leaves to Adam).
SIZES: dict[str, tuple[str, dict[str, int]]] = {
    "1m": ("tiny", dict(hidden_size=128, intermediate_size=344, num_layers=4,
                        vocab_size=1024)),
    "10m": ("tiny", dict(hidden_size=384, intermediate_size=1024, num_layers=5,
                         vocab_size=2048)),
    "50m": ("tiny", dict(hidden_size=768, intermediate_size=2048, num_layers=6,
                         vocab_size=4096)),
    "60m": ("60m", {}),
    "100m": ("tiny", dict(hidden_size=1024, intermediate_size=2736, num_layers=7,
                          vocab_size=8192)),
    "1b": ("1b", {}),
}

# The optimizers compared (registry names), and their settings here over the
# registry's: weight decay as in Optax's defaults (its cost is in the step).
STEP_OPTIMIZERS = ("adamw", "adafactor", "lion", "muon", "galore", "foam_l1", "foam",
                   "foam_l3", "foam_l4", "foam_l1_ax1", "foam_l2_ax1", "foam_l3_ax1",
                   "foam_l4_ax1", "foam_mini", "foam_int8", "foam_lion", "foam_muon")
# AdamW, FOAM and folded Lion with their libraries' default weight decay
# (foam_jax.foam's is AdamW's 1e-4; Lion's 1e-3); the rest without.
SETTINGS: dict[str, dict[str, Any]] = {
    "adamw": {"weight_decay": 1e-4},
    "lion": {"weight_decay": 1e-3},
    "foam_lion": {"weight_decay": 1e-3},
    **{name: {"weight_decay": 1e-4} for name in STEP_OPTIMIZERS
       if name.startswith("foam") and name not in ("foam_lion", "foam_muon")},
}
LR = 1e-3

# The full run's sizes: 10M, 50M and 100M params, float32 and bfloat16.
FULL_SIZES = "10m,50m,100m"
# Compute-bound baselines, timed only on small sizes (--slow-max-params).
SLOW_OPTIMIZERS = ("muon", "galore", "foam_muon")

# Enough to exercise every code path in seconds (CI).
QUICK_OPTIMIZERS = ("adamw", "lion", "foam", "foam_l2_ax1", "foam_mini")


def size_config(size: str, dtype: Any = "float32") -> configs.LlamaConfig:
  """The example's config for benchmark size ``size``, weights in ``dtype``.

  Examples:
    >>> size_config("1m").num_params()
    1053824
  """
  preset, overrides = SIZES[size]
  return configs.get_config(preset, param_dtype=jnp.dtype(dtype).name, **overrides)


def random_params(cfg: configs.LlamaConfig, seed: int = 0) -> dict[str, Any]:
  """The ``Llama(cfg)`` weight pytree filled with ``N(0, 0.02^2)`` values.

  Examples:
    >>> p = random_params(size_config("1m"))
    >>> p["layers"][0]["mlp"]["down_proj"]["kernel"].shape
    (344, 128)
  """
  rng = np.random.default_rng(seed)
  shapes = nnx.to_pure_dict(model.abstract_params(cfg))
  return jax.tree.map(
      lambda s: jnp.asarray((0.02 * rng.standard_normal(s.shape, np.float32)), s.dtype),
      shapes)


def make_tx(name: str, hidden_size: int, lr: float = LR) -> optax.GradientTransformation:
  """Grid optimizer ``name`` at a constant ``lr`` with this benchmark's settings."""
  return grid.make_optimizer(name, lr, hidden_size=hidden_size, **SETTINGS.get(name, {}))


def describe(slow_max_params: float) -> str:
  """What the timed optimizers are, for the results file."""
  return (
      f"Optimizers: the benchmark grid (`benchmarks/grid.py`, the example's families) at "
      f"a constant lr {LR:g}, weight decay {SETTINGS['adamw']['weight_decay']:g} "
      f"for AdamW and every FOAM variant (foam_jax.foam's default) and "
      f"{SETTINGS['lion']['weight_decay']:g} for Lion and folded Lion (Optax's "
      "default), none for the others; Muon and folded Muon (Newton-Schulz, "
      "compute-bound matmuls) and GaLore (rank hidden/4; its SVD is not in the "
      "timed steps) act on the hidden matrices, Adam on the rest, and are timed "
      f"only up to {slow_max_params / 1e6:.0f}M params; `foam_lN` = fold level N "
      "along axis -2 (`foam` = level 2), `foam_lN_ax1` = along axis -1, embed/"
      "lm_head/norms Adam; `foam_mini` = one block per fold axis; `foam_int8` = "
      "`foam` with int8 moments; `foam_lion`/`foam_muon` = folded Lion/Muon at "
      "level 2.")


def bench_size(size: str, dtype_name: str, names: list[str], *, warmup: int,
               repeats: int, inner: int) -> dict[str, Any]:
  """Times every optimizer in ``names`` on one size and dtype, side by side."""
  cfg = size_config(size, dtype_name)
  params = random_params(cfg, seed=0)
  grads = random_params(cfg, seed=1)
  param_bytes = common.tree_bytes(params)
  runners = [runners_lib.CopyRunner(params)]
  for name in names:
    runners.append(runners_lib.Runner(name, make_tx(name, cfg.hidden_size), params, grads))
  del params
  times = runners_lib.time_interleaved(runners, warmup=warmup, repeats=repeats, inner=inner)
  med = {k: statistics.median(v) for k, v in times.items()}
  copy_bw = 2 * param_bytes / med["copy"]
  rows = []
  for r in runners[1:]:
    # Bytes an ideal fused step must move: read params, grads and state;
    # write params and state.
    moved = 3 * param_bytes + 2 * r.state_bytes
    rows.append({
        "optimizer": r.name,
        "median_ms": 1e3 * med[r.name],
        "times_ms": [1e3 * t for t in times[r.name]],
        "ratio_to_adamw": med[r.name] / med["adamw"] if "adamw" in med else None,
        "paired_ratio_median": (
            statistics.median(a / b for a, b in zip(times[r.name], times["adamw"]))
            if "adamw" in times else None),
        "state_bytes": r.state_bytes,
        "min_bytes_moved": moved,
        "effective_gbps": moved / med[r.name] / 1e9,
        "fraction_of_copy_bw": moved / med[r.name] / copy_bw,
        **r.memory,
    })
  for r in runners:
    r.release()
  return {
      "size": size,
      "dtype": dtype_name,
      "num_params": cfg.num_params(),
      "shape": {"hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size,
                "layers": cfg.num_layers, "vocab": cfg.vocab_size},
      "param_bytes": param_bytes,
      "copy_ms": 1e3 * med["copy"],
      "copy_gbps": copy_bw / 1e9,
      "rows": rows,
  }


def bench_train(preset: str, names: list[str], *, warmup: int, repeats: int,
                batch_size: int = 16, seq_len: int | None = None) -> dict[str, Any]:
  """Tokens/s of the example's jitted train step, per optimizer, side by side.

  Args:
    preset: a key of the example's ``configs.PRESETS``.
    names: optimizer names of the example's ``make_optimizer``.
    warmup: untimed steps per optimizer first.
    repeats: interleaved timed steps per optimizer.
    batch_size: sequences per step.
    seq_len: tokens per sequence (default: the preset's ``max_seq_len``).

  Returns:
    A dict with the config and one row per optimizer.
  """
  model_cfg = configs.get_config(preset)
  seq = seq_len or model_cfg.max_seq_len
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, model_cfg.vocab_size, (batch_size, seq + 1))
  batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
           "targets": jnp.asarray(tokens[:, 1:], jnp.int32)}
  runners = [runners_lib.TrainRunner(n, model_cfg, batch) for n in names]
  times = runners_lib.time_interleaved(runners, warmup=warmup, repeats=repeats, inner=1)
  med = {k: statistics.median(v) for k, v in times.items()}
  per_step = batch_size * seq
  rows = [{
      "optimizer": r.name,
      "median_ms": 1e3 * med[r.name],
      "times_ms": [1e3 * t for t in times[r.name]],
      "tokens_per_s": per_step / med[r.name],
      "ratio_to_adamw": med["adamw"] / med[r.name] if "adamw" in med else None,
      **r.memory,
  } for r in runners]
  for r in runners:
    r.release()
  return {"preset": preset, "num_params": model_cfg.num_params(),
          "batch_size": batch_size, "seq_len": seq,
          "tokens_per_step": per_step, "rows": rows}




def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="tiny sizes and few repeats (seconds; for CI)")
  parser.add_argument("--sizes", default=None,
                      help=f"comma-separated, from {sorted(SIZES)}; an "
                      "entry SIZE/DTYPE runs only for that dtype (default: "
                      f"{FULL_SIZES})")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--optimizers", default=None,
                      help="comma-separated names (default: all)")
  parser.add_argument("--repeats", type=int, default=None)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--inner", type=int, default=None,
                      help="back-to-back steps per timed repeat")
  parser.add_argument("--train", default=None,
                      help="comma-separated LLaMA example presets to time "
                      "whole train steps on (e.g. tiny,20m)")
  parser.add_argument("--train-optimizers", default=None,
                      help="registry names (default: adamw, foam, foam_mini, "
                      "adafactor, lion, muon)")
  parser.add_argument("--train-batch", type=int, default=8,
                      help="sequences per train step")
  parser.add_argument("--slow-max-params", type=float, default=15e6,
                      help="time Muon and GaLore only up to this many params "
                      "(Muon's Newton-Schulz matmuls take seconds per step on "
                      "CPU; GaLore's SVDs at init take minutes)")
  parser.add_argument("--render", default=None,
                      help="only re-render the Markdown from this JSON file")
  parser.add_argument("--out", default=None,
                      help="Markdown report path (JSON written next to it)")
  parser.add_argument("--note", action="append", default=[],
                      help="a sentence the report shows about this run (load, "
                      "processes beside it); repeatable")
  args = parser.parse_args(argv)
  if args.render:
    with open(args.render, encoding="utf-8") as f:
      results = json.load(f)
    out = args.out or os.path.splitext(args.render)[0] + ".md"
    with open(out, "w", encoding="utf-8") as f:
      f.write(render(results))
    print(f"wrote {out}")
    return results

  names = list(QUICK_OPTIMIZERS if args.quick else STEP_OPTIMIZERS)
  if args.optimizers:
    names = args.optimizers.split(",")
    unknown = sorted(set(names) - set(grid.NAMES))
    if unknown:
      raise ValueError(f"--optimizers: unknown {unknown}; known: {grid.NAMES}")
  if "adamw" not in names:
    names = ["adamw"] + names
  if args.quick:
    sizes = (args.sizes or "1m").split(",")
    repeats, inner = args.repeats or 3, args.inner or 1
    dtypes = args.dtypes.split(",")
    if args.dtypes == "float32,bfloat16":  # The default: one dtype is enough.
      dtypes = dtypes[:1]
  else:
    sizes = (args.sizes or FULL_SIZES).split(",")
    repeats, inner = args.repeats or 40, args.inner or 1
    dtypes = args.dtypes.split(",")
  configs = []
  for dtype in dtypes:
    for entry in sizes:
      size, _, only = entry.partition("/")
      if size not in SIZES:
        raise ValueError(f"--sizes: unknown size {size!r}; known: {sorted(SIZES)}")
      if not only or only == dtype:
        configs.append((size, dtype))

  out = args.out
  if out is None and not args.quick:
    out = os.path.join(RESULTS_DIR, "step_time.md")
  results = {"machine": common.machine_info(), "repeats": repeats,
             "inner": inner, "slow_max_params": args.slow_max_params,
             "notes": [describe(args.slow_max_params)] + args.note,
             "step": [], "train": []}
  for size, dtype in configs:
    start = time.perf_counter()
    size_names = [n for n in names if n not in SLOW_OPTIMIZERS
                  or size_config(size).num_params() <= args.slow_max_params]
    res = bench_size(size, dtype, size_names, warmup=args.warmup,
                     repeats=repeats, inner=inner)
    results["step"].append(res)
    save(results, out)  # Partial results survive an interrupted run.
    adam = next(r for r in res["rows"] if r["optimizer"] == "adamw")
    print(f"{size} {dtype}: copy {res['copy_ms']:.2f} ms, adamw "
          f"{adam['median_ms']:.2f} ms ({time.perf_counter() - start:.0f}s)",
          flush=True)
    for r in res["rows"]:
      print(f"  {r['optimizer']:>14s} {r['median_ms']:9.2f} ms  "
            f"x{r['ratio_to_adamw']:.3f} (paired {r['paired_ratio_median']:.3f})"
            f"  temp {_mb(r.get('temp_bytes'))} MiB", flush=True)
  if args.train:
    train_names = (args.train_optimizers.split(",") if args.train_optimizers
                   else ["adamw", "foam", "foam_mini", "adafactor", "lion",
                         "muon"])
    for preset in args.train.split(","):
      res = bench_train(preset, train_names, warmup=args.warmup,
                        repeats=repeats, batch_size=args.train_batch)
      results["train"].append(res)
      save(results, out)
      for r in res["rows"]:
        print(f"train {preset} {r['optimizer']:>10s} {r['median_ms']:8.1f} ms "
              f"{r['tokens_per_s']:9.0f} tok/s x{r['ratio_to_adamw']:.3f}",
              flush=True)

  save(results, out)
  if out:
    print(f"wrote {out}")
  return results


def save(results: dict[str, Any], out: str | None) -> None:
  """Writes the Markdown report and its JSON (no-op when ``out`` is None)."""
  if not out:
    return
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w", encoding="utf-8") as f:
    f.write(render(results))
  with open(os.path.splitext(out)[0] + ".json", "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
