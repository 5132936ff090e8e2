"""The horizon study's plan: which runs, in which order, centred where.

Per model size, every optimizer is tuned at each horizon (number of steps)
in turn: at the first horizon on :data:`PLAN`'s ``first_grid`` (5
half-decade points), at each later one on the 3 half-decade points around
its best learning rate at the horizon before. A grid is extended past an
edge while its best (seed 0) sits there, at most ``extend_edges`` times;
then the best learning rate gets ``seeds`` seeds in all. The ``late``
optimizers run at one horizon only, on 5 points around another optimizer's
best there.

Phases come most important first, so a study cut short is still complete
up to some horizon; a phase whose centre is not known yet (the shorter
horizon has not run) is skipped and reported as waiting.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from benchmarks.convergence_plan import _ladder_step
from benchmarks.convergence_plan import around
from benchmarks.convergence_plan import best_lr
from benchmarks.convergence_plan import tuned_grid

__all__ = ["PLAN", "QUICK_PLAN", "base_spec", "best_of", "first_grid", "grid_of", "phases",
           "wide_around"]

PLAN: dict[str, Any] = {
    # (model, horizons in steps, optimizers), in order of importance.
    "sizes": [
        ("tiny", [200, 1000, 4000], ["adamw", "foam", "muon", "foam_muon"]),
        ("20m", [200, 1000, 4000], ["adamw", "foam", "muon"]),
    ],
    # Optimizers run at one horizon only, on 5 points around ``centre``'s best.
    "late": [("tiny", 4000, ["foam_int8", "adafactor"], "foam")],
    "first_grid": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2],
    "batch": 8,
    "seq_len": 128,
    "evals": 10,
    "val_batches": 16,
    "extend_edges": 2,
    "seeds": 3,
}

QUICK_PLAN: dict[str, Any] = {
    "sizes": [("tiny", [3, 6], ["adamw", "foam"])],
    "late": [("tiny", 6, ["foam_int8"], "foam")],
    "first_grid": [1e-3, 1e-2],
    "batch": 2,
    "seq_len": 16,
    "evals": 2,
    "val_batches": 2,
    "extend_edges": 1,
    "seeds": 2,
    "model_overrides": {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                        "num_heads": 2},
}


def base_spec(plan: dict[str, Any], dataset: str, model: str, steps: int) -> dict[str, Any]:
  """The fields every run of ``model`` at ``steps`` shares."""
  spec = {"model": model, "dataset": dataset, "steps": steps, "batch": plan["batch"],
          "seq_len": plan["seq_len"], "evals": plan["evals"],
          "val_batches": plan["val_batches"], "foam": {}}
  if plan.get("model_overrides"):
    spec["model_overrides"] = plan["model_overrides"]
  return spec


def wide_around(lr: float) -> list[float]:
  """``lr`` and two half-decade values either side of it (5 points)."""
  below = _ladder_step(lr, -1)
  above = _ladder_step(lr, 1)
  extra = [x for x in (below and _ladder_step(below, -1), above and _ladder_step(above, 1))
           if x is not None]
  return sorted(set(around(lr) + extra))


def phases(plan: dict[str, Any], only_models=None, skip=(),
           only_horizons=None) -> Iterator[tuple[str, int, str]]:
  """``(model, steps, optimizer)`` in the order they run (most important first).

  Each is a grid followed by the seeds at its best learning rate. Model
  sizes not in ``only_models``, horizons not in ``only_horizons`` (when
  given) and optimizers in ``skip`` are left out.
  """
  for model, horizons, opts in plan["sizes"]:
    if only_models and model not in only_models:
      continue
    for steps in horizons:
      if only_horizons and steps not in only_horizons:
        continue
      late = [o for m, s, late_opts, _ in plan.get("late", []) if (m, s) == (model, steps)
              for o in late_opts]
      for opt in list(opts) + late:
        if opt not in skip:
          yield model, steps, opt


def _horizons(plan: dict[str, Any], model: str) -> list[int]:
  return next(h for m, h, _ in plan["sizes"] if m == model)


def _late_centre(plan: dict[str, Any], model: str, steps: int, opt: str) -> str | None:
  return next((c for m, s, opts, c in plan.get("late", [])
               if (m, s) == (model, steps) and opt in opts), None)


def first_grid(plan: dict[str, Any], store, dataset: str, model: str, steps: int,
               opt: str) -> list[float] | None:
  """The grid ``opt`` starts on at ``steps`` (``None`` while its centre is unknown)."""
  centre = _late_centre(plan, model, steps, opt)
  if centre is not None:
    lr = best_of(plan, store, dataset, model, steps, centre)
    return None if lr is None else wide_around(lr)
  earlier = [h for h in _horizons(plan, model) if h < steps]
  if not earlier:
    return list(plan["first_grid"])
  lr = best_of(plan, store, dataset, model, earlier[-1], opt)
  return None if lr is None else around(lr)


def grid_of(plan: dict[str, Any], store, dataset: str, model: str, steps: int,
            opt: str, run=None) -> list[float] | None:
  """``opt``'s tuned grid at ``steps`` (``None`` while its centre is unknown).

  With ``run`` (``run(lr)`` trains seed 0 at ``lr``), missing points and
  edge extensions are trained; without it, the grid as far as it was run.
  """
  first = first_grid(plan, store, dataset, model, steps, opt)
  if first is None:
    return None
  base = base_spec(plan, dataset, model, steps)
  return tuned_grid(store, base, opt, first, plan["extend_edges"], run=run)


def best_of(plan: dict[str, Any], store, dataset: str, model: str, steps: int,
            opt: str) -> float | None:
  """``opt``'s best learning rate (seed 0) at ``steps``; ``None`` until its grid is done.

  A grid is done when every point has run and its best is not at an edge
  that may still be extended.
  """
  first = first_grid(plan, store, dataset, model, steps, opt)
  if first is None:
    return None
  base = base_spec(plan, dataset, model, steps)
  lrs = tuned_grid(store, base, opt, first, plan["extend_edges"])
  if any(store.get({**base, "optimizer": opt, "lr": lr, "seed": 0}) is None for lr in lrs):
    return None
  best = best_lr(store, base, opt, lrs)
  if best is None:
    return None
  extensions_left = plan["extend_edges"] - (len(lrs) - len(first))
  edge_step = _ladder_step(best, 1 if best == lrs[-1] else -1)
  if best in (lrs[0], lrs[-1]) and extensions_left > 0 and edge_step is not None:
    return None
  return best
