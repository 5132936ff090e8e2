"""Shared helpers for the benchmarks: machine description and timing.

Every results file says which machine, software, date and command produced
it; :func:`machine_info` collects that once and :func:`header_lines` renders
it as Markdown.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Any

import jax
import optax

__all__ = [
    "block",
    "command_line",
    "cpu_model",
    "header_lines",
    "machine_info",
]


def cpu_model() -> str:
  """Returns the CPU model name (from ``/proc/cpuinfo`` where available).

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
  """Returns the command that started this process, shell-quoted.

  Examples:
    >>> command_line().startswith("python")
    True
  """
  script = sys.argv[0]
  if script.endswith(".py"):
    script = os.path.relpath(script)
  elif script == "-c":
    script = "-c ..."
  elif script in ("-m", ""):
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    script = "-m " + (spec.name if spec else "?")
  return "python " + " ".join([script] + [shlex.quote(a) for a in sys.argv[1:]])


def git_commit() -> str:
  """The short git commit of this checkout (``+dirty`` if modified), or ``?``."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
        text=True, check=True, timeout=10).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
        capture_output=True, text=True, check=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "?"
  return commit + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
  """Describes the machine and software a benchmark runs on.

  Returns:
    A dict with ``date`` (UTC, ISO 8601), ``command``, ``cpu``, ``cores``,
    ``backend``, ``devices`` (kinds of JAX devices), ``jax``, ``jaxlib``,
    ``optax``, ``commit`` (the repository's git commit), ``python`` and
    ``xla_flags``.

  Examples:
    >>> info = machine_info()
    >>> sorted(info)[:3]
    ['backend', 'command', 'cores']
  """
  import jaxlib  # pylint: disable=g-import-not-at-top

  devices = jax.devices()
  return {
      "date": datetime.datetime.now(datetime.timezone.utc).strftime(
          "%Y-%m-%d %H:%M UTC"),
      "command": command_line(),
      "cpu": cpu_model(),
      "cores": os.cpu_count(),
      "backend": jax.default_backend(),
      "devices": f"{len(devices)} x {devices[0].device_kind}",
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "optax": optax.__version__,
      "commit": git_commit(),
      "python": platform.python_version(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def header_lines(info: dict[str, Any] | None = None) -> list[str]:
  """Renders :func:`machine_info` as Markdown bullet lines for a report.

  Examples:
    >>> header_lines({"date": "d", "command": "c", "cpu": "x", "cores": 2,
    ...               "backend": "cpu", "devices": "1 x cpu", "jax": "j",
    ...               "jaxlib": "j", "python": "p", "xla_flags": ""})[0]
    '- Date: d'
  """
  info = machine_info() if info is None else info
  return [
      f"- Date: {info['date']}",
      f"- Command: `{info['command']}`",
      f"- Machine: {info['cpu']}, {info['cores']} cores; JAX backend "
      f"`{info['backend']}` ({info['devices']})",
      f"- Software: JAX {info['jax']} (jaxlib {info['jaxlib']}), Optax "
      f"{info.get('optax', '?')}, Python {info['python']}; commit "
      f"{info.get('commit', '?')}" + (f"; XLA_FLAGS=`{info['xla_flags']}`"
                                      if info["xla_flags"] else ""),
  ]


def block(tree: Any) -> Any:
  """Waits for every array in ``tree`` (``jax.block_until_ready``)."""
  return jax.block_until_ready(tree)
