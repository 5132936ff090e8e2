r"""Pre-train a LLaMA with FOAM (or AdamW, Adafactor, Lion, Muon, GaLore) in Flax NNX.

The default run is the CPU demo: the ``tiny`` preset, byte-level, on the
English documentation text inside CPython (no download), a few minutes on 2
cores::

  python -m examples.llama.train
  python -m examples.llama.train --optimizer adamw --sample 200
  python -m examples.llama.train --data my.txt --steps 1000 --resume
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python -m examples.llama.train --mesh fsdp=2,tp=4
  python -m examples.llama.prepare_data c4/ --out data/c4 --tokenizer spiece.model
  python -m examples.llama.train --preset 60m --dataset data/c4 --distributed  # every host

Outputs go under ``--out`` (default ``runs/llama-<preset>-<optimizer>``):
``config.json``, ``metrics.jsonl`` (one record per evaluation), ``loss.png``
and Orbax checkpoints in ``checkpoints/``. The last line printed is
``final val_loss <float>``. The flags come from ``train_config.TrainConfig``;
the run is ``trainer.Trainer``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from examples.llama import checkpoints
from examples.llama import distributed
from examples.llama import train_config
from examples.llama import trainer

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Command-line entry point; returns the summary of ``trainer.train``."""
  cfg = train_config.parse_args(argv)
  try:
    distributed.initialize(cfg.coordinator, cfg.num_processes, cfg.process_id,
                           auto=cfg.distributed)
    run = trainer.Trainer(cfg)
  except (ValueError, FileNotFoundError, ImportError) as e:
    train_config.make_parser().error(str(e))
  try:
    summary = run.run()
  except checkpoints.RestoreError as e:  # --resume onto another model or data.
    train_config.make_parser().error(str(e))
  if not distributed.is_main():  # Process 0 reports.
    return summary
  if "sample" in summary:
    print(f"--- sample ({cfg.sample} tokens, temperature {cfg.temperature}) ---")
    print(cfg.prompt + summary["sample"])
    print("---")
  rate = summary["tokens_per_s"]
  print(f"initial val_loss {summary['initial_val_loss']:.4f} -> final "
        f"{summary['final_val_loss']:.4f} (perplexity {summary['final_val_ppl']:.2f}) "
        f"in {summary['wall_time_s']:.1f} s, "
        + (f"{rate:,.0f} tokens/s" if math.isfinite(rate) else "no steps timed"))
  moments = cfg.moment_dtypes_label()
  print(f"optimizer state: {summary['state_bytes'] / 2**20:.3f} MiB for {cfg.optimizer} "
        + (f"(moments: {moments}) " if moments else "")
        + f"vs {summary['adamw_state_bytes'] / 2**20:.3f} MiB for AdamW "
        f"({summary['state_ratio']:.1%})")
  print(f"outputs: {summary['out']}/{{config.json,metrics.jsonl,loss.png,checkpoints}}")
  print(f"final val_loss {summary['final_val_loss']:.6f}")
  return summary


if __name__ == "__main__":
  main()
