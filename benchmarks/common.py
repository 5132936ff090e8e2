"""Shared helpers for the benchmarks: run records, report headers, byte counts.

Every results file records the machine, software, load, date and command of
its run (``examples.llama.outputs.machine_info``) and any ``--note`` the
person running it gave (parallel processes, other load): reports render
those from the file, never from the renderer's text.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from examples.llama.outputs import machine_info

__all__ = ["block", "header_lines", "machine_info", "note_lines", "provenance_lines",
           "tree_bytes", "tree_size"]


def tree_size(tree: Any) -> int:
  """Elements in the arrays (or ``ShapeDtypeStruct``s) in ``tree``.

  (``optax.tree.size`` for abstract trees, which it will stop accepting.)

  Examples:
    >>> tree_size({"a": jax.ShapeDtypeStruct((2, 3), "float32")})
    6
  """
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree) if hasattr(x, "shape"))


def tree_bytes(tree: Any) -> int:
  """Bytes of the arrays (or ``ShapeDtypeStruct``s) in ``tree``.

  Examples:
    >>> import jax.numpy as jnp
    >>> tree_bytes({"a": jnp.zeros((2, 3)), "b": jnp.zeros(4, jnp.bfloat16)})
    32
  """
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)
             if hasattr(x, "dtype"))


def header_lines(info: dict[str, Any]) -> list[str]:
  """Renders ``machine_info()`` as Markdown bullet lines for a report.

  Examples:
    >>> header_lines({"date": "d", "command": "c", "cpu": "x", "cores": 2,
    ...               "backend": "cpu", "devices": "1 x cpu", "jax": "j",
    ...               "jaxlib": "j", "python": "p", "xla_flags": ""})[0]
    '- Date: d'
  """
  load = info.get("load")
  return [
      f"- Date: {info['date']}",
      f"- Command: `{info['command']}`",
      f"- Machine: {info['cpu']}, {info['cores']} cores; JAX backend "
      f"`{info['backend']}` ({info['devices']})"
      + (f"; load average at start {load[0]:.2f}" if load else ""),
      f"- Software: JAX {info['jax']} (jaxlib {info['jaxlib']}), "
      + (f"Optax {info['optax']}, " if "optax" in info else "")
      + f"Python {info['python']}"
      + (f"; commit {info['commit']}" if "commit" in info else "")
      + (f"; XLA_FLAGS=`{info['xla_flags']}`" if info["xla_flags"] else ""),
  ]


def note_lines(notes: list[str] | None) -> list[str]:
  """The run's recorded notes as paragraphs (none: nothing).

  Examples:
    >>> note_lines(["Ran beside another job."])
    ['Ran beside another job.', '']
  """
  out = []
  for note in notes or []:
    out += [note, ""]
  return out


def provenance_lines(info: dict[str, Any], notes: list[str] | None,
                     extra: list[str] | None = None) -> list[str]:
  """The report's closing section: how, where and when it was measured.

  Reports open with what was measured and its tables; the run's machine,
  command, software, load and notes close them.

  Examples:
    >>> provenance_lines({"date": "d", "command": "c", "cpu": "x", "cores": 2,
    ...                   "backend": "cpu", "devices": "1 x cpu", "jax": "j",
    ...                   "jaxlib": "j", "python": "p", "xla_flags": ""}, ["n"])[:3]
    ['## Provenance', '', '- Date: d']
  """
  return (["## Provenance", ""] + header_lines(info) + list(extra or []) + [""]
          + note_lines(notes))


def block(tree: Any) -> Any:
  """Waits for every array in ``tree`` (``jax.block_until_ready``)."""
  return jax.block_until_ready(tree)
