"""Test setup: 8 simulated CPU devices for the sharding tests.

The flag must be set before JAX initialises its backends, so it lives here,
ahead of any test module's ``import jax``. With ``FOAM_JAX_TEST_DEVICES=1``
the run keeps JAX's one CPU device: ``tests/library/test_single_device.py`` runs the
tests marked ``single_device`` (each transform's numerics) so, to check them
on the device count most users have. Another count (``FOAM_JAX_TEST_DEVICES=2``)
simulates that many devices (the Levanter tests' meshes).

``tests/clients/test_levanter.py`` runs where Levanter is installed (``.[levanter]``,
its own step in ``.ci/run``: Levanter's Optax pin excludes the example's);
elsewhere it is not collected, nor are ``tests/clients/test_tunix.py`` and
``tests/clients/test_maxtext.py`` where Tunix or MaxText is not installed
(their own steps too).
"""

import importlib.util
import os

SINGLE_DEVICE_ENV = "FOAM_JAX_TEST_DEVICES"
_DEVICES = os.environ.get(SINGLE_DEVICE_ENV, "8")
_FLAG = f"--xla_force_host_platform_device_count={_DEVICES}"
if _DEVICES != "1" and "xla_force_host_platform_device_count" not in os.environ.get(
    "XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Clients with their own venv (their own .ci/run step): collected where installed.
collect_ignore = [path for module, path in (("levanter", "clients/test_levanter.py"),
                                            ("tunix", "clients/test_tunix.py"),
                                            ("maxtext", "clients/test_maxtext.py"))
                  if not importlib.util.find_spec(module)]
