"""The convergence report: tables and plots rendered from the results file alone."""

from __future__ import annotations

import json
import os
import statistics

import numpy as np

from benchmarks import common
from benchmarks.convergence_plan import base_grid
from benchmarks.convergence_plan import best_lr
from benchmarks.convergence_plan import provenance
from benchmarks.convergence_plan import tuned_grid
from benchmarks.convergence_plan import View

__all__ = ["provenance_section", "summarize", "tokens_to_reach", "write_report"]


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
        lrs = tuned_grid(View(data), base, opt,
                         base_grid(plan, model_name, dataset, opt),
                         plan.get("extend_edges", 0))
        grid = {r["lr"]: r["final_val_loss"] for r in plain
                if r["optimizer"] == opt and r["seed"] == 0 and r["lr"] in lrs}
        lr = best_lr(View(data), base, opt, lrs)
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
  axes[1].set_xlabel("training wall-clock (s; see the report's notes)")
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
  out = [f"`{e['command']}`" + (f" ({e['date']}, {e['cpu']})" if "date" in e else "")
         for e in provenance(meta)]
  return [c for c in dict.fromkeys(out) if "--report-only" not in c]


def _notes(meta) -> list[str]:
  """Notes recorded with the runs of a store (``--note``), oldest first."""
  return list(dict.fromkeys(n for e in provenance(meta) for n in e.get("notes", [])))


def provenance_section(meta) -> list[str]:
  """A store's closing section: machine, notes and every command behind its runs."""
  return common.provenance_lines(
      meta["machine"], _notes(meta),
      ["- Runs produced by (resumed or in parallel; each command with the date and CPU "
       "it started on): " + "; ".join(_commands(meta))])


def _grid_rule(plan) -> str:
  if not isinstance(plan["lrs"], dict):
    return f"Every optimizer gets the same peak-lr grid {plan['lrs']}"
  ref = plan["reference"]
  return ("Every optimizer is re-tuned on its own 3-point peak-lr grid: its "
          f"best lr at {ref['steps']} steps (`{ref['report']}`) and the "
          "half-decade values either side")


def _ranking_lines(suite, reference) -> list[str]:
  """The short horizon's ranking next to this one's, for one suite."""
  short = reference["suites"].get(f"{suite['model']}/{suite['dataset']}")
  done = [r for r in suite["rows"] if r["seeds"]]
  if not short or not done:
    return []
  rank = lambda rows: {o: i + 1 for i, o in enumerate(sorted(rows, key=rows.get))}
  long_means = {r["optimizer"]: r["mean"] for r in done}
  short_means = {o: short[o]["mean"] for o in long_means}
  long_rank, short_rank = rank(long_means), rank(short_means)
  steps = reference["steps"]
  lines = [f"### Ranking: {steps} steps against this horizon", "",
           f"| optimizer | lr at {steps} steps | final val loss at {steps} steps | "
           f"rank | lr here | final val loss here | rank |",
           "|---|---|---|---|---|---|---|"]
  for r in sorted(done, key=lambda r: long_rank[r["optimizer"]]):
    o, s0 = r["optimizer"], short[r["optimizer"]]  # long_plan kept every one.
    lines.append(
        f"| {o} | {s0['lr']:g} | {s0['mean']:.3f} +- {s0['sd']:.3f} | "
        f"{short_rank[o]} | {r['lr']:g} | {r['mean']:.3f} +- {r['sd']:.3f} | "
        f"{long_rank[o]} |")
  held = sorted(short_rank, key=short_rank.get) == sorted(long_rank, key=long_rank.get)
  order = lambda rk: " < ".join(sorted(rk, key=rk.get))
  lines += ["", (f"The {steps}-step ranking holds ({order(long_rank)})." if held else
                 f"The {steps}-step ranking does not hold: {order(short_rank)} "
                 f"at {steps} steps, {order(long_rank)} here."),
            "Ranks are by mean final loss; where two means are closer than "
            "their standard deviations, their order is within seed noise.", ""]
  return lines


def write_report(data, out):
  """Writes ``convergence.md`` (and one PNG per model/dataset) from ``data``.

  Everything comes from ``data``: the plan and machine in ``data["meta"]``,
  the runs in ``data["runs"]``.
  """
  meta = data["meta"]
  plan = meta["plan"]
  lines = ["# Convergence benchmark", ""]
  lines += [
      "Byte-level LLaMA (the example's presets with vocabulary 256, float32, "
      "no remat) trained with next-byte cross-entropy on random windows of "
      "the first 90% of each corpus, validated on fixed windows of the last "
      "10%. " + _grid_rule(plan) + ", extended by the next half-decade value past an end "
      "while its best lr is at that end (at most "
      f"{plan.get('extend_edges', 0)} times; the same rule for all), on the "
      "same schedule (`foam_jax.paper_schedule`: 10% "
      "linear warmup, cosine to 0.1x), its other settings from its docs "
      "(see `SETTINGS` in `benchmarks/convergence.py` over the grid in "
      "`benchmarks/grid.py`; FOAM: the "
      "paper's level 2, alpha 0.25, betas 0.9/0.95); best lr on seed 0's "
      f"final validation loss, then {plan['seeds']} seeds in all at that lr "
      "(seed = init + data order). Wall-clock is training steps only: the "
      "wall-clock column and plots are no speed comparison (load and "
      "processes beside a run vary; see the notes); "
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
    if "reference" in plan:
      lines += [""] + _ranking_lines(suite, plan["reference"])
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
  lines += provenance_section(meta)
  with open(os.path.join(out, "convergence.md"), "w") as f:
    f.write("\n".join(lines).rstrip("\n") + "\n")


