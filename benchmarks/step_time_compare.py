"""Side-by-side table of step-time runs of two code versions (before / after).

Each input is a ``step_time.py`` results JSON, labelled ``LABEL=PATH``; runs
of the same label are repeats (for instance alternating before / after
rounds on one machine). The table gives, per dtype and layout, each run's
median paired ratio to AdamW (AdamW timed in the same run), and the report
ends with each run's machine, load, commit and command.

Usage::

  python -m benchmarks.step_time_compare before=b1.json after=a1.json \\
      before=b2.json after=a2.json --out benchmarks/results/step_time_plain_core.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.grid import canonical_name

__all__ = ["compare", "main"]


def _ratios(run: dict[str, Any]) -> dict[tuple[str, str, str], float]:
  """``(size, dtype, optimizer) -> paired ratio to AdamW`` of one run."""
  out = {}
  for res in run["step"]:
    for row in res["rows"]:
      if row.get("paired_ratio_median") is not None:
        out[(res["size"], res["dtype"], canonical_name(row["optimizer"]))] = (
            row["paired_ratio_median"])
  return out


def compare(runs: list[tuple[str, dict[str, Any]]], title: str = "") -> str:
  """The Markdown report for ``runs``, a list of ``(label, results)``.

  Examples:
    >>> run = {"step": [{"size": "1m", "dtype": "float32", "rows": [
    ...     {"optimizer": "adamw", "paired_ratio_median": 1.0},
    ...     {"optimizer": "foam", "paired_ratio_median": 0.8}]}],
    ...     "machine": {"date": "d", "cpu": "c", "cores": 2, "load": [0, 0, 0],
    ...                 "commit": "abc", "command": "python x"}}
    >>> print(compare([("before", run), ("after", run)]).splitlines()[4])
    | 1m | float32 | foam | 0.800 | 0.800 | 0.800 | 0.800 |
  """
  labels = list(dict.fromkeys(label for label, _ in runs))
  ratios = [(label, _ratios(run)) for label, run in runs]
  keys = list(dict.fromkeys(k for _, r in ratios for k in r if k[2] != "adamw"))
  heads = [f"{label} {i + 1}" for label in labels
           for i in range(sum(1 for l, _ in runs if l == label))]
  lines = [title or "# Step time, before / after", "",
           "| size | dtype | layout | " + " | ".join(heads) + " | "
           + " | ".join(f"{label} median" for label in labels) + " |",
           "|---" * (3 + len(heads) + len(labels)) + "|"]
  for key in keys:
    cells, medians = [], []
    for label in labels:
      values = [r[key] for l, r in ratios if l == label and key in r]
      cells += [f"{r[key]:.3f}" if key in r else "-" for l, r in ratios if l == label]
      medians.append(f"{statistics.median(values):.3f}" if values else "-")
    lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " | "
                 + " | ".join(medians) + " |")
  lines += ["", "Each cell: the median over the run's repeats of the layout's step time "
            "divided by AdamW's in the same repeat (< 1 is faster).", "",
            "## Runs", "", "| run | date | machine | load (1, 5, 15 min) | commit | command |",
            "|---|---|---|---|---|---|"]
  counters: dict[str, int] = {}
  for label, run in runs:
    counters[label] = counters.get(label, 0) + 1
    m = run["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["load"])
    lines.append(f"| {label} {counters[label]} | {m['date']} | {m['cpu']}, {m['cores']} "
                 f"cores | {load} | {m['commit']} | `{m['command']}` |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("runs", nargs="+", help="LABEL=PATH of a step_time.py JSON")
  parser.add_argument("--title", default="")
  parser.add_argument("--preamble", default="", help="text after the title")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  runs = []
  for entry in args.runs:
    label, _, path = entry.partition("=")
    with open(path, encoding="utf-8") as f:
      runs.append((label, json.load(f)))
  text = compare(runs, args.title)
  if args.preamble:
    head, _, rest = text.partition("\n\n")
    text = f"{head}\n\n{args.preamble}\n\n{rest}"
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(text)
  print(f"wrote {args.out}")
  return text


if __name__ == "__main__":
  main()
