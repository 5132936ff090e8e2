"""The example's optimizer families (examples.llama.optimizers)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from examples.llama import configs
from examples.llama import data
from examples.llama import optimizers
from examples.llama import sharding
from examples.llama import state
from examples.llama import steps

SMALL = {"num_layers": 1, "hidden_size": 64, "intermediate_size": 176, "num_heads": 4}
# Every family, and FOAM with its fold settings.
ONE_EACH = [(name, {}) for name in optimizers.OPTIMIZERS] + [
    ("foam", {"fold_level": 3, "fold_axis": -1}), ("foam_mini", {"fold_axis": -1})]
IDS = [name + "".join(f"-{k}={v}" for k, v in s.items()) for name, s in ONE_EACH]


@pytest.mark.parametrize("name,settings", ONE_EACH, ids=IDS)
def test_every_optimizer_takes_steps(name, settings):
  cfg = configs.get_config("tiny", **SMALL)
  mesh = sharding.make_mesh({"fsdp": 1, "tp": 1})
  tx = optimizers.make_optimizer(name, None, total_steps=10, clip=1.0, hidden_size=64,
                                 **settings)
  graphdef, st, shardings = state.create_state(cfg, tx, mesh)
  step = steps.make_train_step(graphdef, shardings, sharding.batch_sharding(mesh))
  before = jax.device_get(nnx.to_pure_dict(st))
  ds = data.TokenDataset(np.arange(4000) % 256, seq_len=16)
  losses = []
  for i in range(2):
    st, loss = step(st, ds.train_batch(4, 0, i))
    losses.append(float(loss))
  assert all(math.isfinite(l) for l in losses)
  model_before = before[0]
  model_after = jax.device_get(nnx.to_pure_dict(st))[0]
  moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), model_before, model_after)
  assert all(jax.tree.leaves(moved)), f"{name} left some weights untouched"


def test_muon_keeps_adam_for_embeddings_and_lm_head():
  params = {"embed_tokens": {"embedding": np.zeros((256, 8))},
            "lm_head": {"kernel": np.zeros((8, 256))},
            "q_proj": {"kernel": np.zeros((8, 8))}, "norm": {"scale": np.zeros(8)}}
  matrices = optimizers.hidden_matrices(params)
  assert matrices == {"embed_tokens": {"embedding": False}, "lm_head": {"kernel": False},
                      "q_proj": {"kernel": True}, "norm": {"scale": False}}
  for name in ("muon", "galore"):  # Same rule: only q_proj leaves Adam's state.
    tx = optimizers.make_optimizer(name, 1e-3, hidden_size=8)
    shapes = [x.shape for x in jax.tree.leaves(tx.init(params))]
    assert (256, 8) in shapes and (8, 256) in shapes  # Adam moments kept


@pytest.mark.parametrize("name,level", [("foam_muon", 2), ("foam_muon", 4),
                                        ("foam_lion", 2), ("foam_lion", 4)])
def test_folded_muon_and_lion_fold_their_momentum(name, level):
  """Their momentum is the hidden matrices' fold; embeddings keep full size."""
  params = {"embed_tokens": {"embedding": np.zeros((256, 32), np.float32)},
            "q_proj": {"kernel": np.zeros((32, 32), np.float32)}}
  settings = {} if level == 2 else {"fold_level": level}  # 2: the default.
  shapes = [x.shape for x in jax.tree.leaves(
      optimizers.make_optimizer(name, total_steps=10, **settings).init(params))]
  assert (32 // 2**level, 32) in shapes and (32, 32) not in shapes
  assert (256, 32) in shapes




@pytest.mark.parametrize("name,settings", ONE_EACH, ids=IDS)
def test_updates_are_linear_in_the_peak_lr(name, settings):
  """Benchmarks compile one step per optimizer and scale it by the lr."""
  key = jax.random.PRNGKey(0)
  params = {"layer": {"kernel": jax.random.normal(key, (8, 4))},
            "embed_tokens": {"embedding": jnp.ones((5, 8))},
            "norm": {"scale": jnp.ones((4,))}}
  grads = jax.tree.map(lambda p: jnp.cos(3.0 * p) + 0.1, params)

  def updates(lr):
    tx = optimizers.make_optimizer(name, lr, total_steps=10, hidden_size=8, **settings)
    opt_state = tx.init(params)
    for _ in range(3):
      u, opt_state = tx.update(grads, opt_state, params)
    return u

  unit, scaled = updates(1.0), updates(0.037)
  for a, b in zip(jax.tree.leaves(unit), jax.tree.leaves(scaled)):
    np.testing.assert_allclose(np.asarray(b), 0.037 * np.asarray(a), rtol=1e-5, atol=1e-9)


def test_families_with_settings_and_named_errors():
  assert optimizers.OPTIMIZERS == ("adamw", "foam", "foam_mini", "foam_muon", "foam_lion",
                                   "lion", "muon", "adafactor", "galore")
  tx = optimizers.make_optimizer("foam", 1e-3, fold_level=2, fold_axis=-1)
  mu = tx.init({"q_proj": jnp.zeros((16, 8))})[0].mu["q_proj"]
  assert mu.shape == (16, 2)  # folded 4x along the last axis
  with pytest.raises(ValueError, match="Unknown optimizer"):
    optimizers.make_optimizer("adam")
  with pytest.raises(ValueError, match="galore needs hidden_size"):
    optimizers.make_optimizer("galore")
  with pytest.raises(ValueError, match="'adamw' has no fold_level setting"):
    optimizers.make_optimizer("adamw", fold_level=3)
  with pytest.raises(ValueError, match="fold_axis must be one of"):
    optimizers.make_optimizer("foam", fold_axis=0)


def test_fold_flags_reach_the_optimizer_and_are_refused_where_they_do_not_apply(capsys):
  from examples.llama import train_config  # pylint: disable=g-import-not-at-top
  cfg = train_config.parse_args(["--optimizer", "foam", "--fold-level", "3", "--fold-axis", "-1"])
  assert cfg.optimizer_settings() == {"fold_level": 3, "fold_axis": -1}
  tx = optimizers.make_optimizer(cfg.optimizer, None, **cfg.optimizer_settings())
  assert tx.init({"q_proj": jnp.zeros((16, 32))})[0].mu["q_proj"].shape == (16, 4)
  for argv in (["--optimizer", "adamw", "--fold-level", "3"],
               ["--optimizer", "foam_muon", "--fold-axis", "-1"],
               ["--optimizer", "foam", "--fold-axis", "0"]):
    with pytest.raises(SystemExit):
      train_config.parse_args(argv)
  err = capsys.readouterr().err
  assert "--fold-level 3: optimizer 'adamw' has no fold_level setting" in err
  assert "optimizer 'foam_muon' has no fold_axis setting" in err
