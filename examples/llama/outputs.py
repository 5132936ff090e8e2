"""Run outputs: ``config.json``, ``metrics.jsonl``, ``loss.png``, the machine.

:func:`machine_info` describes the machine and software of a run; the
example's ``config.json`` and every benchmark's results record it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

__all__ = ["MetricsLog", "machine_info", "plot_losses", "read_metrics", "write_json"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_model() -> str:
  """The CPU model name (from ``/proc/cpuinfo`` where available).

  Examples:
    >>> isinstance(cpu_model(), str)
    True
  """
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def command_line() -> str:
  """The command that started this process, shell-quoted.

  Examples:
    >>> command_line().startswith("python")
    True
  """
  script = sys.argv[0]
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name != "__main__":  # python -m MODULE
    script = "-m " + spec.name
  elif script.endswith(".py"):
    script = os.path.relpath(script)
  elif script == "-c":
    script = "-c ..."
  elif script in ("-m", ""):
    script = "-m ?"
  return "python " + " ".join([script] + [shlex.quote(a) for a in sys.argv[1:]])


def git_commit() -> str:
  """The short git commit of this checkout (``+dirty`` if modified), or ``?``."""
  try:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True,
        text=True, check=True, timeout=10).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=_ROOT,
        capture_output=True, text=True, check=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "?"
  return commit + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
  """The machine, software, load and command of this run.

  Returns:
    A dict with ``date`` (UTC), ``command``, ``cpu``, ``cores``, ``load``
    (1/5/15-minute load averages at the call, where the OS has them),
    ``backend``, ``devices``, ``jax``, ``jaxlib``, ``optax``, ``commit``,
    ``python`` and ``xla_flags``.

  Examples:
    >>> info = machine_info()
    >>> sorted(info)[:3]
    ['backend', 'command', 'commit']
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  devices = jax.devices()
  try:
    load = [round(x, 2) for x in os.getloadavg()]
  except OSError:
    load = None
  return {
      "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
      "command": command_line(),
      "cpu": cpu_model(),
      "cores": os.cpu_count(),
      "load": load,
      "backend": jax.default_backend(),
      "devices": f"{len(devices)} x {devices[0].device_kind}",
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "optax": optax.__version__,
      "commit": git_commit(),
      "python": platform.python_version(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def write_json(path: str, obj: Any) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The records of a ``metrics.jsonl`` (empty if the file does not exist).

  A last line cut short (a run killed while writing it) is dropped.
  """
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  if lines and not lines[-1].endswith("\n"):
    lines.pop()
  return [json.loads(line) for line in lines]


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
