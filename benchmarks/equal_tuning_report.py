"""The equal-tuning study's report, written from its runs.

Reads ``results/equal_tuning/runs.json`` (what :mod:`benchmarks.equal_tuning`
trained) and the plan it ran (its ``meta.plan``), and writes
``results/equal_tuning/report.md``, as the protocol's "Report" section asks
(``benchmarks/protocols/equal_tuning.md``):

* per size and horizon, each optimizer's chosen setting (the plan's rule,
  :func:`benchmarks.equal_tuning_plan.best_setting`, applied to the stored
  runs), its final loss (seed mean and standard deviation), and the paired
  difference to AdamW over the seeds both have, with a 95% t-interval (no
  correction for multiple comparisons);
* tokens to reach AdamW's final loss (seed mean), per seed interpolated
  linearly between evaluation points; ``-`` where a seed never reaches it;
* learning-rate sensitivity: seed 0's loss one and two quarter decades
  either side of the chosen learning rate (where run), minus the chosen
  one's;
* optimizer-state bytes at the trained size and at LLaMA-7B's shapes
  (``jax.eval_shape`` of ``init``, float32 weights), beside the final loss
  at the size's longest horizon;
* what has not run yet (phases waiting or incomplete), and the commits the
  runs ran on.

Run: ``python -m benchmarks.equal_tuning_report`` (``--store``, ``--out``).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
from typing import Any

import numpy as np
from scipy import stats

from benchmarks import equal_tuning_plan as plan_lib

__all__ = ["chosen_settings", "main", "paired_difference", "render", "seed_losses",
           "sensitivity", "tokens_to_reach"]

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "equal_tuning")


def _key(plan, model, steps, opt, lr, wd, seed) -> str:
  return plan_lib.run_key({"model": model, "optimizer": opt, "weight_decay": wd, "lr": lr,
                           "seed": seed, "steps": steps, "batch": plan["batch"],
                           "seq_len": plan["seq_len"]})


def _loss_at(runs, plan, model, opt):
  """Seed 0's final loss for :func:`~benchmarks.equal_tuning_plan.best_setting`."""
  def loss_at(steps, k, wd):
    run = runs.get(_key(plan, model, steps, opt, plan_lib.lr_at(k), wd, 0))
    if run is None:
      return plan_lib.MISSING
    loss = run["final_val_loss"]
    return loss if loss is not None and math.isfinite(loss) else None
  return loss_at


def chosen_settings(store: dict[str, Any]) -> dict[tuple[str, int, str], Any]:
  """``(model, steps, optimizer) -> (lr, weight_decay)``, or ``None`` while unknown."""
  plan, runs = store["meta"]["plan"], store["runs"]
  return {(model, steps, opt): plan_lib.best_setting(plan, model, steps, opt,
                                                     _loss_at(runs, plan, model, opt))
          for _, model, steps, opt, _ in plan_lib.phases(plan)}


def seed_losses(store, model, steps, opt, setting) -> dict[int, dict[str, Any]]:
  """``seed -> run`` at ``setting`` (``(lr, weight_decay)``), for the seeds there."""
  plan, runs = store["meta"]["plan"], store["runs"]
  found = {}
  for seed in range(max(p[4] for p in plan["phases"])):
    run = runs.get(_key(plan, model, steps, opt, setting[0], setting[1], seed))
    if run is not None:
      found[seed] = run
  return found


def paired_difference(a: dict[int, float], b: dict[int, float]
                      ) -> tuple[float, float, float, int] | None:
  """Mean of ``a - b`` over the seeds both have, with its 95% t-interval.

  Returns ``(mean, low, high, n)``, or ``None`` for fewer than two seeds.

  Examples:
    >>> mean, low, high, n = paired_difference({0: 1.0, 1: 2.0, 2: 3.0},
    ...                                        {0: 1.5, 1: 2.5, 2: 3.0})
    >>> round(mean, 3), n, low < mean < high
    (-0.333, 3, True)
  """
  seeds = sorted(set(a) & set(b))
  if len(seeds) < 2:
    return None
  d = np.array([a[s] - b[s] for s in seeds], np.float64)
  mean, sem = float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))
  half = float(stats.t.ppf(0.975, len(d) - 1)) * sem
  return mean, mean - half, mean + half, len(d)


def tokens_to_reach(curve: list[list[float]], target: float) -> float | None:
  """Tokens at which a validation curve first reaches ``target`` (linear between points).

  ``curve`` holds ``[tokens, seconds, loss]`` rows; ``None`` if never reached.

  Examples:
    >>> tokens_to_reach([[100, 0, 3.0], [200, 0, 2.0]], 2.5)
    150.0
  """
  prev = None
  for tokens, _, loss in curve:
    if loss <= target:
      if prev is None:
        return float(tokens)
      (t0, l0) = prev
      return float(t0 + (tokens - t0) * (l0 - target) / (l0 - loss))
    prev = (tokens, loss)
  return None


def sensitivity(store, model, steps, opt, setting) -> dict[int, float]:
  """Seed 0's loss at ``k`` quarter decades from the chosen lr, minus the chosen one's."""
  plan, runs = store["meta"]["plan"], store["runs"]
  k0 = plan_lib.ladder(setting[0])
  base = runs.get(_key(plan, model, steps, opt, setting[0], setting[1], 0))
  out = {}
  for dk in (-2, -1, 1, 2):
    run = runs.get(_key(plan, model, steps, opt, plan_lib.lr_at(k0 + dk), setting[1], 0))
    if run is not None and base is not None:
      out[dk] = run["final_val_loss"] - base["final_val_loss"]
  return out


def state_bytes(opt: str, plan: dict[str, Any], model: str) -> tuple[int, int]:
  """Optimizer-state bytes for float32 weights: at ``model``'s size and at LLaMA-7B's."""
  from benchmarks import convergence
  from benchmarks import equal_tuning
  from benchmarks import memory
  from foam_jax import state_bytes as count

  spec = {"optimizer": opt, "weight_decay": 0.1, "steps": 1000}
  sizes = []
  for config in (convergence.model_config(model, plan["seq_len"]),
                 memory.llama_config("7b")):
    tx = equal_tuning.build_optimizer(spec, plan, config)
    sizes.append(count(tx, memory.abstract_params(config, "float32")))
  return sizes[0], sizes[1]


def _fmt(x: float | None, digits: int = 3) -> str:
  return "-" if x is None else f"{x:.{digits}f}"


def _horizon_table(store, settings, model, steps) -> list[str]:
  opts = [o for (m, s, o) in settings if (m, s) == (model, steps)]
  adamw = settings.get((model, steps, "adamw"))
  adamw_runs = seed_losses(store, model, steps, "adamw", adamw) if adamw else {}
  adamw_final = {s: r["final_val_loss"] for s, r in adamw_runs.items()}
  target = float(np.mean(list(adamw_final.values()))) if adamw_final else None
  lines = [f"### `{model}`, {steps} steps", "",
           "| optimizer | lr, wd | final loss (n) | minus AdamW, paired [95% CI] (n) | "
           "tokens to AdamW's loss | loss at lr -2, -1, +1, +2 quarter decades, minus "
           "the chosen |", "|---|---|---|---|---|---|"]
  for opt in opts:
    setting = settings[(model, steps, opt)]
    if setting is None:
      lines.append(f"| {opt} | waiting | | | | |")
      continue
    runs = seed_losses(store, model, steps, opt, setting)
    finals = {s: r["final_val_loss"] for s, r in runs.items()}
    values = np.array(list(finals.values()))
    spread = f" +- {values.std(ddof=1):.3f}" if len(values) > 1 else ""
    diff = paired_difference(finals, adamw_final) if opt != "adamw" else None
    diff_text = (f"{diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}] ({diff[3]})"
                 if diff else "-")
    reach = ([tokens_to_reach(r["val_curve"], target) for r in runs.values()]
             if target is not None and opt != "adamw" else [])
    reached = [t for t in reach if t is not None]
    reach_text = (f"{np.mean(reached) / 1e6:.2f}M ({len(reached)} of {len(reach)})"
                  if reached else "-")
    sens = sensitivity(store, model, steps, opt, setting)
    sens_text = ", ".join(_fmt(sens.get(dk)) for dk in (-2, -1, 1, 2))
    lines.append(f"| {opt} | {setting[0]:g}, {setting[1]:g} | {values.mean():.3f}{spread} "
                 f"({len(values)}) | {diff_text} | {reach_text} | {sens_text} |")
  return lines + [""]


def render(store: dict[str, Any], with_bytes: bool = True) -> str:
  """The report (Markdown) from the store."""
  meta, plan = store["meta"], store["meta"]["plan"]
  settings = chosen_settings(store)
  commits = collections.Counter(r.get("commit", "?")[:7] for r in store["runs"].values())
  lines = ["# The equal-tuning study: report", "",
           "Protocol: `benchmarks/protocols/equal_tuning.md`. Final validation loss in "
           "nats per byte on the 1,024 held-out windows, seed mean +- standard deviation. "
           "Paired differences are over the seeds both optimizers have, with 95% "
           "t-intervals, not corrected for multiple comparisons. Tokens: the seed mean "
           "over the seeds that reach AdamW's seed-mean final loss, interpolated between "
           "evaluation points. Sensitivity: seed 0. Runs: "
           f"{len(store['runs'])}; commits: "
           + ", ".join(f"`{c}` ({n})" for c, n in sorted(commits.items()))
           + f"; jax {meta.get('jax')} on {meta.get('machine', {}).get('cpu', '?')}, "
           "XLA:CPU.", ""]
  lines += [f"- {note}" for note in meta.get("notes", [])]
  horizons = sorted({(m, s) for (m, s, _) in settings}, key=lambda x: (x[0] != "tiny", x[1]))
  for model, steps in horizons:
    lines += _horizon_table(store, settings, model, steps)
  waiting = [f"phase {p} `{m}` {s} steps {o}" for p, m, s, o, n in plan_lib.phases(plan)
             if settings[(m, s, o)] is None
             or len(seed_losses(store, m, s, o, settings[(m, s, o)])) < n]
  lines += ["## Not run yet", "",
            ("Every planned run is in." if not waiting else
             "Incomplete (waiting for its centre, its grid or its seeds): "
             + "; ".join(waiting) + "."), ""]
  if with_bytes:
    lines += _bytes_table(store, settings)
  return "\n".join(lines)


def _bytes_table(store, settings) -> list[str]:
  plan = store["meta"]["plan"]
  lines = ["## Optimizer state against final loss", "",
           "State bytes from `jax.eval_shape` of `init` for float32 weights; final loss at "
           "each size's longest horizon run so far.", "",
           "| size | optimizer | state at the trained size (MB) | state at LLaMA-7B (GB) | "
           "final loss (horizon) |", "|---|---|---|---|---|"]
  for model in sorted({m for (m, _, _) in settings}, key=lambda m: m != "tiny"):
    for opt in sorted({o for (m, _, o) in settings if m == model}):
      done = [(s, settings[(model, s, opt)]) for (m, s, o) in settings
              if (m, o) == (model, opt) and settings[(model, s, opt)] is not None]
      if not done:
        continue
      steps, setting = max(done)
      finals = [r["final_val_loss"]
                for r in seed_losses(store, model, steps, opt, setting).values()]
      small, big = state_bytes(opt, plan, model)
      lines.append(f"| `{model}` | {opt} | {small / 1e6:.2f} | {big / 1e9:.2f} | "
                   f"{np.mean(finals):.3f} ({steps}) |")
  return lines + [""]


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--store", default=os.path.join(_RESULTS, "runs.json"))
  parser.add_argument("--out", default=os.path.join(_RESULTS, "report.md"))
  args = parser.parse_args(argv)
  with open(args.store) as f:
    store = json.load(f)
  text = render(store)
  with open(args.out, "w") as f:
    f.write(text)
  return text


if __name__ == "__main__":
  main()
