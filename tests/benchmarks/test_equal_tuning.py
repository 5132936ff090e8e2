"""The equal-tuning study's pieces: Adam-mini, the held-out windows, the plan's rules."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import adam_mini
from benchmarks import equal_tuning_plan
from benchmarks import heldout


def _reference_adam_mini(params, grads_seq, lr, wd, b1, b2, eps, num_heads):
  """Adam-mini from the paper's equations in float64 NumPy, per leaf by hand."""

  def blocks(name, p):
    if name == "embed":
      return None
    if p.ndim == 1:
      return lambda x: np.full_like(x, np.mean(x))
    if name == "q":
      fan_in, fan_out = p.shape
      hd = fan_out // num_heads

      def per_head(x):
        out = np.empty_like(x)
        for h in range(num_heads):
          out[:, h * hd:(h + 1) * hd] = np.mean(x[:, h * hd:(h + 1) * hd])
        return out

      return per_head
    return lambda x: np.broadcast_to(np.mean(x, axis=0, keepdims=True), x.shape).copy()

  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  updates = []
  for t, g in enumerate(grads_seq, start=1):
    out = {}
    for k in p:
      gk = np.asarray(g[k], np.float64)
      mean = blocks(k, p[k])
      m[k] = b1 * m[k] + (1 - b1) * gk
      sq = gk * gk
      v[k] = b2 * v[k] + (1 - b2) * (sq if mean is None else mean(sq))
      out[k] = -lr * ((m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
                      + wd * p[k])
    updates.append(out)
  return updates


def test_adam_mini_matches_a_float64_reference():
  rng = np.random.default_rng(0)
  shapes = {"embed": (6, 4), "q": (4, 8), "down": (8, 4), "norm": (4,)}
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  where = {"embed": ("embed_tokens", "embedding"), "q": ("q_proj", "kernel"),
           "down": ("down_proj", "kernel"), "norm": ("norm", "scale")}
  tree = lambda d: {a: {b: d[k]} for k, (a, b) in where.items()}
  grads = [{k: (rng.normal(size=s) * 10.0 ** rng.uniform(-3, 1, size=s)).astype(np.float32)
            for k, s in shapes.items()} for _ in range(4)]
  tx = adam_mini.adam_mini(1e-2, num_heads=2, weight_decay=0.1)
  state = tx.init(tree(params))
  expected = _reference_adam_mini(params, grads, 1e-2, 0.1, 0.9, 0.95, 1e-8, 2)
  for g, want in zip(grads, expected):
    got, state = tx.update(jax.tree.map(jnp.asarray, tree(g)), state, tree(params))
    for k, (a, b) in where.items():
      np.testing.assert_allclose(np.asarray(got[a][b]), want[k], rtol=2e-5, atol=1e-9,
                                 err_msg=k)


def test_adam_mini_keeps_one_second_moment_per_block():
  params = {"embed_tokens": {"embedding": jnp.zeros((6, 4))},
            "q_proj": {"kernel": jnp.zeros((4, 8))}, "up_proj": {"kernel": jnp.zeros((4, 8))},
            "norm": {"scale": jnp.zeros(4)}}
  nu = adam_mini.adam_mini(1e-3, num_heads=4).init(params)[0].nu
  assert nu["embed_tokens"]["embedding"].shape == (6, 4)   # Adam's
  assert nu["q_proj"]["kernel"].size == 4                  # one per head
  assert nu["up_proj"]["kernel"].size == 8                 # one per output neuron
  assert nu["norm"]["scale"].size == 1


def test_adam_mini_names_a_leaf_it_cannot_partition():
  with pytest.raises(ValueError, match=r"q_proj.*heads"):
    adam_mini.adam_mini(1e-3, num_heads=3).init({"q_proj": {"kernel": jnp.zeros((4, 8))}})


def test_near_copies_finds_an_edited_copy_and_keeps_a_different_file():
  base = bytes(range(256)) * 4
  train = {"a.py": base, "b.py": bytes(reversed(base))}
  val = {"copy.py": base[:-10] + b"0123456789", "other.py": b"completely different" * 20}
  removed = heldout.near_copies(train, val)
  assert [r["file"] for r in removed] == ["copy.py"]
  assert removed[0]["closest"] == "a.py" and removed[0]["jaccard"] > 0.9


def test_windows_are_fixed_disjoint_and_skip_removed_files():
  val = {"keep.py": bytes([1]) * 400, "drop.py": bytes([2]) * 400}
  w1, info = heldout.windows(val, ["drop.py"], seq_len=7, count=20)
  w2, _ = heldout.windows(val, ["drop.py"], seq_len=7, count=20)
  assert w1.shape == (20, 8) and (w1 == w2).all() and not (w1 == 2).any()
  assert info["files_removed"] == 1
  with pytest.raises(ValueError, match="windows"):
    heldout.windows(val, ["drop.py"], seq_len=7, count=60)


def _fake_losses(best_k: dict[float, int], diverge_above: int | None = None):
  """Seed-0 losses shaped like a valley around ``best_k[wd]``; records what ran."""
  ran = []

  def loss_at(steps, k, wd):
    ran.append((steps, k, wd))
    if diverge_above is not None and k > diverge_above:
      return None
    return 1.0 + 0.01 * (k - best_k[wd]) ** 2 + (-0.001 if wd else 0.0) + 1e-4 * steps / 1000

  return loss_at, ran


def test_first_horizon_runs_five_points_then_the_second_decay_at_three():
  plan = equal_tuning_plan.PLAN
  loss_at, ran = _fake_losses({0.0: -8, 0.1: -9})
  lr, wd = equal_tuning_plan.best_setting(plan, "tiny", 1000, "foam", loss_at)
  first = [k for s, k, w in ran if w == 0.0]
  assert sorted(set(first)) == [-10, -9, -8, -7, -6]        # centre 1e-2 is k = -8
  assert sorted({k for s, k, w in ran if w == 0.1}) == [-9, -8, -7]
  assert (lr, wd) == (equal_tuning_plan.lr_at(-9), 0.1)


def test_a_grid_extends_at_an_edge_at_most_twice():
  plan = equal_tuning_plan.PLAN
  loss_at, ran = _fake_losses({0.0: -20, 0.1: -20})
  lr, _ = equal_tuning_plan.best_setting(plan, "tiny", 1000, "adamw", loss_at)
  ks = sorted({k for _, k, w in ran if w == 0.0})
  assert ks == [-16, -15, -14, -13, -12, -11, -10]         # 5 points + 2 below
  assert lr == equal_tuning_plan.lr_at(-17)  # wd 0.1 runs at -17, -16, -15 around -16


def test_a_later_horizon_centres_on_the_shorter_ones_best_and_carries_decay():
  plan = equal_tuning_plan.PLAN
  loss_at, ran = _fake_losses({0.0: -8, 0.1: -9})
  lr, wd = equal_tuning_plan.best_setting(plan, "tiny", 4000, "foam", loss_at)
  later = sorted({(k, w) for s, k, w in ran if s == 4000})
  assert later == [(-10, 0.1), (-9, 0.1), (-8, 0.1)]
  assert (lr, wd) == (equal_tuning_plan.lr_at(-9), 0.1)


def test_a_missing_run_makes_the_setting_wait():
  plan = equal_tuning_plan.PLAN
  missing = lambda steps, k, wd: equal_tuning_plan.MISSING
  assert equal_tuning_plan.best_setting(plan, "tiny", 4000, "foam", missing) is None


def test_quarter_decades():
  assert equal_tuning_plan.ladder(equal_tuning_plan.lr_at(-7)) == -7
  assert math.isclose(equal_tuning_plan.lr_at(-4), 0.1)
  assert equal_tuning_plan.decays("muon") == (0.0, 1.0)


def test_the_quick_study_runs_and_resumes(tmp_path):
  from benchmarks import equal_tuning  # noqa: PLC0415 (trains: imports the example)

  out = str(tmp_path)
  first = equal_tuning.main(["--quick", "--out", out, "--allow-dirty", "--phases", "1"])
  runs = first["runs"]
  assert runs and all(r["commit"] for r in runs.values())
  ratios = {round(r["adam_lr_ratio"] * r["lr"], 9) for r in runs.values()
            if r["optimizer"] == "muon_adamw_lr"}
  assert len(ratios) == 1                      # the Adam part at AdamW's best lr
  again = equal_tuning.main(["--quick", "--out", out, "--allow-dirty", "--phases", "1"])
  assert again["runs"].keys() == runs.keys()   # resumed: nothing new
  assert again["meta"]["heldout"]["windows"] == 8
