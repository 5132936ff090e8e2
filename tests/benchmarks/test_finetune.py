"""The fine-tuning study's harness, in its quick form (a few steps, one layer)."""

import json

from benchmarks import finetune


def test_quick_study_runs_every_phase_and_mode(tmp_path):
  store = finetune.main(["--quick", "--out", str(tmp_path)])
  runs = list(store["runs"].values())
  assert {(r["phase"], r["mode"]) for r in runs} == {
      ("finetune", "full"), ("finetune", "lora"), ("finetune", "lora_folded"),
      ("pretrain", "full")}
  assert len(runs) == len(finetune.plan(quick=True))
  assert all(r["final_val_loss"] < 6.0 for r in runs)  # Byte-level: ln 256 = 5.55 at start.
  # The default policy keeps LoRA adapters on Adam's moments: FOAM is Adam there.
  lora = {r["optimizer"]: r["final_val_loss"] for r in runs if r["mode"] == "lora"}
  assert abs(lora["foam:step_size"] - lora["adamw"]) < 1e-3
  saved = json.loads((tmp_path / "runs.json").read_text())
  assert saved["runs"].keys() == store["runs"].keys()
  report = (tmp_path / "finetune.md").read_text()
  assert report == finetune.render(saved)
  assert "## finetune, lora_folded" in report and "## pretrain, full" in report
