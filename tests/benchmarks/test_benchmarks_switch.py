"""The switch benchmark runs (``--quick``) and renders its report from its JSON."""

import json
import os

from benchmarks import switch


def test_switch_quick_mode_trains_the_four_runs_and_reports(tmp_path):
  results = switch.main(["--quick", "--steps", "4", "--eval-every", "2",
                         "--out", str(tmp_path), "--note", "A test run."])
  curves = results["curves"]
  assert set(curves) == set(switch.RUNS) and results["switch_step"] == 2
  for name in switch.RUNS:
    assert [s for s, _ in curves[name]] == [0, 2, 4], name
  # The switched runs share AdamW's curve up to the switch, then leave it.
  for name in ("converted", "zeroed"):
    assert curves[name][:2] == curves["adamw"][:2]
    assert curves[name][2] != curves["adamw"][2]
  assert curves["converted"][2] != curves["zeroed"][2]
  report = (tmp_path / "switch.md").read_text()
  assert "| AdamW, then FOAM (moments converted) |" in report and "A test run." in report
  assert os.path.getsize(tmp_path / "switch.png") > 1000
  # Rendered from the file alone: rendering again gives the same report.
  saved = json.loads((tmp_path / "switch.json").read_text())
  (tmp_path / "again").mkdir()
  assert switch.render(saved, str(tmp_path / "again")) == report
