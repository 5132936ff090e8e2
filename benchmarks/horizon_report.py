"""The horizon study's report: tables and plots rendered from its JSON alone."""

from __future__ import annotations

import math
import os
import statistics
from typing import Any

from benchmarks import horizon_plan
from benchmarks import horizon_trend
from benchmarks.convergence_plan import best_lr
from benchmarks.convergence_plan import View
from benchmarks.convergence_report import provenance_section
from benchmarks.convergence_report import tokens_to_reach

__all__ = ["TOLERANCE", "lr_width", "summarize", "write_report"]

# Tuning effort: the learning rates whose loss is within this of the best.
TOLERANCE = 0.05


def lr_width(points: list[tuple[float, float | None]], tolerance: float = TOLERANCE,
             ) -> tuple[float, bool] | None:
  """Width in decades of the lr range within ``tolerance`` of the best loss.

  ``points`` are ``(lr, final loss)`` of one grid (``None``: diverged). The
  range is the contiguous one around the best point whose losses are at
  most ``best + tolerance``; each end is interpolated linearly in
  ``log10(lr)`` between the last point inside and the first outside (a
  diverged point outside puts the end at the last point inside). Returns
  ``(width, cut)``: ``cut`` when a grid edge ends the range (the width is
  then a lower bound); ``None`` if nothing finished.

  Examples:
    >>> lr_width([(1e-3, 3.0), (1e-2, 2.0), (1e-1, 2.1)])
    (0.55, False)
    >>> lr_width([(1e-2, 2.0), (1e-1, 2.02)])  # Both ends are grid edges.
    (1.0, True)
    >>> lr_width([(1e-3, 3.0), (1e-2, 2.0), (1e-1, None)])
    (0.05, False)
  """
  pts = sorted((math.log10(lr), loss) for lr, loss in points)
  finite = [loss for _, loss in pts if loss is not None]
  if not finite:
    return None
  best = min(finite)
  limit = best + tolerance
  i = next(k for k, (_, loss) in enumerate(pts) if loss == best)
  inside = lambda k: pts[k][1] is not None and pts[k][1] <= limit
  ends, cut = [], False
  for step in (-1, 1):
    k = i
    while 0 <= k + step < len(pts) and inside(k + step):
      k += step
    if not 0 <= k + step < len(pts):
      ends.append(pts[k][0])
      cut = True
      continue
    (x_in, y_in), (x_out, y_out) = pts[k], pts[k + step]
    ends.append(x_in if y_out is None else
                x_in + (x_out - x_in) * (limit - y_in) / (y_out - y_in))
  return round(ends[1] - ends[0], 6), cut


def _mean_sd(xs: list[float]) -> tuple[float | None, float | None]:
  xs = [x for x in xs if x is not None]
  if not xs:
    return None, None
  return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _optimizers(plan: dict[str, Any], model: str, steps: int) -> list[str]:
  opts = list(next(o for m, _, o in plan["sizes"] if m == model))
  return opts + [o for m, s, late, _ in plan.get("late", []) if (m, s) == (model, steps)
                 for o in late]


def summarize(data: dict[str, Any]) -> list[dict[str, Any]]:
  """One entry per model size and horizon: each optimizer's grid, best lr and seeds."""
  meta, plan, store = data["meta"], data["meta"]["plan"], View(data)
  dataset = meta["corpus"]["name"]
  out = []
  for model, horizons, _ in plan["sizes"]:
    for steps in horizons:
      base = horizon_plan.base_spec(plan, dataset, model, steps)
      rows = []
      for opt in _optimizers(plan, model, steps):
        lrs = horizon_plan.grid_of(plan, store, dataset, model, steps, opt)
        run = lambda lr, seed, o=opt, b=base: store.get({**b, "optimizer": o, "lr": lr,
                                                         "seed": seed})
        grid = {lr: run(lr, 0)["final_val_loss"] for lr in lrs or [] if run(lr, 0)}
        done = horizon_plan.best_of(plan, store, dataset, model, steps, opt)
        lr = done if done is not None else (best_lr(store, base, opt, lrs) if lrs else None)
        seeds = [r for s in range(plan["seeds"]) if lr is not None
                 for r in [run(lr, s)] if r is not None]
        mean, sd = _mean_sd([r["final_val_loss"] for r in seeds])
        rows.append({"optimizer": opt, "lrs": lrs or [], "grid": grid, "lr": lr,
                     "tuned": done is not None, "seeds": seeds, "mean": mean, "sd": sd,
                     "width": lr_width(list(grid.items())) if done is not None else None})
      adam = next((r for r in rows if r["optimizer"] == "adamw"), None)
      target = adam["mean"] if adam and len(adam["seeds"]) == plan["seeds"] else None
      tokens = steps * plan["batch"] * plan["seq_len"]
      for r in rows:
        reach = ([tokens_to_reach(x["val_curve"], target) for x in r["seeds"]]
                 if target is not None else [])
        r["reach"] = [None if x is None else x / tokens for x in reach]
      out.append({"model": model, "steps": steps, "tokens": tokens, "rows": rows,
                  "target": target})
  return out


def _complete(row: dict[str, Any], plan: dict[str, Any]) -> bool:
  return row["tuned"] and len(row["seeds"]) == plan["seeds"]


def _process_hours(data: dict[str, Any]) -> float:
  return sum(r.get("process_s", 0.0) for r in data["runs"].values()) / 3600


def _plot_horizons(suites, model, opts, plan, path):
  """Loss and tokens-to-AdamW against horizon: finished rows only, one colour per optimizer."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, opt in enumerate(opts):
    style = {"marker": "o", "label": opt, "color": colours[i % len(colours)]}
    pts = [(s["steps"], r) for s in suites if s["model"] == model
           for r in s["rows"] if r["optimizer"] == opt and _complete(r, plan)]
    if pts:
      axes[0].errorbar([p[0] for p in pts], [p[1]["mean"] for p in pts],
                       yerr=[p[1]["sd"] for p in pts], capsize=3, **style)
    reach = [(s, statistics.mean(r["reach"])) for s, r in pts
             if r["reach"] and None not in r["reach"]]
    if reach and opt != "adamw":
      axes[1].plot([p[0] for p in reach], [p[1] for p in reach], **style)
  horizons = sorted({s["steps"] for s in suites if s["model"] == model})
  for ax in axes:
    ax.set_xscale("log")
    ax.set_xticks(horizons, [str(h) for h in horizons])
    ax.minorticks_off()
    ax.set_xlabel("horizon (steps of 8 x 128 bytes)")
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  axes[0].set_ylabel("final validation loss (nats/byte), mean +- sd")
  axes[1].set_ylabel("tokens to AdamW's final loss / horizon")
  axes[1].axhline(1.0, color="gray", ls=":", lw=1)
  fig.suptitle(f"LLaMA {model} (bytes), each optimizer tuned at each horizon")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _plot_lr(suite, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6, 4))
  for r in suite["rows"]:
    pts = sorted((lr, v) for lr, v in r["grid"].items() if v is not None)
    if pts:
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=r["optimizer"])
  ax.set_xscale("log")
  ax.set_xlabel("peak learning rate")
  ax.set_ylabel("final validation loss, seed 0 (nats/byte)")
  ax.set_title(f"{suite['model']}, {suite['steps']} steps")
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _fmt(mean, sd):
  return "" if mean is None else f"{mean:.3f} +- {sd:.3f}"


def _cut_section(suites, plan, cuts) -> list[str]:
  """What did not finish: the cuts (with the reason recorded) and the rest."""
  reasons = {(c["model"], c["steps"]): c["reason"] for c in cuts}
  cut, unfinished = {}, []
  for su in suites:
    missing = [r["optimizer"] for r in su["rows"] if not _complete(r, plan)]
    key = (su["model"], su["steps"])
    if missing and key in reasons:
      cut[key] = missing
    elif missing:
      unfinished += [f"{su['model']} at {su['steps']} steps: {o}" for o in missing]
  lines = ["## Cut or not finished", ""]
  lines += [f"- Cut: {m} at {s} steps ({', '.join(opts)}). {reasons[m, s]}"
            for (m, s), opts in cut.items()]
  lines += [f"- Not finished: {x}" for x in unfinished]
  if not cut and not unfinished:
    lines.append("Nothing: every phase ran.")
  return lines + [""]


def write_report(data: dict[str, Any], out: str) -> None:
  """Writes ``horizon.md`` and its PNG plots into ``out`` from ``data`` alone."""
  meta, plan = data["meta"], data["meta"]["plan"]
  corpus = meta["corpus"]
  suites = summarize(data)
  lines = [
      "# Horizon study: does the lead over tuned AdamW survive longer training?", "",
      "Byte-level LLaMA (the example's presets, vocabulary 256, float32) trained "
      f"on {corpus['name']}: the `.py` sources of CPython {corpus['python']}'s standard "
      f"library ({corpus['files']} files; {corpus['train_bytes']:,} training and "
      f"{corpus['val_bytes']:,} validation bytes, every tenth file validating; "
      f"sha256 `{corpus['sha256'][:16]}...`; `benchmarks/stdlib_corpus.py`). "
      f"A run never sees a training byte twice. Each step is {plan['batch']} x "
      f"{plan['seq_len']} bytes; validation is {plan['val_batches'] * plan['batch']} "
      "fixed windows, evaluated "
      f"{plan['evals']} times per run. Every optimizer is tuned at every horizon: "
      f"on {plan['first_grid']} at the first, then on its best lr at the horizon "
      "before and the half-decade values either side; a grid is extended past an "
      f"edge while its best sits there (at most {plan['extend_edges']} times). "
      f"Then {plan['seeds']} seeds (init and data order) at the best lr. "
      "Settings and schedule as in `benchmarks/convergence.py` (FOAM: the paper's "
      "recipe; every optimizer on 10% warmup and cosine to 0.1x). With two model "
      "sizes, what follows is a trend over horizons at each size, not a trend over "
      "sizes.", ""]
  for m, s, late, centre in plan.get("late", []):
    lines += [f"{', '.join(late)} run on `{m}` at {s} steps only, on the 5 "
              f"half-decade points around {centre}'s best lr there.", ""]
  lines += [f"Process time of the runs so far: {_process_hours(data):.2f} "
            "process-hours: the wall time of each run in its single-threaded "
            "process, compile and validation included, and any time the process "
            "was paused during the run.", ""]
  for model, _, _ in plan["sizes"]:
    size_suites = [s for s in suites if s["model"] == model]
    params = next((x["params"] for s in size_suites for r in s["rows"]
                   for x in r["seeds"]), None)
    if params is None:
      lines += [f"## {model}", "", "Not run yet.", ""]
      continue
    all_opts = list(dict.fromkeys(r["optimizer"] for s in size_suites for r in s["rows"]))
    lines += [f"## {model} ({params / 1e6:.2f}M weights)", "",
              "### Final validation loss against horizon (mean +- sd over seeds; "
              "best lr)", "",
              "| optimizer | " + " | ".join(f"{s['steps']} steps ({s['tokens']:,} tokens)"
                                          for s in size_suites) + " |",
              "|---|" + "---|" * len(size_suites)]
    for opt in all_opts:
      cells = []
      for s in size_suites:
        r = next((r for r in s["rows"] if r["optimizer"] == opt), None)
        if r is None:
          cells.append("-")
        elif _complete(r, plan):
          cells.append(f"{_fmt(r['mean'], r['sd'])} (lr {r['lr']:g})")
        else:
          cells.append("not run" if not r["grid"] else "in progress")
      lines.append(f"| {opt} | " + " | ".join(cells) + " |")
    lines += ["", "### Tokens to reach AdamW's final loss, as a fraction of the horizon",
              "", "Per seed, interpolated between validation points; AdamW's final "
              "loss is its mean over seeds at the same horizon.", "",
              "| optimizer | " + " | ".join(f"{s['steps']} steps" for s in size_suites)
              + " |", "|---|" + "---|" * len(size_suites)]
    for opt in all_opts:
      if opt == "adamw":
        continue
      cells = []
      for s in size_suites:
        r = next((r for r in s["rows"] if r["optimizer"] == opt), None)
        if r is None or not r["reach"] or not _complete(r, plan):
          cells.append("-")
        else:
          cells.append(", ".join("not reached" if x is None else f"{x:.2f}"
                                 for x in r["reach"]))
      lines.append(f"| {opt} | " + " | ".join(cells) + " |")
    png = f"horizon_{model}.png"
    _plot_horizons(size_suites, model, all_opts, plan, os.path.join(out, png))
    lines += ["", f"![loss and tokens against horizon]({png})", "",
              "### Tuning effort", "",
              "Final loss (seed 0) at each learning rate; the width is the range, in "
              "decades of lr, whose loss is within "
              f"{TOLERANCE} nats/byte of that optimizer's best (interpolated "
              "linearly in log10(lr); \"at least\" where a grid edge cuts it).", ""]
    for s in size_suites:
      if not any(r["grid"] for r in s["rows"]):
        continue
      lrs = sorted({lr for r in s["rows"] for lr in r["grid"]})
      lines += [f"#### {s['steps']} steps", "",
                "| optimizer | " + " | ".join(f"{lr:g}" for lr in lrs)
                + " | width (decades) |", "|---|" + "---|" * (len(lrs) + 1)]
      for r in s["rows"]:
        if not r["grid"]:
          continue
        cells = []
        for lr in lrs:
          v = r["grid"].get(lr, "-")
          cell = "diverged" if v is None else v if v == "-" else f"{v:.3f}"
          cells.append(f"**{cell}**" if lr == r["lr"] and r["tuned"] else cell)
        w = r["width"]
        width = ("in progress" if w is None else
                 f"at least {w[0]:.2f}" if w[1] else f"{w[0]:.2f}")
        lines.append(f"| {r['optimizer']} | " + " | ".join(cells) + f" | {width} |")
      png = f"horizon_{model}_{s['steps']}_lr.png"
      _plot_lr(s, os.path.join(out, png))
      lines += ["", f"![final loss against lr, {s['steps']} steps]({png})", ""]
    trend = horizon_trend.trend_paragraph(suites, model, lambda r: _complete(r, plan))
    if trend:
      lines += ["### Trend as measured", "", trend, ""]
  lines += _cut_section(suites, plan, meta.get("cuts", []))
  lines += provenance_section(meta)
  with open(os.path.join(out, "horizon.md"), "w") as f:
    f.write("\n".join(lines).rstrip("\n") + "\n")
