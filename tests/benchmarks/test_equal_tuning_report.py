"""The equal-tuning report's arithmetic, on a made-up store."""

import numpy as np
import pytest

from benchmarks import equal_tuning_plan as plan_lib
from benchmarks import equal_tuning_report as report

PLAN = {**plan_lib.QUICK_PLAN, "phases": [[1, "tiny", 4, ["adamw", "foam"], 3]],
        "centres": {"adamw": 1e-3, "foam": 1e-2}}


def _run(opt, lr, wd, seed, loss):
  curve = [[100, 0.0, loss + 1.0], [200, 0.0, loss]]
  return {"model": "tiny", "optimizer": opt, "lr": lr, "weight_decay": wd, "seed": seed,
          "steps": 4, "batch": PLAN["batch"], "seq_len": PLAN["seq_len"],
          "final_val_loss": loss, "val_curve": curve, "commit": "abc1234"}


def _store():
  runs = []
  # Seed 0's grid: AdamW best at 1e-3 (k=-12), FOAM at 1e-2 (k=-8); wd 0.1 worse.
  for opt, centre in (("adamw", -12), ("foam", -8)):
    for k in range(centre - 2, centre + 3):
      runs.append(_run(opt, plan_lib.lr_at(k), 0.0, 0, 2.0 + 0.1 * abs(k - centre)))
    for k in (centre - 1, centre, centre + 1):
      runs.append(_run(opt, plan_lib.lr_at(k), 0.1, 0, 2.5))
  for seed, (a, f) in ((1, (2.1, 1.95)), (2, (2.2, 2.15))):  # Seed 0: 2.0 both.
    runs.append(_run("adamw", 1e-3, 0.0, seed, a))
    runs.append(_run("foam", 1e-2, 0.0, seed, f))
  return {"meta": {"plan": PLAN, "jax": "x", "machine": {"cpu": "test"}},
          "runs": {plan_lib.run_key(r): r for r in runs}}


def test_the_chosen_settings_follow_the_plans_rule():
  assert report.chosen_settings(_store()) == {("tiny", 4, "adamw"): (1e-3, 0.0),
                                              ("tiny", 4, "foam"): (1e-2, 0.0)}


def test_paired_difference_matches_a_t_table():
  store = _store()
  a = {s: r["final_val_loss"] for s, r in report.seed_losses(store, "tiny", 4, "foam",
                                                              (1e-2, 0.0)).items()}
  b = {s: r["final_val_loss"] for s, r in report.seed_losses(store, "tiny", 4, "adamw",
                                                              (1e-3, 0.0)).items()}
  mean, low, high, n = report.paired_difference(a, b)
  d = np.array([2.0 - 2.0, 1.95 - 2.1, 2.15 - 2.2])
  half = 4.302652729911275 * d.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 df), from tables.
  assert n == 3 and mean == pytest.approx(d.mean())
  assert (low, high) == pytest.approx((d.mean() - half, d.mean() + half))
  assert report.paired_difference({0: 1.0}, {0: 2.0}) is None


def test_tokens_to_reach_interpolates_and_says_never():
  curve = [[100, 0.0, 3.0], [200, 0.0, 2.0], [300, 0.0, 1.5]]
  assert report.tokens_to_reach(curve, 2.5) == pytest.approx(150.0)
  assert report.tokens_to_reach(curve, 3.5) == 100.0
  assert report.tokens_to_reach(curve, 1.0) is None


def test_sensitivity_is_seed_zeros_loss_around_the_chosen_lr():
  sens = report.sensitivity(_store(), "tiny", 4, "foam", (1e-2, 0.0))
  assert sens == pytest.approx({-2: 0.2, -1: 0.1, 1: 0.1, 2: 0.2})


def test_the_report_lists_what_has_not_run():
  store = _store()
  del store["runs"][plan_lib.run_key(_run("foam", 1e-2, 0.0, 2, 0.0))]
  text = report.render(store, with_bytes=False)
  assert "| adamw | 0.001, 0 | 2.100 +- 0.100 (3) | - |" in text
  assert "(2)" in text and "phase 1 `tiny` 4 steps foam" in text
  assert "`abc1234` (" in text


def test_folded_state_is_smaller_at_7b():
  small_a, big_a = report.state_bytes("adamw", PLAN, "tiny")
  small_f, big_f = report.state_bytes("foam", PLAN, "tiny")
  assert big_f < 0.5 * big_a and small_f < small_a
  assert big_a == pytest.approx(8 * 6.74e9, rel=0.01)  # Two float32 moments.
