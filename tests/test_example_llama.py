"""The Flax NNX LLaMA example (examples/llama): it trains, resumes, shards.

Every run here is a shrunken ``tiny`` (1 layer, width 64, 32-token windows)
for a few steps, so the file takes well under a minute or two on 2 cores.
"""

import builtins
import doctest
import json
import math
import os
import re
import shutil
import socket
import sys

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

EXAMPLE_DIR = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "llama")
sys.path.insert(0, os.path.abspath(EXAMPLE_DIR))

# pylint: disable=g-import-not-at-top,wrong-import-position
import configs
import data
import generate
import model as model_lib
import optimizers
import sharding
import train
# pylint: enable=g-import-not-at-top,wrong-import-position

SMALL = {"num_layers": 1, "hidden_size": 64, "intermediate_size": 176, "num_heads": 4}
RUN = dict(seq_len=32, batch_size=8, eval_batches=2, log_every=5, progress=False)
LAST_LINE = re.compile(r"^final val_loss (\d+\.\d+)$")


def small_config(tmp_path, name, **kw) -> train.TrainConfig:
  args = dict(RUN, model_overrides=dict(SMALL), out=str(tmp_path / name))
  args.update(kw)
  return train.TrainConfig(**args)


def params_of(summary):
  model, _ = nnx.merge(summary["graphdef"], summary["state"])
  return jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


@pytest.fixture(scope="module")
def foam_run(tmp_path_factory):
  """One single-device FOAM run shared by the tests that compare to it."""
  tmp = tmp_path_factory.mktemp("foam")
  cfg = small_config(tmp, "run", optimizer="foam", steps=24, eval_every=12)
  return cfg, train.train(cfg)


# --- Doctests of the example's modules (pytest only collects foam_jax/'s). ---


@pytest.mark.parametrize(
    "module", [configs, data, model_lib, optimizers, sharding, train],
    ids=lambda m: m.__name__,
)
def test_doctests_pass(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0
  assert result.failed == 0


# --- Configs. ---


def test_paper_presets_match_the_paper_table():
  table = {  # hidden, intermediate, layers, heads (foam-algorithm.md)
      "20m": (256, 688, 4, 4), "60m": (512, 1376, 8, 8),
      "130m": (768, 2048, 12, 12), "350m": (1024, 2736, 24, 16),
      "1b": (2048, 5461, 24, 32), "3b": (2560, 6848, 32, 32),
      "7b": (4096, 11008, 32, 32),
  }
  for name, dims in table.items():
    cfg = configs.PRESETS[name]
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads) == dims
    assert cfg.vocab_size == 32000 and cfg.rms_eps == 1e-6
  assert configs.PRESETS["tiny"].vocab_size == 256


@pytest.mark.parametrize("name,overrides", [
    ("20m", {}), ("tiny", {"num_kv_heads": 2}),
])
def test_num_params_counts_the_models_weights(name, overrides):
  cfg = configs.get_config(name, **overrides)
  with nnx.use_eager_sharding(False):
    abstract = nnx.eval_shape(lambda: model_lib.Llama(cfg, rngs=nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
  assert sum(math.prod(x.shape) for x in leaves) == cfg.num_params()


def test_config_errors_name_the_argument():
  with pytest.raises(ValueError, match="preset"):
    configs.get_config("13b")
  with pytest.raises(ValueError, match="hidden"):
    configs.get_config("tiny", hiden_size=3)
  with pytest.raises(ValueError, match="num_heads"):
    configs.get_config("tiny", num_heads=3)
  with pytest.raises(ValueError, match="dtype"):
    configs.get_config("tiny", dtype="float33")
  with pytest.raises(ValueError, match="optimizer"):
    train.TrainConfig(optimizer="sgd")
  with pytest.raises(ValueError, match="steps"):
    train.TrainConfig(steps=0)
  with pytest.raises(ValueError, match="Unknown optimizer"):
    optimizers.make_optimizer("adam", None, 10)
  with pytest.raises(ValueError, match="mesh"):
    sharding.parse_mesh("fsdp=2,dp=2", 8)
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.parse_mesh("fsdp=4,tp=4", 8)


# --- Model. ---


def test_model_is_causal_and_names_its_weights():
  cfg = configs.get_config("tiny", **SMALL)
  with nnx.use_eager_sharding(False):
    model = model_lib.Llama(cfg, rngs=nnx.Rngs(0))
  tokens = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
  changed = tokens.copy()
  changed[:, 9] = (changed[:, 9] + 1) % 256
  a, b = model(tokens), model(changed)
  assert a.dtype == np.float32 and a.shape == (2, 16, 256)
  np.testing.assert_array_equal(a[:, :9], b[:, :9])  # the past ignores the future
  assert np.abs(a[:, 9:] - b[:, 9:]).max() > 1e-6  # and the future sees the past
  paths = {jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model)))[0]}
  for name in ("embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj",
               "gate_proj", "up_proj", "down_proj", "['norm']", "lm_head"):
    assert any(name in p for p in paths), name
  # FOAM's default policy: embed_tokens and lm_head keep Adam's moments.
  specs = jax.tree_util.tree_flatten_with_path(
      __import__("foam_jax").default_fold_specs(nnx.to_pure_dict(nnx.state(model))),
      is_leaf=lambda x: x is None)[0]
  unfolded = {jax.tree_util.keystr(p) for p, s in specs if s is None}
  assert any("embed_tokens" in p for p in unfolded)
  assert any("lm_head" in p for p in unfolded)
  assert not any("q_proj" in p for p in unfolded)


def test_rope_matches_a_float64_reference():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(1, 5, 2, 8)).astype(np.float32)
  pos = np.arange(5)
  half = 4
  freq = 10000.0 ** (-np.arange(half) / half)
  ang = pos[:, None] * freq[None, :]
  x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
  cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
  ref = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  np.testing.assert_allclose(model_lib.rope(x, pos, 10000.0), ref, atol=1e-5)


# --- Data. ---


def test_default_corpus_needs_no_network_and_no_shared(monkeypatch):
  def no_network(*args, **kwargs):
    raise AssertionError("the default corpus must not use the network")

  real_open = builtins.open

  def guarded_open(file, *args, **kwargs):
    assert "shared" not in str(file), f"opened {file}"
    return real_open(file, *args, **kwargs)

  monkeypatch.setattr(socket.socket, "connect", no_network)
  monkeypatch.setattr(builtins, "open", guarded_open)
  text = data.read_corpus()
  assert len(text) > 100_000
  for word in ("assignment", "function", "statement"):
    assert word in text
  tokens = data.ByteTokenizer().encode(text)
  ds = data.TokenDataset(tokens, seq_len=32)
  assert len(ds.train) + len(ds.val) == len(tokens)
  np.testing.assert_array_equal(ds.val, tokens[len(ds.train):])


def test_batches_are_seeded_windows_of_the_training_split():
  tokens = np.arange(5000) % 251
  ds = data.TokenDataset(tokens, seq_len=16, val_fraction=0.1)
  b = ds.train_batch(4, seed=3, step=7)
  np.testing.assert_array_equal(b["inputs"], ds.train_batch(4, 3, 7)["inputs"])
  assert not np.array_equal(b["inputs"], ds.train_batch(4, 3, 8)["inputs"])
  for row_in, row_t in zip(b["inputs"], b["targets"]):
    start = int(np.flatnonzero(ds.train == row_in[0])[0])
    np.testing.assert_array_equal(row_in, ds.train[start:start + 16])
    np.testing.assert_array_equal(row_t, ds.train[start + 1:start + 17])


def test_sentencepiece_missing_gives_install_hint(tmp_path, monkeypatch):
  path = tmp_path / "tok.model"
  path.write_bytes(b"not a real model")
  monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails
  with pytest.raises(ImportError, match="pip install sentencepiece"):
    data.load_tokenizer(str(path))
  with pytest.raises(FileNotFoundError, match="--tokenizer"):
    data.load_tokenizer(str(tmp_path / "missing.model"))


# --- Training. ---


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
  full = train.train(small_config(tmp_path, "full", steps=8, checkpoint_every=4, eval_every=4))
  cfg = small_config(tmp_path, "killed", steps=8, checkpoint_every=4, eval_every=4)
  train.train(cfg)
  # The run "dies" after its step-4 checkpoint: drop the later checkpoint.
  shutil.rmtree(os.path.join(cfg.out, "checkpoints", "8"))
  capsys.readouterr()
  resumed = train.train(small_config(tmp_path, "killed", steps=8, checkpoint_every=4,
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
  summary = train.train(cfg)
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


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
def test_every_optimizer_takes_steps(name):
  cfg = configs.get_config("tiny", **SMALL)
  mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
  tx = optimizers.make_optimizer(name, None, total_steps=10, clip=1.0)
  graphdef, state, shardings = train.create_state(cfg, tx, mesh)
  step = train.make_train_step(graphdef, shardings, sharding.batch_sharding(mesh))
  before = jax.device_get(nnx.to_pure_dict(state))
  ds = data.TokenDataset(np.arange(4000) % 256, seq_len=16)
  losses = []
  for i in range(2):
    state, loss = step(state, ds.train_batch(4, 0, i))
    losses.append(float(loss))
  assert all(math.isfinite(l) for l in losses)
  model_before = before[0]
  model_after = jax.device_get(nnx.to_pure_dict(state))[0]
  moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), model_before, model_after)
  assert all(jax.tree.leaves(moved)), f"{name} left some weights untouched"


def test_muon_keeps_adam_for_embeddings_and_lm_head():
  params = {"embed_tokens": {"embedding": np.zeros((256, 8))},
            "lm_head": {"kernel": np.zeros((8, 256))},
            "q_proj": {"kernel": np.zeros((8, 8))}, "norm": {"scale": np.zeros(8)}}
  dims = optimizers._muon_dims(params)  # pylint: disable=protected-access
  assert dims["embed_tokens"]["embedding"] is None
  assert dims["lm_head"]["kernel"] is None and dims["norm"]["scale"] is None
  assert dims["q_proj"]["kernel"] == optax.contrib.MuonDimensionNumbers(0, 1)


def test_generate_is_greedy_and_deterministic():
  cfg = configs.get_config("tiny", **SMALL)
  with nnx.use_eager_sharding(False):
    model = model_lib.Llama(cfg, rngs=nnx.Rngs(0))
  a = generate.generate(model, [84, 104], 5, window=8)
  b = generate.generate(model, [84, 104], 5, window=8)
  np.testing.assert_array_equal(a, b)
  # Greedy: each token is the argmax of the model's logits after the context.
  ids = [84, 104] + a.tolist()
  tokens = np.zeros((1, 8), np.int32)
  tokens[0, :6] = ids[:6]
  assert int(np.argmax(model(tokens)[0, 5])) == ids[6]


def test_sentencepiece_tokenizer_run(tmp_path, capsys):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  text = data.default_corpus()[:200_000]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(text, encoding="utf-8")
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=300,
      model_type="unigram", minloglevel=2)
  tokenizer = data.load_tokenizer(str(tmp_path / "sp.model"))
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
