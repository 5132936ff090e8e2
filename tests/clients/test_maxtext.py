"""MaxText (PyPI ``maxtext[tpu]==0.2.5``) pre-training with FOAM, as its users run it.

The edits of ``docs/guides/maxtext.md`` are made in the installed release by
``examples/maxtext/foam_edits.py`` (the way the guide tells a user to); then
MaxText's own pre-training loop (``python -m maxtext.trainers.pre_train.train``
with its ``base.yml``) trains a tiny decoder on its synthetic data on 2
simulated CPU devices, FSDP over both (its default ``ici_fsdp_parallelism:
-1``), scanned layers (its default), ``opt_type=foam`` on the command line:
with float moments, and with 8-bit moments saved by MaxText's Orbax
checkpointing and restored by a second run, which continues exactly as an
uninterrupted run does. The saved state shows the layer axis unfolded.

Runs where MaxText is installed (``.ci/run``'s MaxText step, Python 3.12+);
elsewhere it is not collected (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import jax
import orbax.checkpoint as ocp
import pytest

from examples.maxtext import foam_edits

LAYERS, EMBED, MLP = 2, 64, 128
TINY = [f"base_emb_dim={EMBED}", "base_num_query_heads=2", "base_num_kv_heads=2",
        f"base_mlp_dim={MLP}", f"base_num_decoder_layers={LAYERS}", "head_dim=32",
        "vocab_size=256", "max_target_length=32", "per_device_batch_size=1", "dtype=float32"]
# On CPU, as MaxText's docs run it locally: no distributed runtime to join.
CPU = ["hardware=cpu", "skip_jax_distributed_system=true", "dataset_type=synthetic"]


@pytest.fixture(scope="module")
def maxtext_root():
  root = foam_edits.installed_root()
  foam_edits.apply(root)
  assert all(foam_edits.status(root))
  return root


def _train(root, out, run_name, steps, *settings):
  """MaxText's pre-training loop; returns ``{step: loss}`` from its log."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  args = [sys.executable, "-m", "maxtext.trainers.pre_train.train",
          os.path.join(root, "configs", "base.yml"), f"run_name={run_name}",
          f"base_output_directory={out}", f"steps={steps}", *CPU, *TINY, *settings]
  done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
  log = done.stdout + done.stderr
  assert done.returncode == 0, log[-4000:]
  losses = {int(m[1]): float(m[2])
            for m in re.finditer(r"completed step: (\d+), .*?, loss: ([0-9.]+)", log)}
  assert losses, log[-4000:]
  return losses, log


def _saved_moment_shapes(path):
  """The first moment's saved shapes (int8: its codes), by parameter path."""
  tree = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
  shapes = {}

  def visit(key_path, leaf):
    keys = [getattr(k, "key", getattr(k, "idx", None)) for k in key_path]
    if keys[0] == "opt_state" and "mu" in keys and "scales" not in keys:
      shapes[".".join(str(k) for k in keys[keys.index("params") + 1:] if k != "codes")] = (
          tuple(leaf.shape))

  jax.tree_util.tree_map_with_path(visit, tree)
  return shapes


def test_the_edits_go_in_once_at_their_anchors(maxtext_root, tmp_path):
  copy = tmp_path / "maxtext"
  for edit in foam_edits.EDITS:
    (copy / edit.path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(os.path.join(maxtext_root, edit.path), copy / edit.path)
  assert foam_edits.apply(str(copy)) == 0  # Already in.
  for edit in foam_edits.EDITS:  # Taken out again: the release's own text.
    path = copy / edit.path
    path.write_text(path.read_text().replace(edit.edited, edit.anchor))
  assert not any(foam_edits.status(str(copy)))
  assert foam_edits.apply(str(copy)) == len(foam_edits.EDITS)
  assert foam_edits.apply(str(copy)) == 0
  moved = copy / foam_edits.EDITS[-1].path
  moved.write_text(moved.read_text().replace(foam_edits.EDITS[-1].edited, ""))
  with pytest.raises(ValueError, match="exactly once"):
    foam_edits.status(str(copy))


def test_foam_pretrains_with_fsdp_and_scanned_layers(maxtext_root, tmp_path):
  losses, log = _train(maxtext_root, tmp_path, "foam", 8, "opt_type=foam",
                       "checkpoint_period=7", "async_checkpointing=false")
  assert "Num_devices: 2" in log
  assert losses[7] < losses[0] - 0.05, losses
  shapes = _saved_moment_shapes(str(tmp_path / "foam" / "checkpoints" / "7" / "items"))
  # Scanned kernels (embed, layers, mlp): embed folded 4x, the layer axis kept.
  assert shapes["decoder.layers.mlp.wi_0.kernel"] == (EMBED // 4, LAYERS, MLP)
  assert shapes["decoder.layers.mlp.wo.kernel"] == (MLP // 4, LAYERS, EMBED)
  # Stacked norm scales (norm, layers), the embedding and the head: Adam's moments.
  assert shapes["decoder.layers.pre_self_attention_layer_norm.scale"] == (EMBED, LAYERS)
  assert shapes["token_embedder.embedding"] == (256, EMBED)


def test_int8_moments_restore_from_maxtext_checkpoints(maxtext_root, tmp_path):
  # One schedule for all three runs (by default its length is the run's steps).
  int8 = ["opt_type=foam", "mu_dtype=int8", "foam_nu_dtype=int8", "async_checkpointing=false",
          "learning_rate_schedule_steps=6"]
  straight, _ = _train(maxtext_root, tmp_path / "a", "int8", 6, *int8,
                       "enable_checkpointing=false")
  first, _ = _train(maxtext_root, tmp_path / "b", "int8", 4, *int8, "checkpoint_period=3")
  shapes = _saved_moment_shapes(str(tmp_path / "b" / "int8" / "checkpoints" / "3" / "items"))
  assert shapes["decoder.layers.mlp.wi_0.kernel"] == (EMBED // 4, LAYERS, MLP)
  resumed, log = _train(maxtext_root, tmp_path / "b", "int8", 6, *int8, "checkpoint_period=3")
  assert "restoring from this run's directory step 3" in log
  assert sorted(resumed) == [4, 5]
  for step in range(6):  # The restored run continues as the uninterrupted one.
    assert (first | resumed)[step] == pytest.approx(straight[step], abs=1e-3), step
  shutil.rmtree(tmp_path, ignore_errors=True)
