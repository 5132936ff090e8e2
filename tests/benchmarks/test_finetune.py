"""The fine-tuning study's harness, in its quick form (a few steps, one layer)."""

import json

from benchmarks import finetune


def test_quick_study_runs_every_phase_and_mode_and_resumes_from_its_cache(tmp_path):
  cache = tmp_path / "base.msgpack"
  args = ["--quick", "--out", str(tmp_path), "--base-cache", str(cache)]
  store = finetune.main(args)
  runs = list(store["runs"].values())
  assert {(r["phase"], r["mode"]) for r in runs} == {
      ("finetune", "full"), ("finetune", "lora"), ("finetune", "lora_folded"),
      ("pretrain", "full")}
  assert len(runs) == len(finetune.plan(quick=True))
  assert all(r["final_val_loss"] < 6.0 for r in runs)  # Byte-level: ln 256 = 5.55 at start.
  assert all("commit" in r for r in runs)
  # The default policy keeps LoRA adapters on Adam's moments: FOAM is Adam there.
  lora = {r["optimizer"]: r["final_val_loss"] for r in runs if r["mode"] == "lora"}
  assert abs(lora["foam:step_size"] - lora["adamw"]) < 1e-3
  path = tmp_path / "runs.json"
  saved = json.loads(path.read_text())
  assert saved["runs"].keys() == store["runs"].keys()
  report = (tmp_path / "finetune.md").read_text()
  assert report == finetune.render(saved)
  assert "## finetune, lora_folded" in report and "## pretrain, full" in report
  # Resumed without one of its runs: that run again, from the cached base model.
  assert cache.exists()
  key = next(k for k, r in saved["runs"].items() if r["phase"] == "finetune")
  del saved["runs"][key]
  path.write_text(json.dumps(saved))
  again = finetune.main(args)
  assert again["base"] == store["base"]
  assert again["runs"][key]["final_val_loss"] == store["runs"][key]["final_val_loss"]


def test_processes_sharing_out_keep_each_others_runs(tmp_path):
  path = tmp_path / "runs.json"
  path.write_text(json.dumps({"runs": {"theirs": {"seed": 1}}}))
  mine = {"runs": {"mine": {"seed": 0}}, "note": "n"}
  finetune._saved(str(path), mine, "new", {"seed": 0})
  saved = json.loads(path.read_text())
  assert set(saved["runs"]) == {"theirs", "mine", "new"}
  assert saved["note"] == "n"


def test_seeds_selects_the_runs(tmp_path):
  store = finetune.main(["--quick", "--out", str(tmp_path), "--seeds", "1"])
  assert store["runs"] == {}  # The quick plan has seed 0 only.
