"""The convergence benchmark runs (``--quick``), reproduces its data and reports."""

import json
import math

import numpy as np

from benchmarks import convergence
from benchmarks import convergence_plan


def test_convergence_quick_mode_trains_and_reports(tmp_path):
  data = convergence.main(["--quick", "--out", str(tmp_path), "--note", "A test run."])
  runs = list(data["runs"].values())
  plan = convergence_plan.PLANS["quick"]
  for opt in plan["suites"][0][2]:
    grid = {r["lr"]: r["final_val_loss"] for r in runs
            if r["optimizer"] == opt and r["seed"] == 0 and not r["foam"]}
    # Every optimizer ran the whole base grid ...
    assert set(plan["lrs"]) <= set(grid), (opt, grid)
    # ... and one point past an end exactly when its best was at that end.
    base_best = min(plan["lrs"], key=grid.get)
    at_edge = base_best in (min(plan["lrs"]), max(plan["lrs"]))
    assert len(grid) == len(plan["lrs"]) + (1 if at_edge else 0), (opt, grid)
    # Its extra seeds ran at the best lr of the extended grid.
    best = min(grid, key=grid.get)
    seeds = {r["seed"] for r in runs if r["optimizer"] == opt
             and r["lr"] == best and not r["foam"]}
    assert seeds == set(range(plan["seeds"])), (opt, best, seeds)
  for r in runs:
    # Training beats the uniform byte model (loss ln 256) in a few steps.
    assert r["final_val_loss"] < math.log(256), r
    tokens = [c[0] for c in r["val_curve"]]
    assert tokens == sorted(tokens) and tokens[-1] == r["tokens"]
  report = (tmp_path / "convergence.md").read_text()
  assert "| foam |" in report and "| adamw |" in report and "A test run." in report
  # The report is rendered from the file alone: rendering again gives it back.
  saved = json.loads((tmp_path / "convergence.json").read_text())
  (tmp_path / "again").mkdir()
  convergence.write_report(saved, str(tmp_path / "again"))
  assert (tmp_path / "again" / "convergence.md").read_text() == report


def test_splits_and_windows_are_the_committed_runs():
  """First 90% trains, last 10% validates; the last byte of each is unused."""
  text = convergence.data.load_corpus("shakespeare").encode("utf-8")
  ds = convergence.load_dataset("shakespeare", seq_len=128)
  cut = int(len(text) * 0.9)
  np.testing.assert_array_equal(ds.train, np.frombuffer(text[:cut - 1], np.uint8))
  np.testing.assert_array_equal(ds.val, np.frombuffer(text[cut:-1], np.uint8))
  # Windows of one run follow one generator seeded by the run's seed.
  rng = np.random.default_rng(0)
  starts = np.random.default_rng(0).integers(0, cut - 128 - 1, 8)
  batch = ds.sample_batch(8, rng)
  np.testing.assert_array_equal(batch["inputs"][:, 0], ds.train[starts])
