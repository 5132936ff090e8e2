"""Switch benchmark: an AdamW run moved onto FOAM halfway, moments converted.

The example's ``tiny`` preset on its built-in corpus, one lr and schedule
for every run (``--lr``, warmup + cosine over ``--steps``):

* ``adamw``: AdamW throughout;
* ``converted``: AdamW for the first half, then ``--resume --optimizer foam``
  from its halfway checkpoint (``examples.llama.switch``: the moments become
  FOAM's block means, every step count carries over);
* ``zeroed``: the same switch with FOAM's moments zeroed (weights and step
  counts kept): what the conversion is worth;
* ``foam``: FOAM from step 0.

Every run is ``examples.llama.trainer.Trainer`` (one train loop). Results:
``benchmarks/results/switch.json`` (the curves, machine, command), rendered
from it alone to ``switch.md`` and ``switch.png``. ``--quick`` trains a few
steps of a shrunken model (CI); ``--render`` re-renders.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Any

from benchmarks import common
from examples.llama import outputs
from examples.llama import trainer
from examples.llama.train_config import TrainConfig

__all__ = ["RUNS", "main", "render", "run_all"]

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
RUNS = ("converted", "zeroed", "foam", "adamw")
_LABELS = {
    "converted": "AdamW, then FOAM (moments converted)",
    "zeroed": "AdamW, then FOAM (moments zeroed)",
    "foam": "FOAM from step 0",
    "adamw": "AdamW throughout",
}
_QUICK_MODEL = {"num_layers": 1, "hidden_size": 32, "intermediate_size": 96, "num_heads": 2}


class _ZeroedSwitch(trainer.Trainer):
  """The trainer, with a switch that zeroes the new optimizer's moments."""

  zero_moments_on_switch = True


def _val_curve(out: str) -> list[list[float]]:
  return [[r["step"], r["val_loss"]]
          for r in outputs.read_metrics(os.path.join(out, "metrics.jsonl"))]


def run_all(steps: int, lr: float, eval_every: int, work: str,
            quick: bool = False) -> dict[str, list[list[float]]]:
  """Trains the four runs under ``work``; ``{run: [[step, val_loss], ...]}``."""
  switch_step = steps // 2

  def cfg(name: str, optimizer: str, **kw: Any) -> TrainConfig:
    settings = dict(preset="tiny", optimizer=optimizer, steps=steps, lr=lr,
                    eval_every=eval_every, checkpoint_every=switch_step, progress=False,
                    out=os.path.join(work, name))
    if quick:
      settings.update(model_overrides=dict(_QUICK_MODEL), seq_len=32, batch_size=4,
                      eval_batches=2)
    return TrainConfig(**{**settings, **kw})

  trainer.Trainer(cfg("adamw", "adamw")).run()
  curves = {"adamw": _val_curve(os.path.join(work, "adamw"))}
  for name, kind in (("converted", trainer.Trainer), ("zeroed", _ZeroedSwitch)):
    out = os.path.join(work, name)
    shutil.copytree(os.path.join(work, "adamw"), out)
    # As if AdamW had stopped at its halfway checkpoint.
    shutil.rmtree(os.path.join(out, "checkpoints", str(steps)))
    kind(cfg(name, "foam", resume=True)).run()
    curves[name] = _val_curve(out)
  trainer.Trainer(cfg("foam", "foam")).run()
  curves["foam"] = _val_curve(os.path.join(work, "foam"))
  return curves


def _at(curve: list[list[float]], step: int) -> float | None:
  return next((loss for s, loss in curve if s == step), None)


def render(results: dict[str, Any], out_dir: str) -> str:
  """Writes ``switch.md`` and ``switch.png`` from ``results``; returns the Markdown."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  steps, switch_step, curves = results["steps"], results["switch_step"], results["curves"]
  points = [switch_step + d for d in (0, 10, 50) if switch_step + d < steps] + [steps]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name in RUNS:
    xs, ys = zip(*curves[name])
    ax.plot(xs, ys, label=_LABELS[name], marker="." if len(xs) < 60 else None)
  ax.axvline(switch_step, color="gray", ls=":", lw=1)
  lows = [loss for c in curves.values() for s, loss in c if s >= switch_step]
  ax.set_ylim(min(lows) - 0.1, max(lows) + 0.4)
  ax.set_xlabel("step")
  ax.set_ylabel("validation loss (nats/byte)")
  ax.set_title(f"LLaMA tiny, switch AdamW -> FOAM at step {switch_step} (lr {results['lr']:g})")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "switch.png"), dpi=120)
  plt.close(fig)

  head = " | ".join(f"step {p}" + (" (switch)" if p == switch_step else
                                   f" (+{p - switch_step})") for p in points)
  rows = [f"| {_LABELS[name]} | " + " | ".join(
      "-" if _at(curves[name], p) is None else f"{_at(curves[name], p):.4f}"
      for p in points) + " |" for name in RUNS]
  lines = [
      "# Switching a running AdamW job to FOAM",
      "",
      f"The example's `{results['preset']}` preset"
      + (" (shrunken: --quick)" if results["quick"] else "")
      + f" on its built-in corpus, {steps} steps, one lr schedule for every run "
      f"(peak {results['lr']:g}, 10% warmup, cosine to 0.1x). At step {switch_step} "
      "AdamW's checkpoint is resumed with `--optimizer foam`: `converted` takes "
      "the block means of AdamW's moments (`foam_jax.convert_state`, every "
      "step count kept), `zeroed` the same weights and counts with zero moments.",
      "",
      f"Validation loss (nats/byte, {results['eval_batches']} fixed batches, "
      f"every {results['eval_every']} steps):",
      "",
      f"| run | {head} |",
      "|---|" + "---|" * len(points),
      *rows,
      "",
      "![validation loss](switch.png)",
      "",
      *common.provenance_lines(results["machine"], results.get("notes")),
  ]
  text = "\n".join(lines)
  with open(os.path.join(out_dir, "switch.md"), "w") as f:
    f.write(text)
  return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--eval-every", type=int, default=10)
  parser.add_argument("--quick", action="store_true", help="a few steps, shrunken (CI)")
  parser.add_argument("--out", default=_RESULTS)
  parser.add_argument("--render", action="store_true", help="re-render switch.json")
  parser.add_argument("--note", action="append", default=[])
  args = parser.parse_args(argv)
  path = os.path.join(args.out, "switch.json")
  if args.render:
    with open(path) as f:
      results = json.load(f)
  else:
    if args.steps < 4 or args.steps % 2:
      parser.error(f"--steps must be an even number >= 4, got {args.steps}.")
    machine = common.machine_info()
    with tempfile.TemporaryDirectory() as work:
      curves = run_all(args.steps, args.lr, args.eval_every, work, quick=args.quick)
    results = {"machine": machine, "notes": args.note, "preset": "tiny",
               "quick": args.quick, "steps": args.steps, "switch_step": args.steps // 2,
               "lr": args.lr, "eval_every": args.eval_every,
               "eval_batches": 2 if args.quick else TrainConfig().eval_batches,
               "curves": curves}
    os.makedirs(args.out, exist_ok=True)
    outputs.write_json(path, results)
  print(render(results, args.out))
  return results


if __name__ == "__main__":
  main()
