"""Test setup: 8 simulated CPU devices for the sharding tests.

The flag must be set before JAX initialises its backends, so it lives here,
ahead of any test module's ``import jax``. With ``FOAM_JAX_TEST_DEVICES=1``
the run keeps JAX's one CPU device: ``tests/test_single_device.py`` runs the
tests marked ``single_device`` (each transform's numerics) so, to check them
on the device count most users have.
"""

import os

SINGLE_DEVICE_ENV = "FOAM_JAX_TEST_DEVICES"
_FLAG = "--xla_force_host_platform_device_count=8"
if os.environ.get(SINGLE_DEVICE_ENV) != "1" and _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
