"""The equal-tuning study's plan: which runs, in which order, at which settings.

The protocol (``benchmarks/protocols/equal_tuning.md``) in code. Per model
size, every optimizer is tuned at each horizon (number of steps) in turn:

* at the first horizon (1000 steps): the learning rate on
  ``first_points`` quarter-decade points (factors of ``10**0.25``) around its
  centre (:data:`PLAN`'s ``centres``), at the first of its two weight
  decays; then the second weight decay at the best learning rate and its
  two neighbours; the best (learning rate, weight decay) of all of them;
* at each later horizon: ``later_points`` points around its best learning
  rate at the horizon before, at the weight decay chosen at 1000 steps;
* a grid is extended by one point past an edge while its best sits there, at
  most ``extend_edges`` times; then the best setting gets its seeds.

Every choice is made on seed 0's final validation loss. Seeds pair runs: seed
``s`` has the same initialisation and the same data for every optimizer.
Phases come in the protocol's order, so a study cut short is complete up to
some phase; a phase whose centre is not known yet is reported as waiting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any

__all__ = ["ADAM_FAMILY", "MISSING", "PLAN", "QUICK_PLAN", "best_setting", "decays",
           "ladder", "lr_at", "phases", "run_key"]

# Optimizers whose every moment is Adam's (b2 from the plan) and whose
# weight decays are 0 and 0.1; Lion, Muon and folded Muon take 0 and 1.0 on
# their matrices (Muon's Adam part: 0.1 with it).
ADAM_FAMILY = ("adamw", "foam", "foam_mini", "foam_int8", "adam_mini", "adam_alpha",
               "adafactor", "galore")
ALL = ("adamw", "foam", "foam_mini", "foam_int8", "adam_mini", "adafactor", "galore",
       "lion", "muon", "foam_muon", "adam_alpha", "muon_adamw_lr")
LONGEST = ("adamw", "foam", "muon", "foam_muon")

PLAN: dict[str, Any] = {
    "name": "equal-tuning",
    "batch": 8,
    "seq_len": 128,
    "evals": 8,
    "eval_windows": 1024,
    "eval_batch": 64,
    "clip": 1.0,
    "warmup_fraction": 0.1,
    "adam_b2": 0.95,
    "first_points": 5,
    "later_points": 3,
    "extend_edges": 2,
    # Learning-rate centres at 1000 steps, snapped to the quarter-decade
    # ladder: the first study's best at 1000 steps (adamw, foam, muon,
    # foam_muon), else the closest relative's (foam_mini, foam_int8 and
    # adam_alpha: FOAM's; adam_mini: AdamW's, as its authors advise; the
    # control muon_adamw_lr: Muon's), else the first study's best at 4000
    # steps (adafactor) or the convergence benchmark's on tiny (galore 1e-2,
    # lion 1e-3).
    "centres": {"adamw": 1e-3, "foam": 1e-2, "muon": 1e-2, "foam_muon": 3e-2,
                "foam_mini": 1e-2, "foam_int8": 1e-2, "adam_alpha": 1e-2,
                "adam_mini": 1e-3, "muon_adamw_lr": 1e-2, "adafactor": 3e-2,
                "galore": 1e-2, "lion": 1e-3},
    # (phase, model, steps, optimizers, seeds), run in this order.
    "phases": [
        (1, "tiny", 1000, ALL, 3),
        (1, "tiny", 4000, ("adamw", "foam", "adam_alpha", "muon", "muon_adamw_lr",
                           "foam_muon"), 3),
        (2, "tiny", 10900, LONGEST, 3),
        (3, "20m", 1000, LONGEST, 3),
        (3, "20m", 4000, LONGEST, 5),
        (4, "tiny", 4000, ("foam_mini", "foam_int8", "adam_mini", "adafactor", "galore",
                           "lion"), 3),
        (5, "tiny", 10900, LONGEST, 5),
    ],
}

QUICK_PLAN: dict[str, Any] = {
    **PLAN,
    "name": "quick",
    "batch": 2,
    "seq_len": 16,
    "evals": 2,
    "eval_windows": 8,
    "eval_batch": 4,
    "first_points": 3,
    "later_points": 3,
    "extend_edges": 1,
    "model_overrides": {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                        "num_heads": 2, "num_kv_heads": 2},
    "phases": [
        (1, "tiny", 4, ("adamw", "foam", "adam_alpha", "muon_adamw_lr", "adam_mini"), 2),
        (2, "tiny", 6, ("adamw", "foam"), 2),
    ],
}


def decays(optimizer: str) -> tuple[float, float]:
  """The two weight decays ``optimizer`` is tuned on (the first is tried first).

  Examples:
    >>> decays("foam"), decays("lion")
    ((0.0, 0.1), (0.0, 1.0))
  """
  return (0.0, 0.1) if optimizer in ADAM_FAMILY else (0.0, 1.0)


def ladder(lr: float) -> int:
  """The quarter-decade index nearest ``lr`` (``lr ~ 10**(k/4)``).

  Examples:
    >>> ladder(1e-3), ladder(3e-2)
    (-12, -6)
  """
  return round(4 * math.log10(lr))


def lr_at(k: int) -> float:
  """The learning rate at quarter-decade index ``k`` (3 significant digits).

  Examples:
    >>> [lr_at(k) for k in (-12, -11, -6)]
    [0.001, 0.00178, 0.0316]
  """
  return float(f"{10 ** (k / 4):.3g}")


def run_key(spec: dict[str, Any]) -> str:
  """A run's identity in the study's store.

  Examples:
    >>> run_key({"model": "tiny", "optimizer": "foam", "weight_decay": 0.1,
    ...          "lr": 0.00562, "seed": 0, "steps": 1000, "batch": 8, "seq_len": 128})
    'tiny/foam/wd=0.1/lr=0.00562/seed=0/1000x8x128'
  """
  return (f"{spec['model']}/{spec['optimizer']}/wd={spec['weight_decay']:g}"
          f"/lr={spec['lr']:.3g}/seed={spec['seed']}"
          f"/{spec['steps']}x{spec['batch']}x{spec['seq_len']}")


def phases(plan: dict[str, Any], only: Iterable[int] | None = None
           ) -> Iterator[tuple[int, str, int, str, int]]:
  """``(phase, model, steps, optimizer, seeds)`` in the order they run."""
  keep = set(only) if only else None
  for phase, model, steps, opts, seeds in plan["phases"]:
    if keep is None or phase in keep:
      for opt in opts:
        yield phase, model, steps, opt, seeds


def _horizons(plan: dict[str, Any], model: str) -> list[int]:
  return sorted({s for _, m, s, _, _ in plan["phases"] if m == model})


MISSING = object()  # What ``loss_at`` returns for a run that is not there.


def _grid(plan, centre: int, points: int, wd: float, steps: int, loss_at
          ) -> tuple[list[int], bool]:
  """The grid around ``centre``, extended at its edges; ``(grid, complete)``."""
  half = points // 2
  grid = list(range(centre - half, centre - half + points))
  losses = {k: loss_at(steps, k, wd) for k in grid}
  if any(v is MISSING for v in losses.values()):
    return grid, False
  for _ in range(plan["extend_edges"]):
    scored = {k: v for k, v in losses.items() if v is not None}
    if not scored:
      break
    best = min(scored, key=scored.get)
    if best not in (grid[0], grid[-1]):
      break
    new = grid[-1] + 1 if best == grid[-1] else grid[0] - 1
    losses[new] = loss_at(steps, new, wd)
    if losses[new] is MISSING:
      return sorted(losses), False
    grid = sorted(losses)
  return grid, True


def best_setting(plan: dict[str, Any], model: str, steps: int, opt: str, loss_at
                 ) -> tuple[float, float] | None:
  """``opt``'s chosen ``(lr, weight_decay)`` at ``steps``, ``None`` while unknown.

  ``loss_at(steps, k, weight_decay)`` gives seed 0's final loss at
  ``lr_at(k)`` (``None`` if it diverged), or :data:`MISSING` if the
  run is not there (a caller that trains runs it instead).
  """
  horizons = _horizons(plan, model)
  first = horizons[0]
  wd_first, wd_second = decays(opt)
  if steps == first:
    grid, done = _grid(plan, ladder(plan["centres"][opt]), plan["first_points"],
                       wd_first, steps, loss_at)
    if not done:
      return None
    scored = {(k, wd_first): loss_at(steps, k, wd_first) for k in grid}
    valid = {key: v for key, v in scored.items() if v is not None}
    if not valid:
      return None
    k_best = min(valid, key=valid.get)[0]
    for k in (k_best - 1, k_best, k_best + 1):
      scored[(k, wd_second)] = loss_at(steps, k, wd_second)
      if scored[(k, wd_second)] is MISSING:
        return None
  else:
    before = best_setting(plan, model, max(h for h in horizons if h < steps), opt,
                          loss_at)
    if before is None:
      return None
    centre, wd = ladder(before[0]), before[1]
    grid, done = _grid(plan, centre, plan["later_points"], wd, steps, loss_at)
    if not done:
      return None
    scored = {(k, wd): loss_at(steps, k, wd) for k in grid}
  valid = {key: v for key, v in scored.items() if v is not None and v is not MISSING}
  if not valid:
    return None
  k, wd = min(valid, key=valid.get)
  return lr_at(k), wd
