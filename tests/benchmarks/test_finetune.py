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


def test_a_resumed_study_reads_its_base_model_from_the_cache(tmp_path):
  cache = tmp_path / "base.msgpack"
  args = ["--quick", "--out", str(tmp_path), "--base-cache", str(cache)]
  first = finetune.main(args)
  assert cache.exists()
  assert all("commit" in r for r in first["runs"].values())
  path = tmp_path / "runs.json"
  saved = json.loads(path.read_text())
  key = next(k for k, r in saved["runs"].items() if r["phase"] == "finetune")
  del saved["runs"][key]
  path.write_text(json.dumps(saved))
  again = finetune.main(args)  # Reruns the one run from the cached base model.
  assert again["base"] == first["base"]
  assert again["runs"][key]["final_val_loss"] == first["runs"][key]["final_val_loss"]


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
