"""Memory benchmark: weights + optimizer state, analytic and compiled.

Three measurements, none of which allocates a model:

1. *Analytic*: bytes of the weights and of ``tx.init(params)`` for the
   paper's LLaMA configs (20M ... 7B, vocabulary 32000) in bf16 and fp32, from
   ``jax.eval_shape``, for AdamW, Adafactor, Lion, Muon, GaLore, FOAM at levels
   1-4, FOAM-Mini, folded Muon and Lion (levels 2, 4); plus the paper's memory
   figure (weights + states, bf16) and FOAM / FOAM-Mini with int8 moments.
2. *Compiled peak*: ``jax.jit(step, donate_argnums=(0, 1)).lower(...)
   .compile().memory_analysis()`` of a full train step (forward, backward,
   update) of the LLaMA example's ``tiny``, ``20m`` and ``60m`` configs, and the
   fraction of the analytic state saving that shows up in that peak; and
   the share of int8 FOAM's saving (vs bf16 FOAM) kept by a bf16 step's peak.
3. *Largest model in a budget*: at each width of the paper's family, the
   deepest LLaMA whose compiled train step fits 16 GiB / 80 GiB with AdamW
   vs FOAM (bf16 and int8 moments) and FOAM-Mini int8 at the same batch.

The models are ``examples.llama``'s (``nnx.eval_shape``), the optimizers its
registry, the step its train step; the report is ``memory_report``. Run
``python -m benchmarks.memory`` (full, writes ``benchmarks/results/
memory.md`` and ``memory.json``) or ``--quick`` (seconds, for CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import foam_jax
from benchmarks import common
from benchmarks import grid
from benchmarks.memory_report import GIB
from benchmarks.memory_report import headline_fits
from benchmarks.memory_report import PAPER_FIGURE
from benchmarks.memory_report import paper_parameter_fit
from benchmarks.memory_report import plot_paper_figure
from benchmarks.memory_report import render
from examples.llama import configs
from examples.llama import model
from examples.llama import optimizers
from examples.llama import sharding
from examples.llama import state
from examples.llama import steps

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

OPTIMIZERS = ("adamw", "adafactor", "lion", "muon", "galore", "foam_l1",
              "foam", "foam_l3", "foam_l4", "foam_mini", "foam_muon",
              "foam_muon_l4", "foam_lion", "foam_lion_l4")
# The int8 section: the bf16 baselines and the int8 variants.
INT8_OPTIMIZERS = ("adamw", "foam", "foam_mini", "foam_int8", "foam_mini_int8")


def llama_config(name: str, **overrides) -> configs.LlamaConfig:
  """The example's preset ``name`` with ``LlamaConfig`` fields replaced."""
  return configs.get_config(name, **overrides)


def abstract_params(config: configs.LlamaConfig, dtype: Any = "float32") -> dict[str, Any]:
  """The weights of ``config``'s LLaMA in ``dtype``, as ``ShapeDtypeStruct``s."""
  config = dataclasses.replace(config, param_dtype=jnp.dtype(dtype).name)
  return nnx.to_pure_dict(model.abstract_params(config))


def make_optimizer(name: str, hidden: int) -> optax.GradientTransformation:
  """Grid optimizer ``name`` at a constant lr (state shapes are what count).

  Muon and GaLore act on the same matrices FOAM folds (embeddings and the
  head get Adam), as in the papers' memory figures. GaLore's rank is
  ``hidden / 4`` (the GaLore paper's 128 at 60M, 512 at 1B, 1024 at 7B).
  Names are the benchmark grid's (``benchmarks.grid``).
  """
  return grid.make_optimizer(name, 1e-3, hidden_size=hidden)


# --------------------------------------------------------------------------
# 1. Analytic weights + state.
# --------------------------------------------------------------------------


def analytic(names, dtypes=("bfloat16", "float32"), optimizers=OPTIMIZERS):
  """Weights and state bytes per config, dtype and optimizer (eval_shape)."""
  rows = []
  for name in names:
    config = llama_config(name)
    for dtype in dtypes:
      params = abstract_params(config, dtype)
      weights = common.tree_bytes(params)
      adam_state = None
      for opt in optimizers:
        try:
          state_bytes = foam_jax.state_bytes(make_optimizer(opt, config.hidden_size), params)
        except Exception as e:  # pylint: disable=broad-except
          rows.append({"config": name, "dtype": dtype, "optimizer": opt,
                       "error": f"{type(e).__name__}: {e}"[:200]})
          continue
        if opt == "adamw":
          adam_state = state_bytes
        rows.append({
            "config": name, "dtype": dtype, "optimizer": opt,
            "params": common.tree_size(params), "weights_bytes": weights,
            "state_bytes": state_bytes, "total_bytes": weights + state_bytes,
            "state_saved_vs_adamw": (None if adam_state is None
                                     else 1.0 - state_bytes / adam_state),
        })
  return rows


# --------------------------------------------------------------------------
# 2. Compiled peak of a jitted, donated train step.
# --------------------------------------------------------------------------


def with_layers(name: str, depth: int, **overrides) -> configs.LlamaConfig:
  """Config ``name`` (with ``overrides``) at ``depth`` layers."""
  return llama_config(name, **{**overrides, "num_layers": depth})


def compiled_memory(config: configs.LlamaConfig, optimizer: str, *, batch: int,
                    seq_len: int, dtype: Any) -> dict[str, int]:
  """Compiled memory of the example's donated train step on abstract inputs.

  Returns:
    ``argument``, ``output``, ``alias``, ``temp`` bytes from XLA's
    ``memory_analysis()`` and ``peak = argument + output - alias + temp``
    (what the device must hold while the step runs), plus ``state``
    (the optimizer's), ``weights`` and ``params``.
  """
  config = dataclasses.replace(config, param_dtype=jnp.dtype(dtype).name)
  tx = make_optimizer(optimizer, config.hidden_size)
  graphdef, st = state.abstract_state(config, tx)
  tokens = {k: jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
            for k in ("inputs", "targets")}
  stats = steps.make_train_step(graphdef).lower(st, tokens).compile().memory_analysis()
  pure = nnx.to_pure_dict(st)
  out = {
      "argument": int(stats.argument_size_in_bytes),
      "output": int(stats.output_size_in_bytes),
      "alias": int(stats.alias_size_in_bytes),
      "temp": int(stats.temp_size_in_bytes),
      "state": common.tree_bytes(pure[1]["opt_state"]),
      "weights": common.tree_bytes(pure[0]),
      "params": common.tree_size(pure[0]),
  }
  out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return out


def compiled_peaks(names, optimizers, *, batch, seq_len, dtype, overrides=None,
                   log=print):
  """:func:`compiled_memory` per config and optimizer, with saving fractions.

  ``peak_saving_fraction`` = (AdamW peak - peak) / (AdamW state - state): the
  share of the analytic state saving that the compiled step keeps.
  """
  rows = []
  for name in names:
    config = llama_config(name, **(overrides or {}))
    adam = None
    for opt in optimizers:
      t0 = time.perf_counter()
      try:
        mem = compiled_memory(config, opt, batch=batch, seq_len=seq_len,
                              dtype=dtype)
      except Exception as e:  # pylint: disable=broad-except
        rows.append({"config": name, "optimizer": opt,
                     "error": f"{type(e).__name__}: {e}"[:300]})
        log(f"  {name} {opt}: {rows[-1]['error']}")
        continue
      if opt == "adamw":
        adam = mem
      row = {"config": name, "optimizer": opt, "dtype": dtype,
             "batch": batch, "seq_len": seq_len, **mem,
             "compile_s": time.perf_counter() - t0}
      if adam is not None and opt != "adamw" and adam["state"] > mem["state"]:
        row["peak_saving_fraction"] = (
            (adam["peak"] - mem["peak"]) / (adam["state"] - mem["state"]))
      rows.append(row)
      log(f"  {name} {opt}: peak {mem['peak'] / 2**20:.1f} MiB "
          f"(state {mem['state'] / 2**20:.1f} MiB) "
          f"[{row['compile_s']:.1f}s]")
  return rows


def int8_retention(name: str, *, batch: int, seq_len: int, overrides=None,
                   depths=None, log=print) -> dict[str, Any]:
  """Share of FOAM's int8 state saving (vs bf16 FOAM) kept by the compiled peak.

  Compiles the example's donated bf16 train step with ``foam`` (bf16
  moments) and ``foam_int8`` and returns both and
  ``(peak_bf16 - peak_int8) / (state_bf16 - state_int8)``. With ``depths``
  (two layer counts, e.g. ``(1, 2)``), the model is compiled at those depths
  and, peaks and states being affine in depth, the share is also given per
  layer, for the rest (embeddings, head) and at the preset's depth.
  """
  config = llama_config(name, **(overrides or {}))

  def measure(cfg):
    mems = {}
    for opt in ("foam", "foam_int8"):
      t0 = time.perf_counter()
      mems[opt] = compiled_memory(cfg, opt, batch=batch, seq_len=seq_len,
                                  dtype="bfloat16")
      log(f"  {name} x {cfg.num_layers} {opt} bf16: peak "
          f"{mems[opt]['peak'] / 2**20:.1f} MiB (state "
          f"{mems[opt]['state'] / 2**20:.1f} MiB) [{time.perf_counter() - t0:.1f}s]")
    return mems

  def share(bf16, int8):
    return (bf16["peak"] - int8["peak"]) / (bf16["state"] - int8["state"])

  row = {"config": name, "batch": batch, "seq_len": seq_len, "dtype": "bfloat16"}
  if not depths:
    mems = measure(config)
    return {**row, **mems, "retention": share(mems["foam"], mems["foam_int8"])}
  (d1, d2), layers = depths, config.num_layers
  at = {d: measure(dataclasses.replace(config, num_layers=d)) for d in (d1, d2)}

  def affine(opt, key):
    slope = (at[d2][opt][key] - at[d1][opt][key]) / (d2 - d1)
    return {"per_layer": slope, "base": at[d1][opt][key] - d1 * slope,
            "preset": at[d1][opt][key] + (layers - d1) * slope}

  fit = {opt: {key: affine(opt, key) for key in ("peak", "state")}
         for opt in ("foam", "foam_int8")}
  return {**row, "depths": [d1, d2], "preset_layers": layers,
          "measured": {str(d): at[d] for d in (d1, d2)},
          "retention_measured": {str(d): share(at[d]["foam"], at[d]["foam_int8"])
                                 for d in (d1, d2)},
          "retention": {part: share(*({k: fit[opt][k][part] for k in ("peak", "state")}
                                      for opt in ("foam", "foam_int8")))
                        for part in ("per_layer", "base", "preset")}}


# --------------------------------------------------------------------------
# 3. The largest LLaMA whose train step fits a memory budget.
# --------------------------------------------------------------------------


def largest_fitting(widths, budgets_gib, optimizers, *, batch, seq_len, dtype,
                    verify=True, overrides=None, log=print):
  """Deepest model per width (and overall largest) that fits each budget.

  The compiled peak is affine in the depth (every layer adds the same
  weights, state, gradients and activations), so it is measured at 1 and 2
  layers, the maximal depth is solved for, and (``verify``) the answer is
  checked by compiling at that depth and one layer more.
  """
  rows = []
  overrides = overrides or {}
  for name in widths:
    for opt in optimizers:
      m1 = compiled_memory(with_layers(name, 1, **overrides), opt, batch=batch,
                           seq_len=seq_len, dtype=dtype)
      m2 = compiled_memory(with_layers(name, 2, **overrides), opt, batch=batch,
                           seq_len=seq_len, dtype=dtype)
      slope, base = m2["peak"] - m1["peak"], 2 * m1["peak"] - m2["peak"]
      pslope, pbase = m2["params"] - m1["params"], 2 * m1["params"] - m2["params"]
      for budget in budgets_gib:
        depth = max(0, math.floor((budget * GIB - base) / slope))
        row = {"width_of": name, "optimizer": opt, "budget_gib": budget,
               "dtype": dtype, "batch": batch, "seq_len": seq_len,
               "peak_per_layer": slope, "peak_base": base,
               "max_layers": depth, "params": pbase + pslope * depth,
               "preset_layers": _preset_layers(name),
               "overrides": overrides}
        rows.append(row)
        log(f"  width {name} {opt} {budget} GiB: {depth} layers, "
            f"{row['params'] / 1e9:.2f}B params"
            )
  if verify:
    for row in headline_fits(rows):
      verify_fit(row, log=log)
  return rows


def verify_fit(row, log=print):
  """Compiles ``row``'s model at its depth and one layer deeper (in place)."""
  kw = dict(batch=row["batch"], seq_len=row["seq_len"], dtype=row["dtype"])
  depth, budget = row["max_layers"], row["budget_gib"] * GIB
  ov = row.get("overrides", {})
  at = compiled_memory(with_layers(row["width_of"], depth, **ov),
                       row["optimizer"], **kw)["peak"]
  above = compiled_memory(with_layers(row["width_of"], depth + 1, **ov),
                          row["optimizer"], **kw)["peak"]
  row.update(verified_peak=at, verified_peak_plus_one=above,
             verified=bool(at <= budget < above))
  log(f"  verify {row['width_of']} x {depth} {row['optimizer']}: "
      f"{at / GIB:.2f} GiB, +1 layer {above / GIB:.2f} GiB, budget "
      f"{row['budget_gib']} GiB -> {row['verified']}")


def _preset_layers(name: str) -> int:
  return llama_config(name).num_layers


def device_peak(name: str, optimizer: str, *, batch: int, seq_len: int,
                overrides=None) -> dict[str, Any]:
  """Runs two real train steps and reads the device's peak bytes in use.

  Meant for a fresh process per measurement (the peak counter never goes
  down); on backends without ``memory_stats()`` (CPU) the peak is ``None``.
  """
  config = llama_config(name, **(overrides or {}))
  tx = make_optimizer(optimizer, config.hidden_size)
  mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
  graphdef, st, _ = state.create_state(config, tx, mesh)
  step = steps.make_train_step(graphdef)
  tokens = {k: jnp.zeros((batch, seq_len), jnp.int32) for k in ("inputs", "targets")}
  for _ in range(2):
    st, loss = step(st, tokens)
  float(loss)
  stats = jax.devices()[0].memory_stats() or {}
  pure = nnx.to_pure_dict(st)
  return {"config": name, "optimizer": optimizer, "batch": batch,
          "seq_len": seq_len, "device": jax.devices()[0].device_kind,
          "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
          "state": common.tree_bytes(pure[1]["opt_state"]),
          "weights": common.tree_bytes(pure[0])}


def _matrix_params(params) -> int:
  """Parameters in the hidden matrices (the leaves FOAM folds)."""
  return sum(math.prod(x.shape) for x, m in zip(jax.tree.leaves(params),
                                    jax.tree.leaves(optimizers.hidden_matrices(params)))
             if m)


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="tiny sizes only: runs in seconds (CI).")
  parser.add_argument("--out", default=_RESULTS,
                      help="directory for memory.md/.json/.png")
  parser.add_argument("--note", action="append", default=[],
                      help="a sentence the report shows about this run; repeatable")
  parser.add_argument("--batch", type=int, default=None)
  parser.add_argument("--seq-len", type=int, default=None)
  parser.add_argument("--budgets", type=float, nargs="+", default=[16, 80],
                      help="memory budgets in GiB for the largest-model fit")
  parser.add_argument("--no-verify", action="store_true",
                      help="skip compiling the largest fits to check them")
  parser.add_argument("--configs", nargs="+", default=None,
                      help="configs for the compiled peaks (default: tiny "
                      "20m 60m)")
  parser.add_argument("--optimizers", nargs="+", default=None,
                      choices=OPTIMIZERS,
                      help="optimizers for the compiled peaks (default: all)")
  parser.add_argument("--widths", nargs="+", default=None,
                      help="widths (configs) for the fits (default: 1b 3b 7b)")
  parser.add_argument("--device-peak", metavar="CONFIG:OPTIMIZER",
                      help="only run two real steps of CONFIG with OPTIMIZER "
                      "and print the device's peak bytes as JSON")
  parser.add_argument("--skip", nargs="*", default=[],
                      choices=["analytic", "compiled", "int8", "fits"])
  parser.add_argument("--fit-optimizers", nargs="+", default=None,
                      help="optimizers for the fits (default: adamw foam "
                      "foam_int8 foam_mini_int8); memory.json's rows for "
                      "other (optimizer, width, budget) are kept")
  parser.add_argument("--int8-config", default=None,
                      help="config whose compiled bf16 step measures the int8 "
                      "saving kept (default: 60m)")
  parser.add_argument("--int8-depths", type=int, nargs=2, default=None,
                      help="compile --int8-config at these two depths and "
                      "extrapolate to its preset depth (e.g. 1 2 for 7b)")
  args = parser.parse_args(argv)

  if args.quick:
    names, dtypes, opts = ["20m"], ("bfloat16",), OPTIMIZERS
    comp_names, comp_opts = ["tiny"], ("adamw", "foam")
    widths, budgets = ["tiny"], [0.0005]
    int8_config = "tiny"
    batch, seq = args.batch or 2, args.seq_len or 8
    overrides = {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                 "num_heads": 2}
  else:
    names = [n for n in configs.PRESETS if n != "tiny"]
    dtypes, opts = ("bfloat16", "float32"), OPTIMIZERS
    comp_names, comp_opts = ["tiny", "20m", "60m"], OPTIMIZERS
    widths, budgets = ["1b", "3b", "7b"], args.budgets
    int8_config = "60m"
    batch, seq = args.batch or 8, args.seq_len or 256
    overrides = {}
  comp_names = args.configs or comp_names
  comp_opts = tuple(args.optimizers or comp_opts)
  widths = args.widths or widths
  int8_config = args.int8_config or int8_config
  fit_opts = tuple(args.fit_optimizers or (
      ("adamw", "foam_int8") if args.quick
      else ("adamw", "foam", "foam_int8", "foam_mini_int8")))

  if args.device_peak:
    name, opt = args.device_peak.split(":")
    row = device_peak(name, opt, batch=batch, seq_len=seq,
                      overrides=overrides if args.quick else None)
    print(json.dumps(row), flush=True)
    return row
  os.makedirs(args.out, exist_ok=True)
  json_path = os.path.join(args.out, "memory.json")
  results = {}
  if os.path.exists(json_path):  # Sections run separately are merged.
    with open(json_path) as f:
      results = json.load(f)
    if results.get("quick") != args.quick:
      results = {}
  machine = common.machine_info()
  results.update(machine=machine, quick=args.quick)
  results.setdefault("commands", []).append(machine["command"])
  results.setdefault("notes", []).extend(args.note)
  log = lambda s: print(s, flush=True)

  def save():
    with open(json_path, "w") as f:
      json.dump(results, f, indent=1)

  if "analytic" not in args.skip:
    log("analytic ...")
    results["analytic"] = analytic(names, dtypes, opts)
    results["analytic_int8"] = analytic(names, ("bfloat16",), INT8_OPTIMIZERS)
    counts = {}
    for n in PAPER_FIGURE:
      if n in names:
        params = abstract_params(llama_config(n), "bfloat16")
        counts[n] = (common.tree_size(params), _matrix_params(params))
    if counts:
      results["paper"] = {"fit": paper_parameter_fit(), "counts": counts}
      plot_paper_figure(results["analytic"],
                        os.path.join(args.out, "memory_paper_figure.png"))
    save()
  if "compiled" not in args.skip:
    log(f"compiled peaks (batch {batch} x {seq}) ...")
    results["compiled"] = compiled_peaks(comp_names, comp_opts, batch=batch,
                                         seq_len=seq, dtype="float32",
                                         overrides=overrides, log=log)
    save()
  if "int8" not in args.skip:
    log(f"int8 saving kept by the compiled bf16 step ({int8_config}) ...")
    row = int8_retention(int8_config, batch=batch, seq_len=seq,
                         overrides=overrides if args.quick else None,
                         depths=args.int8_depths, log=log)
    old = results.get("int8_compiled") or []
    old = [old] if isinstance(old, dict) else old  # One row, as first written.
    results["int8_compiled"] = [
        r for r in old if (r["config"], r.get("depths")) !=
        (row["config"], row.get("depths"))] + [row]
    save()
  if "fits" not in args.skip:
    log("largest fitting model ...")
    redone = {(o, w, float(b)) for o in fit_opts for w in widths for b in budgets}
    kept = [r for r in results.get("fits") or []
            if (grid.canonical_name(r["optimizer"]), r["width_of"],
                float(r["budget_gib"])) not in redone]
    results["fits"] = kept + largest_fitting(
        widths, budgets, fit_opts, batch=batch, seq_len=seq,
        dtype="bfloat16", verify=not args.no_verify, overrides=overrides,
        log=log)
  save()
  with open(os.path.join(args.out, "memory.md"), "w") as f:
    f.write(render(results))
  log(f"wrote {os.path.join(args.out, 'memory.md')}")
  return results


if __name__ == "__main__":
  main()
