"""The convergence benchmark runs (``--quick``), reproduces its data and reports."""

import json
import math
import os

import numpy as np

from benchmarks import convergence
from benchmarks import convergence_plan
from benchmarks import convergence_report


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


def test_long_plan_centres_each_grid_on_the_short_runs_best_lr():
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "benchmarks", "results", "convergence.json")
  with open(path) as f:
    short = json.load(f)
  plan = convergence.long_plan(short, "results/convergence.md")
  assert plan["shape"]["tiny"]["steps"] == 1000 and plan["reference"]["steps"] == 200
  ladder = convergence_plan.LR_LADDER
  for model, datasets, opts in plan["suites"]:
    for dataset in datasets:
      for opt in opts:
        # The short runs' best lr, recomputed here from seed 0's grid.
        seed0 = {r["lr"]: r["final_val_loss"] for r in short["runs"].values()
                 if (r["model"], r["dataset"], r["optimizer"], r["seed"], r["steps"])
                 == (model, dataset, opt, 0, 200) and not r["foam"]}
        best = min(seed0, key=seed0.get)
        i = min(range(len(ladder)), key=lambda k: abs(math.log(ladder[k] / best)))
        assert plan["lrs"][f"{model}/{dataset}/{opt}"] == list(ladder[i - 1:i + 2])
        kept = plan["reference"]["suites"][f"{model}/{dataset}"][opt]
        finals = [r["final_val_loss"] for r in short["runs"].values()
                  if (r["model"], r["dataset"], r["optimizer"], r["lr"], r["steps"])
                  == (model, dataset, opt, best, 200) and not r["foam"]]
        assert kept["lr"] == best and kept["seeds"] == len(finals) == 3
        assert math.isclose(kept["mean"], float(np.mean(finals)), rel_tol=1e-12)


def test_ranking_says_whether_the_short_ranking_holds():
  from benchmarks import convergence_report
  reference = {"steps": 200, "suites": {"tiny/x": {
      "a": {"lr": 1e-3, "mean": 2.0, "sd": 0.1}, "b": {"lr": 1e-2, "mean": 1.5, "sd": 0.1}}}}
  suite = lambda la, lb: {"model": "tiny", "dataset": "x", "rows": [
      {"optimizer": "a", "seeds": [1], "lr": 1e-3, "mean": la, "sd": 0.0},
      {"optimizer": "b", "seeds": [1], "lr": 3e-3, "mean": lb, "sd": 0.0}]}
  held = "\n".join(convergence_report._ranking_lines(suite(1.2, 1.0), reference))
  assert "ranking holds (b < a)" in held
  flipped = "\n".join(convergence_report._ranking_lines(suite(1.0, 1.2), reference))
  assert "does not hold: b < a at 200 steps, a < b here" in flipped


def _meta(command, notes=(), **nested):
  return {"machine": {"command": command, "date": "d", "cpu": "c"},
          "notes": list(notes), **nested}


def test_resumed_and_merged_stores_keep_a_flat_history(tmp_path):
  """Provenance is one entry per command, however often a store is resumed or
  merged (stores that nested whole metas grew to 38 MB); old nesting is read."""
  path = str(tmp_path / "convergence.json")
  other = {"runs": {"x": 1}, "meta": _meta("b", ["note b"], previous=_meta("a"))}
  for command in ("c", "d", "d"):
    store = convergence_plan.Store(path, _meta(command))
    store.merge(other)
    store.put_all()
  saved = json.loads((tmp_path / "convergence.json").read_text())
  assert "previous" not in saved["meta"] and "merged" not in saved["meta"]
  assert [e["command"] for e in convergence_plan.provenance(saved["meta"])] == [
      "a", "b", "c", "d"]
  assert saved["runs"] == {"x": 1}
  assert convergence_report._notes(saved["meta"]) == ["note b"]
