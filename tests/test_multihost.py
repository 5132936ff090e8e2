"""A real multi-process run equals a single-process run on as many devices.

Two processes x 4 CPU devices join through ``jax.distributed.initialize`` on
localhost and train ``examples/multihost/train.py`` on one global (2, 4)
mesh; this pytest process (8 CPU devices, see ``conftest.py``) trains the
same model on a single-process (2, 4) mesh. FOAM's own update is
collective-free, so the two can differ only through the model's gradient
all-reduce, whose cross-process summation order may round differently in the
last bit of float32.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "multihost" / "train.py"
STEPS = 3
TIMEOUT_S = 120


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _load_example():
  spec = importlib.util.spec_from_file_location("multihost_train", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_two_processes_match_single_process_eight_devices(tmp_path):
  assert jax.device_count() == 8
  out = tmp_path / "multihost.npz"
  port = _free_port()
  env = dict(
      os.environ,
      XLA_FLAGS="--xla_force_host_platform_device_count=4",
      JAX_PLATFORMS="cpu",
  )
  procs = []
  try:
    for pid in range(2):
      cmd = [
          sys.executable, str(SCRIPT), "--coordinator", f"localhost:{port}",
          "--num-processes", "2", "--process-id", str(pid),
          "--steps", str(STEPS),
      ] + (["--out", str(out)] if pid == 0 else [])
      procs.append(subprocess.Popen(
          cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, text=True, start_new_session=True,
      ))
    # The single-process reference runs while the two processes start up.
    expected = _load_example().run(steps=STEPS)
    deadline = time.monotonic() + TIMEOUT_S
    for proc in procs:
      log, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
      assert proc.returncode == 0, log[-4000:]
    assert "process 1/2: 4 local of 8 devices" in log
  finally:
    for proc in procs:  # Never leave orphans, whatever failed above.
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

  got = dict(np.load(out))
  assert sorted(got) == sorted(expected)
  for key, want in expected.items():
    np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-7, err_msg=key)
  # The run really trained (a broken update would leave params unchanged).
  init = _load_example().init_params(_load_example().make_mesh())
  assert not np.allclose(got["params/w_in"], np.asarray(init["w_in"]))
  # The states stayed folded across processes: w_in (32, 64) -> (8, 64).
  assert got["mu/w_in"].shape == (8, 64) and got["nu/w_out"].shape == (16, 16)
