"""Test setup: 8 simulated CPU devices for the sharding tests.

The flag must be set before JAX initialises its backends, so it lives here,
ahead of any test module's ``import jax``.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
