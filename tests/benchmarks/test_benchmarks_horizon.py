"""The horizon study: its corpus, its batches, its plan and its report."""

import json
import math
import os

import numpy as np
import pytest

from benchmarks import horizon
from benchmarks import horizon_plan
from benchmarks import horizon_report
from benchmarks import stdlib_corpus
from benchmarks.convergence_plan import around
from benchmarks.convergence_plan import View


def test_stdlib_files_follow_the_filter():
  files = stdlib_corpus.stdlib_files()
  assert files == sorted(files) and len(files) > 500
  assert all(f.endswith(".py") for f in files)
  for f in files:
    parts = f.split("/")
    assert not {"site-packages", "test", "tests"} & set(parts[:-1]), f
    assert not f.startswith("idlelib/idle_test/"), f
  assert "json/decoder.py" in files and "os.py" in files


def test_corpus_splits_every_tenth_file_and_checks_its_sum(tmp_path):
  corpus = stdlib_corpus.load(any_version=True)
  files = stdlib_corpus.stdlib_files()
  root = os.path.dirname(os.__file__)
  sizes = [os.path.getsize(os.path.join(root, f)) for f in files]
  val = sum(s for i, s in enumerate(sizes) if i % 10 == 9)
  n_val = len(files) // 10
  assert corpus.val.size == val + n_val - 1  # Joined by one newline each.
  assert corpus.train.size == sum(sizes) - val + len(files) - n_val - 1
  # Written to a folder and read back: the same bytes, named as a file corpus.
  stdlib_corpus.main(["--write", str(tmp_path)])
  again = stdlib_corpus.load(str(tmp_path))
  np.testing.assert_array_equal(again.train, corpus.train)
  assert again.info["sha256"] == corpus.info["sha256"]
  assert again.info["name"] == "file:" + corpus.info["name"]
  (tmp_path / "val.bin").write_bytes(b"changed")
  with pytest.raises(ValueError, match="checksum"):
    stdlib_corpus.load(str(tmp_path))


def test_corpus_refuses_another_python(monkeypatch):
  monkeypatch.setattr(stdlib_corpus.platform, "python_version", lambda: "3.12.1")
  with pytest.raises(ValueError, match=r"CPython 3\.11\.7.*3\.12\.1.*--corpus"):
    stdlib_corpus.load()
  assert stdlib_corpus.load(any_version=True).info["name"] == "cpython-3.12.1-stdlib"


def test_disjoint_batches_never_repeat_a_byte_and_depend_on_the_seed_only():
  train = np.arange(10_000)
  batch_at = horizon.disjoint_batches(train, batch=4, seq_len=16, steps=150, seed=3)
  inputs = np.concatenate([batch_at(i)["inputs"].ravel() for i in range(150)])
  assert len(set(inputs.tolist())) == inputs.size == 150 * 4 * 16
  b = batch_at(7)
  np.testing.assert_array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
  again = horizon.disjoint_batches(train, batch=4, seq_len=16, steps=150, seed=3)
  np.testing.assert_array_equal(again(7)["inputs"], b["inputs"])
  other = horizon.disjoint_batches(train, batch=4, seq_len=16, steps=150, seed=4)
  assert not np.array_equal(other(7)["inputs"], b["inputs"])
  with pytest.raises(ValueError, match="windows"):
    horizon.disjoint_batches(train, batch=4, seq_len=16, steps=200, seed=0)


@pytest.mark.parametrize("points, expected", [
    # Best 2.0 at 1e-2; limit 2.05: left end 0.05 of the way to 1e-3,
    # right end half-way to 1e-1.
    ([(1e-3, 3.0), (1e-2, 2.0), (1e-1, 2.1)], (0.55, False)),
    # Every point within: the grid's own span, a lower bound.
    ([(1e-3, 2.04), (1e-2, 2.0), (1e-1, 2.01)], (2.0, True)),
    # A diverged neighbour ends the range at the last point inside; the
    # right end is 0.2 of the way from 1e-1 (2.03) to 1 (2.13).
    ([(1e-3, None), (1e-2, 2.0), (1e-1, 2.03), (1.0, 2.13)], (1.2, False)),
    # Only the contiguous range around the best counts: 1e-2 is within
    # 0.05 but 1e-3 between is not; the left end is the grid edge.
    ([(1e-4, 2.0), (1e-3, 2.5), (1e-2, 2.01)], (0.1, True)),
    ([(1e-3, None)], None),
])
def test_lr_width(points, expected):
  got = horizon_report.lr_width(points)
  if expected is None:
    assert got is None
  else:
    assert got[1] == expected[1] and got[0] == pytest.approx(expected[0], abs=1e-9)


def test_wide_around_is_five_half_decade_points():
  assert horizon_plan.wide_around(3e-3) == [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
  assert horizon_plan.wide_around(3e-1) == [3e-2, 1e-1, 3e-1, 1.0]


def test_phases_run_most_important_first_and_filter_sizes_horizons_and_optimizers():
  plan = horizon_plan.PLAN
  everything = list(horizon_plan.phases(plan))
  assert everything[:4] == [("tiny", 200, o) for o in ("adamw", "foam", "muon", "foam_muon")]
  assert ("tiny", 4000, "foam_int8") in everything
  assert everything.index(("tiny", 4000, "foam")) < everything.index(("tiny", 4000, "foam_int8"))
  picked = list(horizon_plan.phases(plan, only_models=["20m"], skip={"muon"},
                                    only_horizons=[200, 1000]))
  assert picked == [("20m", s, o) for s in (200, 1000) for o in ("adamw", "foam")]


def test_quick_study_retunes_per_horizon_resumes_and_reports(tmp_path):
  out = str(tmp_path)
  data = horizon.main(["--quick", "--out", out, "--note", "A test run."])
  plan = horizon_plan.QUICK_PLAN
  runs = list(data["runs"].values())
  name = data["meta"]["corpus"]["name"]
  store = View(data)
  first, second = plan["sizes"][0][1]
  for opt in plan["sizes"][0][2]:
    best = horizon_plan.best_of(plan, store, name, "tiny", first, opt)
    # The next horizon starts on the three half-decade points around it.
    grid = sorted(r["lr"] for r in runs if r["optimizer"] == opt
                  and r["steps"] == second and r["seed"] == 0)
    assert set(around(best)) <= set(grid), (opt, best, grid)
    for steps in (first, second):
      lr = horizon_plan.best_of(plan, store, name, "tiny", steps, opt)
      seeds = {r["seed"] for r in runs if r["optimizer"] == opt
               and r["steps"] == steps and r["lr"] == lr}
      assert seeds == set(range(plan["seeds"])), (opt, steps, seeds)
  foam_best = horizon_plan.best_of(plan, store, name, "tiny", second, "foam")
  int8 = sorted(r["lr"] for r in runs if r["optimizer"] == "foam_int8" and r["seed"] == 0)
  assert set(horizon_plan.wide_around(foam_best)) <= set(int8)
  for r in runs:
    assert math.isfinite(r["final_val_loss"]) and r["process_s"] > 0
  # At their best lr, a few steps beat the uniform byte model (loss ln 256).
  assert all(r["final_val_loss"] < math.log(256) - 0.3 for r in runs
             if r["steps"] == second and r["lr"] == foam_best)
  report = (tmp_path / "horizon.md").read_text()
  assert "| foam |" in report and "A test run." in report and "width" in report
  assert os.path.exists(tmp_path / f"horizon_tiny_{second}_lr.png")
  # Resuming trains nothing new; the report renders from the file alone.
  again = horizon.main(["--quick", "--out", out])
  assert again["runs"].keys() == data["runs"].keys()
  assert (tmp_path / "horizon.md").read_text().split("## Provenance")[0] == (
      report.split("## Provenance")[0])
  saved = json.loads((tmp_path / "horizon.json").read_text())
  saved["meta"]["corpus"]["sha256"] = "0" * 64
  (tmp_path / "horizon.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match="corpus"):
    horizon.main(["--quick", "--out", out])


def test_gpu_piece_trains_both_at_the_study_lrs_in_its_budget(tmp_path):
  study = horizon.main(["--quick", "--out", str(tmp_path / "study")])
  from benchmarks import horizon_gpu
  steps, lrs = horizon_gpu.study_lrs(study)
  assert steps == horizon_plan.QUICK_PLAN["sizes"][0][1][-1]
  out = horizon_gpu.main(["--quick", "--study", str(tmp_path / "study" / "horizon.json"),
                          "--out", str(tmp_path / "gpu"), "--seconds", "1"])
  assert out["lrs"] == lrs and out["steps"] >= 10
  for opt, run in out["runs"].items():
    assert run["lr"] == lrs[opt] and run["steps"] == out["steps"]
    assert math.isfinite(run["final_val_loss"])
  assert out["corpus"]["name"].startswith("cpython-")
  assert "| foam |" in (tmp_path / "gpu" / "horizon_gpu.md").read_text()


def test_report_merges_the_stores_of_processes_run_side_by_side(tmp_path):
  data = horizon.main(["--quick", "--out", str(tmp_path / "whole")])
  keys = sorted(data["runs"])
  halves = []
  for i, part in enumerate((keys[::2], keys[1::2])):
    half = {"meta": data["meta"], "runs": {k: data["runs"][k] for k in part}}
    halves.append(tmp_path / f"half{i}.json")
    halves[-1].write_text(json.dumps(half))
  merged = horizon.main(["--report-only", "--out", str(tmp_path / "merged"),
                         "--merge", *map(str, halves)])
  assert sorted(merged["runs"]) == keys
  assert (tmp_path / "merged" / "horizon.json").exists()
  assert ((tmp_path / "merged" / "horizon.md").read_text().split("## Provenance")[0]
          == (tmp_path / "whole" / "horizon.md").read_text().split("## Provenance")[0])
  other = json.loads(halves[0].read_text())
  other["meta"]["corpus"]["sha256"] = "1" * 64
  halves[0].write_text(json.dumps(other))
  with pytest.raises(ValueError, match="different corpora"):
    horizon.main(["--report-only", "--out", str(tmp_path / "m2"), "--merge",
                  *map(str, halves)])


def test_report_states_cuts_with_their_reason_and_the_rest_as_not_finished(tmp_path):
  data = horizon.main(["--quick", "--out", str(tmp_path / "whole")])
  first, second = horizon_plan.QUICK_PLAN["sizes"][0][1]
  short = {"meta": data["meta"],
           "runs": {k: r for k, r in data["runs"].items() if r["steps"] == first}}
  (tmp_path / "short.json").write_text(json.dumps(short))
  horizon.main(["--report-only", "--out", str(tmp_path / "cut"), "--merge",
                str(tmp_path / "short.json"), "--cut", "tiny", str(second), "No time."])
  report = (tmp_path / "cut" / "horizon.md").read_text()
  assert f"- Cut: tiny at {second} steps (adamw, foam, foam_int8). No time." in report
  assert "Not finished" not in report
  horizon.main(["--report-only", "--out", str(tmp_path / "open"), "--merge",
                str(tmp_path / "short.json")])
  report = (tmp_path / "open" / "horizon.md").read_text()
  assert f"- Not finished: tiny at {second} steps: foam" in report and "Cut:" not in report


def _row(opt, mean, reach=(0.5, 0.5, 0.5)):
  return {"optimizer": opt, "mean": mean, "reach": list(reach), "done": True}


def test_trend_paragraph_states_each_optimizer_against_adamw_and_the_final_order():
  from benchmarks import horizon_trend
  suites = [
      {"model": "tiny", "steps": 200, "rows": [
          _row("adamw", 2.5), _row("foam", 2.0, (0.4, 0.42, 0.44)), _row("muon", 1.8)]},
      {"model": "tiny", "steps": 1000, "rows": [
          _row("adamw", 1.5), _row("foam", 1.55, (None, 0.99, None)), _row("muon", 1.4),
          {**_row("adafactor", 9.0), "done": False}]},
      {"model": "20m", "steps": 200, "rows": [_row("adamw", 1.0), _row("foam", 0.5)]},
  ]
  text = horizon_trend.trend_paragraph(suites, "tiny", lambda r: r["done"])
  assert ("`foam` minus tuned AdamW is -0.500 and +0.050 nats/byte at 200 and 1000 "
          "steps: its lead reverses: it ends behind AdamW at 1000 steps") in text
  assert "0.40-0.44x at 200 and AdamW's final loss reached by 1 of 3 seeds at 1000" in text
  assert "`muon` minus tuned AdamW is -0.700 and -0.100" in text
  assert "its lead shrinks as training gets longer" in text
  assert "adafactor" not in text and "0.500" not in text.split("`muon`")[1]
  assert text.endswith("the order from lowest loss is `muon`, `adamw`, `foam`.")
  assert horizon_trend.trend_paragraph(suites, "none", lambda r: r["done"]) == ""


@pytest.mark.parametrize("page", ["README.md", "docs/guides/benchmarks.md"])
def test_the_pages_quote_the_committed_horizon_report(page):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, "benchmarks", "results", "horizon", "horizon.md")) as f:
    report = f.read()
  with open(os.path.join(root, page)) as f:
    rows = [line for line in f if line.startswith("|") and "horizon/horizon.md" in line]
  assert len(rows) == 3
  for row in rows:
    foam, adamw = row.split("|")[2:4]
    for cell in foam.split("/") + adamw.split("/"):
      if cell.strip() != "1x":
        assert cell.strip() in report, (page, cell)
