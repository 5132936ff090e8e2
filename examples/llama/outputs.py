"""Run outputs: ``config.json``, ``metrics.jsonl`` and ``loss.png``."""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["write_json", "read_metrics", "MetricsLog", "plot_losses"]


def write_json(path: str, obj: Any) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The records of a ``metrics.jsonl`` (empty if the file does not exist)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class MetricsLog:
  """Appends one JSON object per evaluation to ``metrics.jsonl``.

  Args:
    path: the file.
    keep_until_step: on resume, records after this step (written by the
      interrupted run after its last checkpoint) are dropped; ``None`` starts
      a fresh file.
  """

  def __init__(self, path: str, keep_until_step: int | None = None):
    self.path = path
    kept = []
    if keep_until_step is not None:
      kept = [r for r in read_metrics(path) if r["step"] <= keep_until_step]
    with open(path, "w") as f:
      for record in kept:
        f.write(json.dumps(record) + "\n")

  def append(self, record: dict[str, Any]) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")


def plot_losses(metrics_path: str, png_path: str, title: str = "") -> None:
  """Plots train and validation loss against tokens seen (matplotlib, Agg)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  records = read_metrics(metrics_path)
  fig, ax = plt.subplots(figsize=(6, 4))
  train = [(r["tokens"], r["train_loss"]) for r in records if r.get("train_loss") is not None]
  val = [(r["tokens"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
  if train:
    ax.plot(*zip(*train), label="train loss (mean since previous eval)", marker=".")
  if val:
    ax.plot(*zip(*val), label="validation loss", marker="o")
  ax.set_xlabel("tokens")
  ax.set_ylabel("cross-entropy (nats/token)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(png_path, dpi=120)
  plt.close(fig)
