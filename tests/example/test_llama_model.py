"""The LLaMA example's configs, model and text generation (examples.llama)."""

import math

import jax
import numpy as np
import pytest
from flax import nnx

import foam_jax
from examples.llama import configs
from examples.llama import generate
from examples.llama import model as model_lib
from examples.llama import sharding
from examples.llama import train_config

SMALL = {"num_layers": 1, "hidden_size": 64, "intermediate_size": 176, "num_heads": 4}

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
  leaves = jax.tree.leaves(model_lib.abstract_params(cfg))
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
    train_config.TrainConfig(optimizer="sgd")
  with pytest.raises(ValueError, match="steps"):
    train_config.TrainConfig(steps=0)
  with pytest.raises(ValueError, match="mesh"):
    sharding.parse_mesh("fsdp=2,dp=2", 8)
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.parse_mesh("fsdp=4,tp=4", 8)


def test_abstract_params_are_the_models_shapes_unallocated():
  cfg = configs.get_config("tiny", **SMALL)
  abstract = model_lib.abstract_params(cfg)
  with nnx.use_eager_sharding(False):
    real = nnx.state(model_lib.Llama(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  shapes = lambda t: [(x.shape, x.dtype) for x in jax.tree.leaves(t)]
  assert shapes(abstract) == shapes(real)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))


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
      foam_jax.default_fold_specs(nnx.to_pure_dict(nnx.state(model))),
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
