"""The LLaMA example's runs (examples.llama.trainer, train.py): train, resume, shard.

Every run here is a shrunken ``tiny`` (1 layer, width 64, 32-token windows)
for a few steps.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import foam_jax
from examples.llama import checkpoints
from examples.llama import data
from examples.llama import tokenizers
from examples.llama import train
from examples.llama import trainer
from examples.llama.train_config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
SMALL = {"num_layers": 1, "hidden_size": 64, "intermediate_size": 176, "num_heads": 4}
RUN = dict(seq_len=32, batch_size=8, eval_batches=2, log_every=5, progress=False)
LAST_LINE = re.compile(r"^final val_loss (\d+\.\d+)$")


def small_config(tmp_path, name, **kw) -> TrainConfig:
  args = dict(RUN, model_overrides=dict(SMALL), out=str(tmp_path / name))
  args.update(kw)
  return TrainConfig(**args)


def params_of(summary):
  model, _ = nnx.merge(summary["graphdef"], summary["state"])
  return jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


@pytest.fixture(scope="module")
def foam_run(tmp_path_factory):
  """One single-device FOAM run shared by the tests that compare to it."""
  tmp = tmp_path_factory.mktemp("foam")
  cfg = small_config(tmp, "run", optimizer="foam", steps=24, eval_every=12)
  return cfg, trainer.train(cfg)


def test_foam_run_learns_and_writes_outputs(foam_run):
  cfg, summary = foam_run
  assert math.isfinite(summary["final_val_loss"])
  assert summary["initial_val_loss"] > 5.0  # ~ln(256) at init
  assert summary["final_val_loss"] < summary["initial_val_loss"] - 1.0
  out = cfg.out
  records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
  assert [r["step"] for r in records] == [0, 12, 24]
  assert [r["tokens"] for r in records] == [0, 12 * 8 * 32, 24 * 8 * 32]
  assert records[-1]["val_loss"] == pytest.approx(summary["final_val_loss"])
  assert {"train_loss", "val_loss", "wall_time"} <= set(records[-1])
  assert os.path.getsize(os.path.join(out, "loss.png")) > 1000
  saved = json.load(open(os.path.join(out, "config.json")))
  assert saved["model"]["num_layers"] == 1 and saved["train"]["optimizer"] == "foam"
  # Folded matrices keep a quarter of Adam's moments; embed_tokens, lm_head
  # and the norms keep Adam's (hand count for V=256, D=64, F=176, 1 layer).
  v, d, f = 256, 64, 176
  adam_only = 2 * v * d + 3 * d
  matrices = 4 * d * d + 3 * d * f
  expected = (adam_only + matrices / 4) / (adam_only + matrices)
  assert summary["state_ratio"] == pytest.approx(expected, rel=1e-3)
  assert summary["tokens_per_s"] > 0


def test_adamw_run_from_the_command_line(tmp_path, capsys):
  argv = ["--optimizer", "adamw", "--steps", "24", "--eval-every", "12",
          "--seq-len", "32", "--batch-size", "8", "--eval-batches", "2",
          "--num-layers", "1", "--hidden-size", "64", "--intermediate-size",
          "176", "--no-progress", "--sample", "8", "--out", str(tmp_path / "a")]
  summary = train.main(argv)
  lines = capsys.readouterr().out.strip().splitlines()
  match = LAST_LINE.match(lines[-1])
  assert match, lines[-1]
  assert float(match.group(1)) == pytest.approx(summary["final_val_loss"], abs=1e-6)
  assert summary["final_val_loss"] < summary["initial_val_loss"] - 1.0
  assert summary["state_ratio"] == pytest.approx(1.0, rel=1e-3)  # AdamW itself
  assert len(summary["sample"].encode("utf-8", "surrogateescape")) >= 1


def test_resume_reaches_the_uninterrupted_result(tmp_path, capsys):
  full = trainer.train(small_config(tmp_path, "full", steps=8, checkpoint_every=4, eval_every=4))
  cfg = small_config(tmp_path, "killed", steps=8, checkpoint_every=4, eval_every=4)
  trainer.train(cfg)
  # The run "dies" after its step-4 checkpoint: drop the later checkpoint.
  shutil.rmtree(os.path.join(cfg.out, "checkpoints", "8"))
  capsys.readouterr()
  resumed = trainer.train(small_config(tmp_path, "killed", steps=8, checkpoint_every=4,
                                     eval_every=4, resume=True))
  assert "at step 4" in capsys.readouterr().out
  assert resumed["final_val_loss"] == pytest.approx(full["final_val_loss"], abs=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               params_of(full), params_of(resumed))
  a = [json.loads(l) for l in open(os.path.join(tmp_path / "full", "metrics.jsonl"))]
  b = [json.loads(l) for l in open(os.path.join(cfg.out, "metrics.jsonl"))]
  assert [r["step"] for r in b] == [0, 4, 8]
  for ra, rb in zip(a, b):
    assert rb["val_loss"] == pytest.approx(ra["val_loss"], abs=1e-6)
    assert rb["tokens"] == ra["tokens"]


def test_mesh_fsdp2_tp4_on_8_devices(tmp_path, foam_run):
  assert jax.device_count() >= 8, "tests/conftest.py simulates 8 CPU devices"
  _, single = foam_run
  cfg = small_config(tmp_path, "mesh", optimizer="foam", steps=24, eval_every=12,
                     mesh="fsdp=2,tp=4")
  summary = trainer.train(cfg)
  model, optimizer = nnx.merge(summary["graphdef"], summary["state"])
  q = model.layers[0].self_attn.q_proj.kernel[...]
  assert q.sharding.spec == P("fsdp", "tp") and len(q.sharding.device_set) == 8
  down = model.layers[0].mlp.down_proj.kernel[...]
  assert down.sharding.spec == P("tp", "fsdp")
  mu = optimizer.opt_state[0].mu["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
  assert mu.shape == (64 // 4, 64)  # folded 4x along the input axis
  assert mu.sharding.spec == P("fsdp", "tp")  # sharded like its weight
  # Same seed, same math: sharding changes nothing but rounding.
  assert summary["final_val_loss"] == pytest.approx(single["final_val_loss"], abs=2e-3)


def test_data_file_run(tmp_path, capsys):
  text = "The quick brown fox jumps over the lazy dog. " * 200
  path = tmp_path / "corpus.txt"
  path.write_text(text, encoding="utf-8")
  summary = train.main([
      "--data", str(path), "--steps", "6", "--eval-every", "3", "--seq-len", "32",
      "--batch-size", "8", "--eval-batches", "1", "--num-layers", "1",
      "--hidden-size", "64", "--intermediate-size", "176", "--no-progress",
      "--sample", "0", "--out", str(tmp_path / "f")])
  assert LAST_LINE.match(capsys.readouterr().out.strip().splitlines()[-1])
  saved = json.load(open(tmp_path / "f" / "config.json"))
  assert saved["corpus_tokens"] == len(text.encode("utf-8"))
  assert summary["final_val_loss"] < summary["initial_val_loss"]


def test_sentencepiece_tokenizer_run(tmp_path, capsys):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  text = data.default_corpus()[:200_000]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(text, encoding="utf-8")
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=300,
      model_type="unigram", minloglevel=2)
  tokenizer = tokenizers.load_tokenizer(str(tmp_path / "sp.model"))
  assert tokenizer.vocab_size == 300
  ids = tokenizer.encode("The assignment statement")
  assert tokenizer.decode(ids) == "The assignment statement"
  summary = train.main([
      "--data", str(corpus), "--tokenizer", str(tmp_path / "sp.model"),
      "--steps", "6", "--eval-every", "3", "--seq-len", "32", "--batch-size", "8",
      "--eval-batches", "1", "--num-layers", "1", "--hidden-size", "64",
      "--intermediate-size", "176", "--no-progress", "--sample", "0",
      "--out", str(tmp_path / "sp_run")])
  assert LAST_LINE.match(capsys.readouterr().out.strip().splitlines()[-1])
  # The model's vocabulary follows the tokenizer's: initial loss ~ ln(300).
  assert abs(summary["initial_val_loss"] - math.log(300)) < 0.5
  assert summary["final_val_loss"] < summary["initial_val_loss"]


def test_a_checkpoint_written_before_the_refactor_resumes(tmp_path, capsys):
  """tests/fixtures/ckpt_860d33a: written at step 3 of 6 by the old example."""
  out = tmp_path / "old_run"
  shutil.copytree(os.path.join(FIXTURES, "ckpt_860d33a"), out)
  cfg = TrainConfig(
      preset="tiny", optimizer="foam", steps=6, batch_size=4, seq_len=16, eval_every=3,
      eval_batches=2, checkpoint_every=3, log_every=1, progress=False,
      model_overrides=dict(num_layers=1, hidden_size=32, intermediate_size=96, num_heads=2),
      data=os.path.join(FIXTURES, "corpus.txt"), out=str(out), resume=True)
  summary = trainer.train(cfg)
  printed = capsys.readouterr().out
  assert "at step 3" in printed and "settings differ" not in printed
  assert summary["final_val_loss"] == pytest.approx(4.806040763854980, rel=1e-5)
  records = [json.loads(line) for line in open(out / "metrics.jsonl")]
  assert [r["step"] for r in records] == [0, 3, 6]


def test_a_checkpoint_of_another_optimizer_fails_with_one_clear_line(tmp_path):
  out = tmp_path / "old_run"
  shutil.copytree(os.path.join(FIXTURES, "ckpt_860d33a"), out)
  proc = subprocess.run(
      [sys.executable, "-m", "examples.llama.train", "--resume",
       "--out", str(out), "--optimizer", "adamw", "--steps", "6", "--batch-size", "4",
       "--seq-len", "16", "--eval-every", "3", "--eval-batches", "2", "--num-layers", "1",
       "--hidden-size", "32", "--intermediate-size", "96", "--num-heads", "2",
       "--data", os.path.join(FIXTURES, "corpus.txt"), "--no-progress", "--sample", "0"],
      capture_output=True, text=True, timeout=300, cwd=tmp_path,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 2, proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert "error: Checkpoint 3 in" in last and "does not fit" in last, proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "steps must be a positive int"),
    (["--optimizer", "sgd"], "invalid choice"),
    (["--num-heads", "3"], "divisible by num_heads"),
    (["--mesh", "fsdp=2,dp=2"], "--mesh"),
    (["--data", "/no/such/file.txt"], "no such file"),
])
def test_bad_flags_end_in_one_error_line(argv, message):
  proc = subprocess.run([sys.executable, "-m", "examples.llama.train",
                         *argv, "--no-progress"], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
  assert proc.returncode == 2, proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("train.py: error: ") and message in last, proc.stderr
  assert "Traceback" not in proc.stderr


def test_the_example_and_the_benchmarks_import_from_the_clone_root():
  """They are not installed (the wheel holds foam_jax only): the clone's root
  on the path, as ``python -m examples.llama.train`` from it puts it there."""
  code = ("import examples.llama.trainer, benchmarks.convergence, benchmarks.memory, "
          "benchmarks.step_time; print(examples.llama.trainer.__file__)")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip().startswith(ROOT)


def test_no_module_edits_sys_path():
  for folder in ("examples", "benchmarks", "tests"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
      for name in files:
        if name.endswith(".py"):
          text = open(os.path.join(dirpath, name), encoding="utf-8").read()
          for edit in ("insert", "append"):
            assert "sys.path." + edit + "(" not in text, name


def test_an_int8_checkpoint_of_foam_jax_0_2_is_refused_with_what_to_do(tmp_path):
  """tests/fixtures/ckpt_int8_v02: int8 moments in 0.2's layout, at step 3."""
  out = tmp_path / "old_int8_run"
  shutil.copytree(os.path.join(FIXTURES, "ckpt_int8_v02"), out)
  cfg = TrainConfig(
      preset="tiny", optimizer="foam", steps=6, batch_size=4, seq_len=16, eval_every=3,
      eval_batches=2, checkpoint_every=3, progress=False, mu_dtype="int8",
      nu_dtype="int8",
      model_overrides=dict(num_layers=1, hidden_size=32, intermediate_size=96, num_heads=2),
      data=os.path.join(FIXTURES, "corpus.txt"), out=str(out), resume=True)
  with pytest.raises(checkpoints.RestoreError,
                     match=r"Checkpoint 3 in .* foam_jax 0.2's layout.*--mu-dtype float32"):
    trainer.train(cfg)
  # The library refuses the same tree, read back without a target.
  mngr = checkpoints.manager(str(out / "checkpoints"))
  raw = mngr.restore(3, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
  opt = raw["1"]["opt_state"]["0"]
  assert set(opt["mu"]["lm_head"]["kernel"]) == {"codes", "scales"}
  params = jax.tree.map(jnp.asarray, raw["0"])
  tx = foam_jax.scale_by_foam(mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  state = tx.init(params)._replace(mu=opt["mu"], nu=opt["nu"])
  with pytest.raises(ValueError, match=r"foam_jax 0.2 .*convert_state"):
    tx.update(params, state, params)
  with pytest.raises(ValueError, match=r"foam_jax 0.2"):
    foam_jax.convert_state(state, foam_jax.scale_by_foam(), params)
