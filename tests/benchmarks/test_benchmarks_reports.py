"""The committed reports are their JSON rendered: nothing in them is typed in."""

import json
import os

import pytest

from benchmarks import convergence_report
from benchmarks import memory_report
from benchmarks import step_time_report

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "benchmarks", "results")


def _read(name):
  with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
    return f.read()


def test_step_time_report_renders_from_its_json():
  assert step_time_report.render(json.loads(_read("step_time.json"))) == _read("step_time.md")


def test_memory_report_renders_from_its_json():
  assert memory_report.render(json.loads(_read("memory.json"))) == _read("memory.md")


@pytest.mark.parametrize("folder", ["", "long_horizon"])
def test_convergence_report_renders_from_its_json(tmp_path, folder):
  data = json.loads(_read(os.path.join(folder, "convergence.json")))
  convergence_report.write_report(data, str(tmp_path))
  assert (tmp_path / "convergence.md").read_text() == _read(
      os.path.join(folder, "convergence.md"))


def test_horizon_and_layout_reports_render_from_their_json(tmp_path):
  from benchmarks import horizon_report
  from benchmarks import layout_state
  horizon_report.write_report(json.loads(_read("horizon/horizon.json")), str(tmp_path))
  assert (tmp_path / "horizon.md").read_text() == _read("horizon/horizon.md")
  layout_state.write_report(json.loads(_read("layout_state.json")), str(tmp_path))
  assert (tmp_path / "layout_state.md").read_text() == _read("layout_state.md")
