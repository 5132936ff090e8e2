"""Joining the processes of a multi-host run (``jax.distributed``).

Every host runs the same ``train.py`` command. Either the flags name the
coordinator (``--coordinator HOST:PORT --num-processes N --process-id I``,
e.g. several processes on one machine), or ``--distributed`` lets
``jax.distributed.initialize()`` detect a TPU pod slice, or a SLURM / Open
MPI cluster, by itself. Afterwards ``jax.devices()`` lists every host's
devices and one mesh spans them all.
"""

from __future__ import annotations

import jax

__all__ = ["initialize", "is_main"]


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, auto: bool = False) -> None:
  """Joins the other processes; does nothing for a single-process run.

  Args:
    coordinator: ``HOST:PORT`` of process 0.
    num_processes: how many processes take part.
    process_id: this process's index, ``0 .. num_processes-1``.
    auto: ``--distributed``: let JAX detect the cluster.

  Raises:
    ValueError: some but not all of the three explicit settings, or an
      index out of range.

  Examples:
    >>> initialize()  # One process: nothing to join.
    >>> is_main()
    True
  """
  explicit = (coordinator, num_processes, process_id)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ValueError("--coordinator, --num-processes and --process-id go together.")
    if not 0 <= process_id < num_processes:
      raise ValueError(f"--process-id must be in [0, {num_processes}), got {process_id}.")
    if num_processes > 1:
      jax.distributed.initialize(coordinator_address=coordinator,
                                 num_processes=num_processes, process_id=process_id)
  elif auto:
    jax.distributed.initialize()


def is_main() -> bool:
  """Whether this is process 0, the one that prints and writes files."""
  return jax.process_index() == 0
