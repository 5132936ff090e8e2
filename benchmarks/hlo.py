"""Counting cross-device collectives in compiled HLO (a verification tool).

FOAM's update must need no communication; the tests and benchmarks prove it
by counting these opcodes in ``jax.jit(...).lower(...).compile().as_text()``.
"""

from __future__ import annotations

import re

__all__ = ["COLLECTIVES", "count_collectives"]

# HLO opcodes that move data between devices.
COLLECTIVES = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "collective-permute",
    "all-to-all",
)
_COLLECTIVE_RE = re.compile(
    r"(?<![\w.%-])(" + "|".join(COLLECTIVES) + r")(?:-start)?\("
)


def count_collectives(hlo_text: str) -> dict[str, int]:
  """Counts the cross-device collectives in compiled HLO text.

  Asynchronous pairs (``all-reduce-start`` / ``all-reduce-done``) count once.

  Args:
    hlo_text: e.g. ``jax.jit(f).lower(*args).compile().as_text()``.

  Returns:
    A dict from each opcode in :data:`COLLECTIVES` to its number of
    occurrences.

  Examples:
    >>> hlo = "%ar = f32[8] all-reduce(f32[8] %x), replica_groups={}"
    >>> count_collectives(hlo)["all-reduce"], count_collectives(hlo)["all-gather"]
    (1, 0)
  """
  if not isinstance(hlo_text, str):
    raise TypeError(
        f"hlo_text must be a str (compiled.as_text()), got {type(hlo_text)}."
    )
  counts = dict.fromkeys(COLLECTIVES, 0)
  for match in _COLLECTIVE_RE.finditer(hlo_text):
    counts[match.group(1)] += 1
  return counts
