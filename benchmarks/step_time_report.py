"""The step-time report, rendered from the results file alone."""

from __future__ import annotations

from typing import Any

from benchmarks import common
from benchmarks.grid import canonical_name

__all__ = ["render"]


def _mb(n: int | None) -> str:
  return "" if n is None else f"{n / 2**20:.1f}"


def _canonical(results: dict[str, Any]) -> dict[str, Any]:
  """``results`` with optimizer names as the registry spells them today."""
  for res in results.get("step", []) + results.get("train", []):
    for row in res["rows"]:
      row["optimizer"] = canonical_name(row["optimizer"])
  return results


def render(results: dict[str, Any]) -> str:
  """Renders the results as a Markdown report."""
  results = _canonical(results)
  lines = ["# Optimizer step time", ""]
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
  lines += common.provenance_lines(results["machine"], results.get("notes"))
  return "\n".join(lines)


