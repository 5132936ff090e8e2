"""train.py --dataset: the Grain stream, and the single-host recipe surviving kill -9.

The recipe at toy scale: a C4-style ``.json.gz`` shard, a SentencePiece
model trained here, ``prepare_data.py``, then ``train.py --preset 60m
--dataset`` (shrunk by model flags).
"""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import llama_corpora
import numpy as np
import pytest

from examples.llama import datasets
from examples.llama import loader
from examples.llama import prepare_data
from examples.llama import train

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOY_60M = ["--preset", "60m", "--vocab-size", "320", "--num-layers", "1", "--hidden-size", "64",
           "--intermediate-size", "176", "--num-heads", "4", "--seq-len", "32",
           "--batch-size", "8", "--eval-batches", "2", "--sample", "0", "--no-progress"]


@pytest.fixture(scope="module")
def sp_dataset(tmp_path_factory):
  """A SentencePiece dataset of 400 C4-style documents."""
  folder = tmp_path_factory.mktemp("sp_dataset")
  model = llama_corpora.train_sentencepiece(folder)
  shard = llama_corpora.write_jsonl_gz(folder / "c4-train.00000-of-01024.json.gz",
                                       llama_corpora.documents(400))
  prepare_data.main([str(shard), "--out", str(folder / "ds"), "--tokenizer", model,
                     "--workers", "1", "--no-progress"])
  return folder / "ds"


def test_the_batch_of_a_step_is_a_pure_function_of_seed_and_step(sp_dataset):
  prepared = datasets.PreparedDataset(str(sp_dataset))
  make = lambda seed: loader.WindowBatches(prepared, seq_len=32, batch_size=8, seed=seed)
  a, b = make(0), make(0)
  np.testing.assert_array_equal(a.rows(7, 0, 8)["inputs"], b.rows(7, 0, 8)["inputs"])
  assert not np.array_equal(a.rows(7, 0, 8)["inputs"], make(1).rows(7, 0, 8)["inputs"])
  assert not np.array_equal(a.rows(7, 0, 8)["inputs"], a.rows(8, 0, 8)["inputs"])
  # Processes' slices make up the global batch.
  halves = np.concatenate([a.rows(7, 0, 4)["targets"], a.rows(7, 4, 8)["targets"]])
  np.testing.assert_array_equal(halves, a.rows(7, 0, 8)["targets"])
  # Within an epoch no window comes twice (Grain's shuffle is a permutation).
  windows = datasets.TokenWindows(prepared.splits["train"], 32)
  steps = len(windows) // 8
  assert steps >= 10
  seen = np.concatenate([a.rows(s, 0, 8)["inputs"] for s in range(steps)])
  every = collections.Counter(windows[i][:-1].tobytes() for i in range(len(windows)))
  seen = collections.Counter(r.tobytes() for r in seen)
  assert all(every[k] >= n for k, n in seen.items())  # (Some documents repeat.)
  # The iterator's state (what the checkpoint keeps) continues the exact stream.
  it = loader.train_iterator(a, 0, 8)
  for _ in range(3):
    next(it)
  state = it.get_state()
  assert state == {"next_index": 3}
  np.testing.assert_array_equal(next(loader.train_iterator(b, 0, 8, state=state))["inputs"],
                                next(it)["inputs"])


def _train_py(flags, devices, **popen):
  """``python -m examples.llama.train FLAGS`` in a new process (session) on
  ``devices`` CPU devices."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return subprocess.Popen([sys.executable, "-m", "examples.llama.train",
                           *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen)


def _kill(procs):
  for proc in procs:  # Never leave orphans, whatever failed.
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def recipe(sp_dataset, tmp_path_factory):
  """The recipe's flags, and its uninterrupted run: 1 process x 8 devices, fsdp=2,tp=4."""
  flags = ["--dataset", str(sp_dataset), *TOY_60M, "--mesh", "fsdp=2,tp=4", "--steps", "6",
           "--eval-every", "6", "--checkpoint-every", "2"]
  out = tmp_path_factory.mktemp("whole")
  return flags, train.main([*flags, "--out", str(out)])


def test_single_host_recipe_killed_with_sigkill_resumes_to_the_same_loss(recipe, tmp_path):
  flags, whole = recipe
  killed = tmp_path / "killed"
  proc = _train_py([*flags, "--out", str(killed)], devices=8)
  try:
    deadline = time.monotonic() + 180
    ckpts = killed / "checkpoints"
    while time.monotonic() < deadline and proc.poll() is None:
      if ckpts.is_dir() and any(n.isdigit() and int(n) >= 2 for n in os.listdir(ckpts)):
        break
      time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)  # Mid-step or mid-checkpoint: any moment.
    proc.wait()
  finally:
    _kill([proc])
  resumed = train.main([*flags, "--out", str(killed), "--resume"])
  assert resumed["final_val_loss"] == pytest.approx(whole["final_val_loss"], rel=1e-6)
  assert resumed["final_val_loss"] < resumed["initial_val_loss"]
  assert np.isclose(resumed["initial_val_loss"], np.log(320), atol=0.5)


def test_pod_recipe_two_processes_reach_the_loss_of_one_process(recipe, tmp_path):
  """2 processes x 4 devices on localhost = 1 process x 8 devices, mesh fsdp=2,tp=4."""
  flags, whole = recipe
  port, out = _free_port(), tmp_path / "pod"
  procs = []
  try:
    procs = [_train_py([*flags, "--out", str(out), "--coordinator", f"localhost:{port}",
                        "--num-processes", "2", "--process-id", str(i)], devices=4)
             for i in range(2)]
    logs = [proc.communicate(timeout=240)[0] for proc in procs]
  finally:
    _kill(procs)
  for proc, log in zip(procs, logs):
    assert proc.returncode == 0, log[-3000:]
  final = float(logs[0].strip().splitlines()[-1].split()[-1])
  assert final == pytest.approx(whole["final_val_loss"], rel=1e-4)
  assert "on 2 process(es)" in logs[0] and "final val_loss" not in logs[1]  # Process 0 reports.
  assert sorted(os.listdir(out / "checkpoints"))[-1] == "6"  # Written by both, collectively.
  assert (out / "metrics.jsonl").read_text().count("\n") == 2  # Steps 0 and 6, written once.
