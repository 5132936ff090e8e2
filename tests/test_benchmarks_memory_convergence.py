"""The memory and convergence benchmarks run (``--quick``) and say true things.

The full runs produce ``benchmarks/results/``; these tests keep the scripts
from rotting and check their accounting against hand-derived sizes.
"""

import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from benchmarks import convergence  # pylint: disable=g-import-not-at-top
from benchmarks import memory  # pylint: disable=g-import-not-at-top


def _by_opt(rows, config, dtype):
  return {r["optimizer"]: r for r in rows
          if r["config"] == config and r["dtype"] == dtype}


@pytest.fixture(scope="module")
def analytic_7b():
  return _by_opt(
      memory.analytic(["7b"], ("bfloat16",),
                      ("adamw", "lion", "muon", "foam_l2", "foam_mini")),
      "7b", "bfloat16")


def test_analytic_state_matches_hand_count_for_7b(analytic_7b):
  """State bytes from eval_shape equal a count from the config's shapes."""
  got = analytic_7b
  d, f, v, n = 4096, 11008, 32000, 32
  matrices = n * (4 * d * d + 3 * d * f)   # attention + MLP kernels
  other = 2 * v * d + (2 * n + 1) * d      # embed, lm_head, norms
  assert got["adamw"]["params"] == matrices + other
  two = 2  # bytes per bf16 element
  # Adam: m and v for every weight (plus an int32 step count).
  assert got["adamw"]["state_bytes"] == 2 * two * (matrices + other) + 4
  # Lion: one momentum (plus a step count).
  assert got["lion"]["state_bytes"] == two * (matrices + other) + 4
  # FOAM l=2: every matrix's fold axis (the input axis, a multiple of 4
  # here) shrinks 4x; embeddings, head and norms keep Adam's.
  assert got["foam_l2"]["state_bytes"] == 2 * two * (matrices // 4 + other) + 4
  # FOAM-Mini: one value per output feature of each matrix.
  per_layer_out = 4 * d + 2 * f + d
  assert got["foam_mini"]["state_bytes"] == (
      2 * two * (n * per_layer_out + other) + 4)


def test_paper_memory_figure_is_reproduced_for_7b(analytic_7b):
  """LLaMA-7B bf16 weights + states match the paper's bars (+-0.1 GB)."""
  got = analytic_7b
  for opt in ("adamw", "muon", "foam_l2", "foam_mini"):
    paper = memory.PAPER_FIGURE["7b"][opt]
    assert abs(got[opt]["total_bytes"] / 1e9 - paper) < 0.1, opt


def test_memory_quick_mode_writes_a_consistent_report(tmp_path):
  results = memory.main(["--quick", "--out", str(tmp_path)])
  report = (tmp_path / "memory.md").read_text()
  assert "## 2. Compiled peak" in report and "## 3. Largest" in report
  assert json.loads((tmp_path / "memory.json").read_text())["quick"]
  comp = {r["optimizer"]: r for r in results["compiled"]}
  # The donated step holds at least the weights and the state.
  for r in comp.values():
    assert r["peak"] >= r["weights"] + r["state"]
  # FOAM's smaller state shows up in the compiled peak.
  assert comp["foam_l2"]["peak"] < comp["adamw"]["peak"]
  checked = [row for row in results["fits"] if "verified" in row]
  assert checked, "the largest-fit search verified none of its answers"
  for row in checked:
    assert row["verified"], row


@pytest.mark.parametrize("name", convergence.OPTIMIZERS)
def test_updates_are_linear_in_the_peak_lr(name):
  """The benchmark compiles one step per optimizer and scales it by lr."""
  key = jax.random.PRNGKey(0)
  params = {"layer": {"kernel": jax.random.normal(key, (8, 4))},
            "embed_tokens": {"embedding": jnp.ones((5, 8))},
            "norm": {"scale": jnp.ones((4,))}}
  grads = jax.tree.map(lambda p: jnp.cos(3.0 * p) + 0.1, params)

  def updates(lr):
    tx = convergence.make_optimizer(name, lr, total_steps=10)
    state = tx.init(params)
    for _ in range(3):
      u, state = tx.update(grads, state, params)
    return u

  unit, scaled = updates(1.0), updates(0.037)
  for a, b in zip(jax.tree.leaves(unit), jax.tree.leaves(scaled)):
    np.testing.assert_allclose(np.asarray(b), 0.037 * np.asarray(a),
                               rtol=1e-5, atol=1e-9)


def test_convergence_quick_mode_trains_and_reports(tmp_path):
  data = convergence.main(["--quick", "--out", str(tmp_path)])
  runs = list(data["runs"].values())
  plan = convergence.QUICK_PLAN
  for opt in plan["suites"][0][2]:
    grid = {r["lr"]: r["final_val_loss"] for r in runs
            if r["optimizer"] == opt and r["seed"] == 0 and not r["foam"]}
    # Every optimizer ran the whole base grid ...
    assert set(plan["lrs"]) <= set(grid), (opt, grid)
    # ... and one point past an end exactly when its best was at that end.
    base_best = min(plan["lrs"], key=grid.get)
    at_edge = base_best in (min(plan["lrs"]), max(plan["lrs"]))
    assert len(grid) == len(plan["lrs"]) + (1 if at_edge else 0), (opt, grid)
    # Its extra seeds ran at the best lr of the extended grid.
    best = min(grid, key=grid.get)
    seeds = {r["seed"] for r in runs if r["optimizer"] == opt
             and r["lr"] == best and not r["foam"]}
    assert seeds == set(range(plan["seeds"])), (opt, best, seeds)
  for r in runs:
    # Training beats the uniform byte model (loss ln 256) in a few steps.
    assert r["final_val_loss"] < math.log(256), r
    tokens = [c[0] for c in r["val_curve"]]
    assert tokens == sorted(tokens) and tokens[-1] == r["tokens"]
  report = (tmp_path / "convergence.md").read_text()
  assert "| foam |" in report and "| adamw |" in report
