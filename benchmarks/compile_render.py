"""The compile report's tables, from its JSON alone (``benchmarks.compile_report``)."""

from __future__ import annotations

from typing import Any

from benchmarks import deviceless

HEADLINE_LEAF = "mlp up (4096, 11008)"
# Columns of the headline table: (label, optimizer row, comparator).
HEADLINE = (
    ("`optax.adamw`", "optax.adamw", None),
    ("`foam` (l=2)", "foam", "optax.adamw"),
    ("`foam`, fold axis -1", "foam axis -1", "optax.adamw"),
    ("`foam`, int8 moments", "foam int8", "optax.adamw"),
    ("`optax.lion`", "optax.lion", None),
    ("`foam_lion`", "foam_lion", "optax.lion"),
    ("`optax.contrib.muon`", "optax.contrib.muon", None),
    ("`foam_muon`", "foam_muon", "optax.contrib.muon"),
)


def _index(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
  return {(r["chip"], r["dtype"], r["leaf"], r["optimizer"]): r for r in rows}


def _cell(row: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
  if row is None:
    return ""
  if "error" in row:
    return "fails to compile"
  text = f"{row['bytes_per_weight']:.2f}"
  if base is not None and "error" not in base:
    text += f" ({row['bytes_accessed'] / base['bytes_accessed']:.2f}x)"
  if row["temp_per_weight"] >= 0.005:
    text += f", temp {row['temp_per_weight']:.2f}"
  return text


def headline(rows: list[dict[str, Any]], leaf: str = HEADLINE_LEAF) -> list[str]:
  """Bytes per weight byte (ratio to the comparator) on one leaf, per chip and dtype."""
  idx = _index(rows)
  chips = [c for c in deviceless.CHIPS if any(r["chip"] == c for r in rows)]
  dtypes = sorted({r["dtype"] for r in rows})
  out = ["| compiler, weight dtype | " + " | ".join(c[0] for c in HEADLINE) + " |",
         "|---" * (len(HEADLINE) + 1) + "|"]
  for chip in chips:
    for dtype in dtypes:
      cells = [_cell(idx.get((chip, dtype, leaf, name)),
                     idx.get((chip, dtype, leaf, comp)) if comp else None)
               for _, name, comp in HEADLINE]
      if any(cells):
        out.append(f"| {chip}, {dtype} | " + " | ".join(cells) + " |")
  return out


def per_leaf(rows: list[dict[str, Any]], chip: str, dtype: str) -> list[str]:
  """Every optimizer on every leaf for one chip and dtype."""
  idx = _index(rows)
  leaves = list(dict.fromkeys(r["leaf"] for r in rows if r["chip"] == chip))
  names = list(dict.fromkeys(r["optimizer"] for r in rows if r["chip"] == chip))
  out = ["| optimizer | " + " | ".join(leaves) + " |", "|---" * (len(leaves) + 1) + "|"]
  for name in names:
    cells = []
    for leaf in leaves:
      row = idx.get((chip, dtype, leaf, name))
      base = idx.get((chip, dtype, leaf, "optax.adamw"))
      cell = _cell(row, base)
      if row is not None and "error" not in row:
        cell += f", {row['kernels']} k"
        if row.get("kernel_bytes"):  # The Pallas kernel ran: its share of the bytes.
          cell += f" (Pallas {row['kernel_bytes'] / row['weight_bytes']:.2f})"
      cells.append(cell)
    out.append(f"| {name} | " + " | ".join(cells) + " |")
  return out


def render_updates(data: dict[str, Any]) -> str:
  rows = data["rows"]
  info = data.get("info", {})
  lines = [
      "# One optimizer update, as the H100 and TPU compilers count it",
      "",
      "The step `step(p, s, g) = (optax.apply_updates(p, u), s2)` with "
      "`u, s2 = tx.update(g, s, p)`, jitted with `donate_argnums=(0, 1)`, "
      "compiled without a device (`benchmarks/deviceless.py`) for each chip. "
      "Each cell is the bytes the compiled program's kernels read and write, "
      "divided by the weight's bytes, with the ratio to the comparator "
      "(`optax.adamw`, or Optax's Lion and Muon for the folded ones) on the "
      "same compiler and leaf; `temp` is `memory_analysis()`'s temporaries "
      "over the weight's bytes (left out below 0.005); `k` is the number of "
      "kernels (top-level fusions and custom calls). These are counts from a "
      "compiler, not timings.",
      "",
      "An Adam update reads the gradient, the weight and two moments and writes "
      "three: 7 weight-sizes. FOAM's XLA update at level 2 runs in two kernels: "
      "one reads the gradient (1) and the folded moments (0.5) and writes the new "
      "moments (0.5); the other reads the gradient (1), the weight (1) and the new "
      "moments (0.5) and writes the weight (1): 5.5, the least two kernels can "
      "move. Below it the weight's update and the moments' would have to share "
      "one kernel, and an XLA GPU kernel has one loop shape (the weight's is four "
      "times the moments').",
      "",
      "On TPU, the folded leaves (float moments, fold axis -2 or -1) of `foam` and "
      "`foam_lion` take a Pallas kernel (`foam_jax/_src/tpu_folded.py`, "
      "`tpu_lanes.py` for axis -1, `tpu_adam.py`, `tpu_lion.py`) that reads the "
      "gradient and the folded "
      "moments and writes the moments and the update once each; "
      "`optax.apply_updates` then reads the update and the weight and writes the "
      "weight: 6 weight-sizes at level 2 for Adam's two moments (5.5 for Lion's "
      "one), less where the compiler keeps the update in VMEM. libtpu's cost analysis "
      "counts a kernel as moving nothing, so each cell adds the kernel's operands "
      "and outputs in HBM (its grid copies each block once: "
      "`deviceless.pallas_kernel_bytes`), shown as `Pallas` in the per-leaf tables: "
      "a leaf without it took the XLA update. Arrays the compiler places in VMEM are "
      "counted by the copies that move them, which the compiler counts as a read "
      "and a write.",
      "",
      f"## `{HEADLINE_LEAF}`: bytes per weight byte (ratio)",
      "",
      *headline(rows),
      "",
  ]
  for chip in deviceless.CHIPS:
    for dtype in ("bfloat16", "float32"):
      if not any(r["chip"] == chip and r["dtype"] == dtype for r in rows):
        continue
      lines += [f"## {deviceless.CHIPS[chip]['label']}, {dtype} weights", "",
                *per_leaf(rows, chip, dtype), ""]
  if data.get("omitted"):
    lines += ["## Left out", ""] + [f"- {x}" for x in data["omitted"]] + [""]
  errors = [r for r in rows if "error" in r]
  if errors:
    lines += ["## Compiles that failed", ""]
    lines += [f"- {r['chip']} {r['dtype']} {r['leaf']} {r['optimizer']}: `{r['error']}`"
              for r in errors]
    lines.append("")
  lines += ["## Provenance", ""]
  lines += [f"- {k}: {v}" for k, v in sorted(info.items())]
  commits = sorted({r.get("commit", "not recorded") for r in rows})
  lines.append(f"- commit of the rows: {', '.join(commits)}")
  lines.append("")
  return "\n".join(lines)
