"""The numerics tests pass on one device too (the main run simulates 8).

Most users train on one device, where XLA compiles the update without any
sharding: the tests marked ``single_device`` (float64 references, Optax
bit-equality, int8 storage) run again here in a subprocess whose JAX has one
CPU device.
"""

import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.single_device
def test_the_run_has_the_device_count_it_asked_for():
  want = int(os.environ.get("FOAM_JAX_TEST_DEVICES", "8"))
  assert jax.device_count() == want


@pytest.mark.skipif(os.environ.get("FOAM_JAX_TEST_DEVICES") == "1",
                    reason="this is the single-device run itself")
def test_numerics_tests_pass_on_one_device():
  env = dict(os.environ, FOAM_JAX_TEST_DEVICES="1")
  env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                            env.get("XLA_FLAGS", "")).strip()
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "-m", "single_device", "-p", "no:cacheprovider",
       "--no-header", "tests/library"],
      cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=600)
  summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
  assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
  assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
