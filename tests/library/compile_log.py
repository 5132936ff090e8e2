"""Counting XLA compilations as JAX logs them (``jax.log_compiles``)."""

from __future__ import annotations

import contextlib
import logging
import re

import jax


@contextlib.contextmanager
def compilations():
  """Collects the messages of the XLA compilations that happen inside."""
  messages = []

  class Collect(logging.Handler):

    def emit(self, record):
      if re.search(r"Finished .* compilation", record.getMessage()):
        messages.append(record.getMessage())

  handler = Collect(level=logging.DEBUG)
  logger = logging.getLogger("jax")
  old_level = logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.DEBUG)
  try:
    with jax.log_compiles():
      yield messages
  finally:
    logger.removeHandler(handler)
    logger.setLevel(old_level)
