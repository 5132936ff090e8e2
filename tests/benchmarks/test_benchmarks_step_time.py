"""The step-time benchmark runs (``--quick``) and reports what it measured."""

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import step_time


def test_sizes_are_the_example_model_with_the_declared_counts():
  cfg = step_time.size_config("1m", "bfloat16")
  params = step_time.random_params(cfg)
  assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params()
  assert params["embed_tokens"]["embedding"].shape == (1024, 128)
  assert params["lm_head"]["kernel"].shape == (128, 1024)
  assert params["layers"][0]["mlp"]["gate_proj"]["kernel"].shape == (128, 344)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def test_axis_minus_one_variant_folds_the_last_axis():
  params = step_time.random_params(step_time.size_config("1m"))
  opt_state = step_time.make_tx("foam_l2_ax1", 128).init(params)
  mu = opt_state[0].mu
  assert mu["layers"][0]["mlp"]["down_proj"]["kernel"].shape == (344, 128 // 4)
  assert mu["embed_tokens"]["embedding"].shape == (1024, 128)  # still Adam


def test_quick_run_writes_a_report_with_ratios_to_adamw(tmp_path):
  out = tmp_path / "step.md"
  results = step_time.main([
      "--quick", "--optimizers", "foam,foam_mini", "--repeats", "2",
      "--warmup", "1", "--out", str(out), "--note", "Ran beside the test suite."])
  (res,) = results["step"]
  rows = {r["optimizer"]: r for r in res["rows"]}
  assert list(rows) == ["adamw", "foam", "foam_mini"]
  for r in rows.values():
    assert r["median_ms"] > 0 and len(r["times_ms"]) == 2
    assert r["ratio_to_adamw"] == pytest.approx(
        r["median_ms"] / rows["adamw"]["median_ms"])
  # Byte accounting: AdamW keeps two param-sized moments, FOAM fewer.
  assert rows["adamw"]["state_bytes"] == 2 * res["param_bytes"] + 4  # + count
  assert rows["foam"]["state_bytes"] < 0.6 * rows["adamw"]["state_bytes"]
  assert rows["foam"]["min_bytes_moved"] == (
      3 * res["param_bytes"] + 2 * rows["foam"]["state_bytes"])
  text = out.read_text()
  assert "| foam |" in text and "Command:" in text and "Machine:" in text
  assert "Ran beside the test suite." in text
  saved = json.loads(out.with_suffix(".json").read_text())
  assert saved["step"][0]["rows"][1]["optimizer"] == "foam"


def test_unknown_names_are_rejected():
  with pytest.raises(ValueError, match="--sizes"):
    step_time.main(["--quick", "--sizes", "3m"])
  with pytest.raises(ValueError, match="--optimizers"):
    step_time.main(["--quick", "--optimizers", "sgd"])
