"""The memory benchmark runs (``--quick``) and says true things.

The full run produces ``benchmarks/results/memory.*``; these tests keep the
script from rotting and check its accounting against hand-derived sizes.
"""

import json

import pytest

from benchmarks import memory
from benchmarks import memory_report


def _by_opt(rows, config, dtype):
  return {r["optimizer"]: r for r in rows
          if r["config"] == config and r["dtype"] == dtype}


@pytest.fixture(scope="module")
def analytic_7b():
  return _by_opt(
      memory.analytic(["7b"], ("bfloat16",),
                      ("adamw", "lion", "muon", "foam", "foam_mini")),
      "7b", "bfloat16")


def test_analytic_state_matches_hand_count_for_7b(analytic_7b):
  """State bytes from eval_shape equal a count from the config's shapes."""
  got = analytic_7b
  d, f, v, n = 4096, 11008, 32000, 32
  matrices = n * (4 * d * d + 3 * d * f)   # attention + MLP kernels
  other = 2 * v * d + (2 * n + 1) * d      # embed, lm_head, norms
  assert got["adamw"]["params"] == matrices + other
  two = 2  # bytes per bf16 element
  # Adam: m and v for every weight (plus an int32 step count).
  assert got["adamw"]["state_bytes"] == 2 * two * (matrices + other) + 4
  # Lion: one momentum (plus a step count).
  assert got["lion"]["state_bytes"] == two * (matrices + other) + 4
  # FOAM l=2: every matrix's fold axis (the input axis, a multiple of 4
  # here) shrinks 4x; embeddings, head and norms keep Adam's.
  assert got["foam"]["state_bytes"] == 2 * two * (matrices // 4 + other) + 4
  # FOAM-Mini: one value per output feature of each matrix.
  per_layer_out = 4 * d + 2 * f + d
  assert got["foam_mini"]["state_bytes"] == (
      2 * two * (n * per_layer_out + other) + 4)


def test_paper_memory_figure_is_reproduced_for_7b(analytic_7b):
  """LLaMA-7B bf16 weights + states match the paper's bars (+-0.1 GB)."""
  got = analytic_7b
  for opt in ("adamw", "muon", "foam", "foam_mini"):
    paper = memory_report.PAPER_FIGURE["7b"][opt]
    assert abs(got[opt]["total_bytes"] / 1e9 - paper) < 0.1, opt


def test_int8_foam_state_is_at_most_055_of_bf16_foam_for_7b():
  """Codes + float32 block scales + count, against bf16 moments."""
  got = _by_opt(memory.analytic(["7b"], ("bfloat16",), memory.INT8_OPTIMIZERS),
                "7b", "bfloat16")
  assert got["foam_int8"]["state_bytes"] <= 0.55 * got["foam"]["state_bytes"]
  assert got["foam_mini_int8"]["state_bytes"] <= 0.55 * got["foam_mini"]["state_bytes"]
  assert got["foam_mini_int8"]["state_bytes"] < got["foam_int8"]["state_bytes"]


def test_memory_quick_mode_writes_a_consistent_report(tmp_path):
  results = memory.main(["--quick", "--out", str(tmp_path), "--note", "A test run."])
  report = (tmp_path / "memory.md").read_text()
  assert "A test run." in report
  assert "## 2. Compiled peak" in report and "## 3. Largest" in report
  assert "## int8 moments" in report and "Saving kept" in report
  kept = results["int8_compiled"][-1]
  assert kept["foam_int8"]["state"] < kept["foam"]["state"]
  assert kept["retention"] == (
      (kept["foam"]["peak"] - kept["foam_int8"]["peak"])
      / (kept["foam"]["state"] - kept["foam_int8"]["state"]))
  assert json.loads((tmp_path / "memory.json").read_text())["quick"]
  comp = {r["optimizer"]: r for r in results["compiled"]}
  # The donated step holds at least the weights and the state.
  for r in comp.values():
    assert r["peak"] >= r["weights"] + r["state"]
  # FOAM's smaller state shows up in the compiled peak.
  assert comp["foam"]["peak"] < comp["adamw"]["peak"]
  checked = [row for row in results["fits"] if "verified" in row]
  assert checked, "the largest-fit search verified none of its answers"
  for row in checked:
    assert row["verified"], row
