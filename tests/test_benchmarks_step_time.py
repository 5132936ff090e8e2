"""The step-time benchmark runs (``--quick``) and reports what it measured."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import step_time  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_llama_params_match_the_declared_count_and_layout():
  shape = step_time.SHAPES["1m"]
  params = step_time.llama_params(shape, jnp.bfloat16)
  assert sum(x.size for x in jax.tree.leaves(params)) == shape.num_params()
  assert params["embed"].shape == (shape.vocab, shape.hidden)
  assert params["lm_head"].shape == (shape.hidden, shape.vocab)
  assert params["layers_0"]["gate"].shape == (shape.hidden, shape.intermediate)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def test_axis_minus_one_variant_folds_the_last_axis():
  params = step_time.llama_params(step_time.SHAPES["1m"], jnp.float32)
  state = step_time.optimizers()["foam-l2-ax-1"]().init(params)
  mu = state[0].mu
  assert mu["layers_0"]["down"].shape == (344, 128 // 4)
  assert mu["embed"].shape == params["embed"].shape  # still Adam


def test_quick_run_writes_a_report_with_ratios_to_adamw(tmp_path):
  out = tmp_path / "step.md"
  results = step_time.main([
      "--quick", "--optimizers", "foam-l2,foam-mini", "--repeats", "2",
      "--warmup", "1", "--out", str(out)])
  (res,) = results["step"]
  rows = {r["optimizer"]: r for r in res["rows"]}
  assert list(rows) == ["adamw", "foam-l2", "foam-mini"]
  for r in rows.values():
    assert r["median_ms"] > 0 and len(r["times_ms"]) == 2
    assert r["ratio_to_adamw"] == pytest.approx(
        r["median_ms"] / rows["adamw"]["median_ms"])
  # Byte accounting: AdamW keeps two param-sized moments, FOAM fewer.
  assert rows["adamw"]["state_bytes"] == 2 * res["param_bytes"] + 4  # + count
  assert rows["foam-l2"]["state_bytes"] < 0.6 * rows["adamw"]["state_bytes"]
  assert rows["foam-l2"]["min_bytes_moved"] == (
      3 * res["param_bytes"] + 2 * rows["foam-l2"]["state_bytes"])
  text = out.read_text()
  assert "| foam-l2 |" in text and "Command:" in text and "Machine:" in text
  saved = json.loads(out.with_suffix(".json").read_text())
  assert saved["step"][0]["rows"][1]["optimizer"] == "foam-l2"


def test_unknown_names_are_rejected():
  with pytest.raises(ValueError, match="--sizes"):
    step_time.main(["--quick", "--sizes", "3m"])
  with pytest.raises(ValueError, match="--optimizers"):
    step_time.main(["--quick", "--optimizers", "sgd"])

