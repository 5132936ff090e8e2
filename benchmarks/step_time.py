"""Optimizer step time: FOAM vs the optimizers users would pick instead.

Times the optimizer step alone (``tx.update`` + ``optax.apply_updates``,
jitted, params and state donated) on LLaMA-shaped pytrees from ~1M to ~100M
parameters, float32 and bfloat16, for AdamW, Adafactor, Lion, Muon, GaLore,
FOAM levels 1-4 (fold axis -2, the default, and -1) and FOAM-Mini. All
optimizers of one size are compiled and warmed up first, then timed
side by side in one process, interleaved repeat by repeat (so machine noise
hits all of them alike); each gets the median over repeats, reported as a
ratio to AdamW and as effective bandwidth against a plain jitted copy of the
same pytree (the memory-bandwidth floor). The compiled temporary memory of
each jitted, donated step is reported too (a full-size temporary shows up
there).

Optionally (``--train``) also times the whole train step (forward, backward,
update) of the LLaMA example in ``examples/llama`` per optimizer, in tokens/s.

Usage::

  python benchmarks/step_time.py --quick     # seconds, for CI
  python benchmarks/step_time.py --train tiny,20m   # the committed results:
      # benchmarks/results/step_time.md and .json (~18 min on 2 busy cores)
  python benchmarks/step_time.py --sizes 1b --dtypes float32,bfloat16 \\
      --optimizers adamw,foam-l2,foam-l4,foam-l2-ax-1,foam-mini \\
      --repeats 10 --inner 5 --warmup 3 --out $OUT/step_time_gpu.md  # GPU
  python benchmarks/step_time.py --render benchmarks/results/step_time.json
      # re-render the Markdown from saved results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # pylint: disable=g-import-not-at-top,wrong-import-position

import foam_jax  # pylint: disable=g-import-not-at-top,wrong-import-position

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@dataclasses.dataclass(frozen=True)
class Shape:
  """A LLaMA-like parameter pytree: sizes of its axes.

  Attributes:
    hidden: model width ``D``.
    intermediate: MLP width ``F``.
    layers: number of transformer blocks.
    vocab: vocabulary size ``V`` (embedding ``(V, D)``, head ``(D, V)``).
  """

  hidden: int
  intermediate: int
  layers: int
  vocab: int

  def num_params(self) -> int:
    d, f = self.hidden, self.intermediate
    per_layer = 4 * d * d + 3 * d * f + 2 * d
    return self.layers * per_layer + 2 * self.vocab * d + d


# Sizes in LLaMA proportions (F ~ 2.7 D), matrices dominating like in a real
# LLaMA; "60m" is the paper's LLaMA-60M (vocab 32000, half its weights are
# the embedding and head, which FOAM leaves to Adam).
SHAPES = {
    "1m": Shape(hidden=128, intermediate=344, layers=4, vocab=1024),
    "10m": Shape(hidden=384, intermediate=1024, layers=5, vocab=2048),
    "50m": Shape(hidden=768, intermediate=2048, layers=6, vocab=4096),
    "60m": Shape(hidden=512, intermediate=1376, layers=8, vocab=32000),
    "100m": Shape(hidden=1024, intermediate=2736, layers=7, vocab=8192),
    "1b": Shape(hidden=2048, intermediate=5461, layers=24, vocab=32000),
}


def llama_params(shape: Shape, dtype: Any, seed: int = 0) -> dict[str, Any]:
  """Returns a LLaMA-like params dict (Flax ``(in, out)`` kernel layout).

  Args:
    shape: the sizes.
    dtype: dtype of every leaf.
    seed: RNG seed for the (normal, scaled) values.

  Returns:
    ``{"embed": (V, D), "layers_i": {q, k, v, o: (D, D), gate, up: (D, F),
    down: (F, D), attn_norm, mlp_norm: (D,)}, "final_norm": (D,),
    "lm_head": (D, V)}``.

  Examples:
    >>> p = llama_params(SHAPES["1m"], jnp.float32)
    >>> p["layers_0"]["down"].shape, p["lm_head"].shape
    ((344, 128), (128, 1024))
  """
  d, f, v = shape.hidden, shape.intermediate, shape.vocab
  shapes = {"embed": (v, d), "final_norm": (d,), "lm_head": (d, v)}
  for i in range(shape.layers):
    shapes[f"layers_{i}"] = {
        "q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d),
        "gate": (d, f), "up": (d, f), "down": (f, d),
        "attn_norm": (d,), "mlp_norm": (d,),
    }
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda s: jnp.asarray(
          (0.02 * rng.standard_normal(s, np.float32)).astype(np.float32),
          dtype),
      shapes, is_leaf=lambda x: isinstance(x, tuple))


def _foam_axis(axis: int, level: int) -> Callable[[Any], Any]:
  """A fold-spec callable: the default policy with the fold axis moved."""

  def specs(params):
    return jax.tree.map(
        lambda s: None if s is None else foam_jax.FoldSpec(axis=axis, level=s.level),
        foam_jax.default_fold_specs(params, level),
        is_leaf=lambda x: x is None or isinstance(x, foam_jax.FoldSpec),
    )

  return specs


def optimizers(lr: float = 1e-3) -> dict[str, Callable[[], optax.GradientTransformation]]:
  """The optimizers compared, each with its library defaults, by name."""
  out = {
      "adamw": lambda: optax.adamw(lr),
      "adafactor": lambda: optax.adafactor(lr),
      "lion": lambda: optax.lion(lr),
      "muon": lambda: optax.contrib.muon(lr),
  }
  if hasattr(optax.contrib, "galore"):
    out["galore"] = lambda: optax.contrib.galore(lr)
  for level in (1, 2, 3, 4):
    out[f"foam-l{level}"] = lambda level=level: foam_jax.foam(lr, weight_decay=0.0, fold_level=level)
  for level in (1, 2, 3, 4):
    out[f"foam-l{level}-ax-1"] = lambda level=level: foam_jax.foam(
        lr, weight_decay=0.0, fold_level=level, fold_spec=_foam_axis(-1, level))
  out["foam-mini"] = lambda: foam_jax.foam_mini(lr, weight_decay=0.0)
  return out


# The full run's sizes: float32 from 1M to 100M params, bfloat16 10M and 50M.
FULL_SIZES = "1m/float32,10m,50m,100m/float32"
# Compute-bound baselines, timed only on small sizes (--slow-max-params).
SLOW_OPTIMIZERS = ("muon", "galore")

# Enough to exercise every code path in seconds (CI).
QUICK_OPTIMIZERS = ("adamw", "lion", "foam-l2", "foam-l2-ax-1", "foam-mini")


def make_step(tx: optax.GradientTransformation) -> Callable[..., Any]:
  """The jitted optimizer step, params and state donated."""

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


def _copy(tree):
  return jax.tree.map(lambda x: x + jnp.ones((), x.dtype), tree)


COPY = jax.jit(_copy, donate_argnums=0)


def compiled_memory(compiled) -> dict[str, int]:
  """Compiled memory of an executable: argument, output, alias, temp bytes."""
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  return {
      "argument_bytes": int(stats.argument_size_in_bytes),
      "output_bytes": int(stats.output_size_in_bytes),
      "alias_bytes": int(stats.alias_size_in_bytes),
      "temp_bytes": int(stats.temp_size_in_bytes),
  }


class _Runner:
  """One optimizer's live params/state and its jitted donated step."""

  def __init__(self, name, tx, params, grads):
    self.name = name
    self.params = jax.tree.map(jnp.copy, params)
    self.state = jax.jit(tx.init)(self.params)
    self.grads = grads
    self.step = make_step(tx).lower(self.params, self.state, grads).compile()
    self.memory = compiled_memory(self.step)
    self.state_bytes = foam_jax.tree_bytes(self.state)

  def __call__(self):
    self.params, self.state = self.step(self.params, self.state, self.grads)
    return self.params

  def release(self):
    self.params = self.state = self.grads = None


class _CopyRunner:
  """The bandwidth floor: a jitted, donated ``x + 1`` over the params."""

  name = "copy"

  def __init__(self, params):
    self.params = jax.tree.map(jnp.copy, params)
    self.copy = COPY.lower(self.params).compile()
    self.memory = compiled_memory(self.copy)
    self.state_bytes = 0

  def __call__(self):
    self.params = self.copy(self.params)
    return self.params

  def release(self):
    self.params = None


def time_interleaved(runners, *, warmup: int, repeats: int, inner: int):
  """Median seconds per call of each runner, interleaved across repeats.

  Each repeat times ``inner`` back-to-back calls of every runner, in an
  order rotated from repeat to repeat.

  Returns:
    ``{name: [seconds per call, one per repeat]}``.
  """
  for r in runners:
    for _ in range(warmup):
      common.block(r())
  times = {r.name: [] for r in runners}
  for rep in range(repeats):
    shift = rep % len(runners)
    for r in runners[shift:] + runners[:shift]:
      common.block(r.params)
      start = time.perf_counter()
      for _ in range(inner):
        out = r()
      common.block(out)
      times[r.name].append((time.perf_counter() - start) / inner)
  return times


def bench_size(size: str, dtype_name: str, names: list[str], *, warmup: int,
               repeats: int, inner: int, lr: float = 1e-3) -> dict[str, Any]:
  """Times every optimizer in ``names`` on one size and dtype, side by side."""
  shape = SHAPES[size]
  dtype = jnp.dtype(dtype_name)
  params = llama_params(shape, dtype, seed=0)
  grads = llama_params(shape, dtype, seed=1)
  param_bytes = foam_jax.tree_bytes(params)
  opts = optimizers(lr)
  runners = [_CopyRunner(params)]
  for name in names:
    runners.append(_Runner(name, opts[name](), params, grads))
  del params
  times = time_interleaved(runners, warmup=warmup, repeats=repeats, inner=inner)
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
      "num_params": shape.num_params(),
      "shape": dataclasses.asdict(shape),
      "param_bytes": param_bytes,
      "copy_ms": 1e3 * med["copy"],
      "copy_gbps": copy_bw / 1e9,
      "rows": rows,
  }


# --------------------------------------------------------------------------
# Whole train step of the LLaMA example.


def _import_example():
  """Imports the LLaMA example's ``train`` module (``examples/llama``)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = os.path.join(root, "examples", "llama")
  if path not in sys.path:
    sys.path.insert(0, path)
  import train as train_lib  # pylint: disable=g-import-not-at-top
  return train_lib


class _TrainRunner:
  """The example's jitted, donated train step on one fixed batch."""

  def __init__(self, name, train_lib, model_cfg, batch, total_steps=1000):
    sharding_lib = train_lib.sharding_lib
    mesh = sharding_lib.make_mesh(sharding_lib.parse_mesh(None, 1))
    tx = train_lib.make_optimizer(name, None, total_steps)
    graphdef, self.params, shardings = train_lib.create_state(model_cfg, tx, mesh)
    batch_sharding = sharding_lib.batch_sharding(mesh)
    self.batch = jax.device_put(batch, batch_sharding)
    step = train_lib.make_train_step(graphdef, shardings, batch_sharding)
    self.step = step.lower(self.params, self.batch).compile()
    self.memory = compiled_memory(self.step)
    self.name = name

  def __call__(self):
    self.params, loss = self.step(self.params, self.batch)
    return loss

  def release(self):
    self.params = self.batch = None


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
  train_lib = _import_example()
  model_cfg = train_lib.configs_lib.get_config(preset)
  seq = seq_len or model_cfg.max_seq_len
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, model_cfg.vocab_size, (batch_size, seq + 1))
  batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
           "targets": jnp.asarray(tokens[:, 1:], jnp.int32)}
  runners = [_TrainRunner(n, train_lib, model_cfg, batch) for n in names]
  times = time_interleaved(runners, warmup=warmup, repeats=repeats, inner=1)
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


# --------------------------------------------------------------------------
# Reporting.


def _mb(n: int | None) -> str:
  return "" if n is None else f"{n / 2**20:.1f}"


def render(results: dict[str, Any]) -> str:
  """Renders the results as a Markdown report."""
  lines = ["# Optimizer step time", ""]
  lines += common.header_lines(results["machine"]) + [""]
  lines += [
      "Optimizer step alone: `tx.update` + `optax.apply_updates`, jitted, "
      "params and state donated, fixed gradients. Every optimizer of one "
      "size and dtype is compiled and warmed up, then all are timed side by "
      "side, interleaved repeat by repeat (rotated order); each cell is the "
      f"median over {results['repeats']} repeats of {results['inner']} "
      "back-to-back steps. Ratio = median / AdamW's median (< 1 is faster); "
      "'paired' is the median of per-repeat ratios. Bytes moved = the "
      "minimum an ideal fused step reads and writes (params read and "
      "written, gradients read, state read and written); 'of copy' = that "
      "rate over a jitted donated `x + 1` on the same params (2 bytes moved "
      "per param byte), the bandwidth floor. Temp = compiled temporary "
      "buffer bytes of the jitted donated step (`memory_analysis()`).",
      "",
      "Optimizers with library defaults: `optax.adamw(1e-3)`, "
      "`optax.adafactor(1e-3)`, `optax.lion(1e-3)`, "
      "`optax.contrib.muon(1e-3)` (Newton-Schulz on every 2-D leaf, Adam on "
      "the rest; compute-bound matmuls), "
      "`optax.contrib.galore(1e-3)` (rank 128; its SVD runs every 200 "
      "steps and is not in the timed steps); Muon and GaLore are timed "
      f"only up to {results.get('slow_max_params', 0) / 1e6:.0f}M params "
      "(seconds per step, and minutes of SVDs at init, on this CPU), "
      "`foam_jax.foam(1e-3, fold_level=l)` (default policy: matrices folded "
      "along axis -2, embed/lm_head/norms Adam), `foam-lN-ax-1` = the same "
      "folded along axis -1, `foam_jax.foam_mini(1e-3)`.",
      "",
  ]
  if results["step"]:
    names = []
    for res in results["step"]:
      names += [r["optimizer"] for r in res["rows"] if r["optimizer"] not in names]
    lines += [
        "## Summary: step time / AdamW's (median; < 1 is faster)",
        "",
        "| size | dtype | " + " | ".join(names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]
    for res in results["step"]:
      ratios = {r["optimizer"]: r["ratio_to_adamw"] for r in res["rows"]}
      cells = [f"{ratios[n]:.2f}" if ratios.get(n) is not None else "-"
               for n in names]
      lines.append(f"| {res['size']} ({res['num_params'] / 1e6:.0f}M) | "
                   f"{res['dtype']} | " + " | ".join(cells) + " |")
    lines.append("")
  for res in results["step"]:
    s = res["shape"]
    lines += [
        f"## {res['size']} ({res['num_params'] / 1e6:.1f}M params), "
        f"{res['dtype']}",
        "",
        f"D={s['hidden']}, F={s['intermediate']}, layers={s['layers']}, "
        f"V={s['vocab']}; params {_mb(res['param_bytes'])} MiB; copy "
        f"{res['copy_ms']:.2f} ms = {res['copy_gbps']:.1f} GB/s.",
        "",
        "| optimizer | median ms | ratio to AdamW | paired | state MiB | "
        "GB/s moved | of copy | temp MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
      ratio = "" if r["ratio_to_adamw"] is None else f"{r['ratio_to_adamw']:.3f}"
      paired = ("" if r["paired_ratio_median"] is None
                else f"{r['paired_ratio_median']:.3f}")
      lines.append(
          f"| {r['optimizer']} | {r['median_ms']:.2f} | {ratio} | {paired} | "
          f"{_mb(r['state_bytes'])} | {r['effective_gbps']:.1f} | "
          f"{r['fraction_of_copy_bw']:.2f} | {_mb(r.get('temp_bytes'))} |")
    lines.append("")
  for res in results.get("train", []):
    lines += [
        f"## Whole train step, LLaMA example `{res['preset']}` "
        f"({res['num_params'] / 1e6:.1f}M params)",
        "",
        f"Batch {res['batch_size']} x {res['seq_len']} tokens "
        f"({res['tokens_per_step']} tokens/step); the example's "
        "`make_train_step` (forward, backward, update; jitted, state "
        "donated) with its `make_optimizer(name)` defaults (paper schedule, "
        "betas 0.9/0.95; FOAM alpha 0.25), on one device, one fixed batch; "
        "medians over interleaved repeats. Temp = compiled temporary bytes "
        "of the whole step.",
        "",
        "| optimizer | median ms | tokens/s | tokens/s vs AdamW | temp MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
      ratio = "" if r["ratio_to_adamw"] is None else f"{r['ratio_to_adamw']:.3f}"
      lines.append(f"| {r['optimizer']} | {r['median_ms']:.1f} | "
                   f"{r['tokens_per_s']:.0f} | {ratio} | "
                   f"{_mb(r.get('temp_bytes'))} |")
    lines.append("")
  return "\n".join(lines)


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="tiny sizes and few repeats (seconds; for CI)")
  parser.add_argument("--sizes", default=None,
                      help=f"comma-separated, from {sorted(SHAPES)}; an "
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
                      help="the example's optimizer names (default: adamw, "
                      "foam, foam_mini, adafactor, lion, muon)")
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
  args = parser.parse_args(argv)
  if args.render:
    with open(args.render, encoding="utf-8") as f:
      results = json.load(f)
    out = args.out or os.path.splitext(args.render)[0] + ".md"
    with open(out, "w", encoding="utf-8") as f:
      f.write(render(results))
    print(f"wrote {out}")
    return results

  names = list(QUICK_OPTIMIZERS if args.quick else optimizers())
  if args.optimizers:
    names = args.optimizers.split(",")
    unknown = sorted(set(names) - set(optimizers()))
    if unknown:
      raise ValueError(f"--optimizers: unknown {unknown}; known: {list(optimizers())}")
  if "adamw" not in names:
    names = ["adamw"] + names
  if args.quick:
    sizes = (args.sizes or "1m").split(",")
    repeats, inner = args.repeats or 3, args.inner or 1
    dtypes = args.dtypes.split(",")[:1] if args.dtypes == "float32,bfloat16" else args.dtypes.split(",")
  else:
    sizes = (args.sizes or FULL_SIZES).split(",")
    repeats, inner = args.repeats or 5, args.inner or 2
    dtypes = args.dtypes.split(",")
  configs = []
  for dtype in dtypes:
    for entry in sizes:
      size, _, only = entry.partition("/")
      if size not in SHAPES:
        raise ValueError(f"--sizes: unknown size {size!r}; known: {sorted(SHAPES)}")
      if not only or only == dtype:
        configs.append((size, dtype))

  out = args.out
  if out is None and not args.quick:
    out = os.path.join(RESULTS_DIR, "step_time.md")
  results = {"machine": common.machine_info(), "repeats": repeats,
             "inner": inner, "slow_max_params": args.slow_max_params,
             "step": [], "train": []}
  for size, dtype in configs:
    start = time.perf_counter()
    size_names = [n for n in names if n not in SLOW_OPTIMIZERS
                  or SHAPES[size].num_params() <= args.slow_max_params]
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
