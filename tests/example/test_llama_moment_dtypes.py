"""The example's --mu-dtype / --nu-dtype flags (registry MOMENT_DTYPES)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import foam_jax
from examples.llama import optimizers
from examples.llama import train
from examples.llama import train_config

CHOICES = train_config.MOMENT_DTYPE_CHOICES
PARAMS = {"embed_tokens": {"embedding": jnp.zeros((64, 32))},
          "layers": {"q_proj": {"kernel": jnp.zeros((32, 512))},
                     "norm": {"scale": jnp.zeros(32)}},
          "lm_head": {"kernel": jnp.zeros((32, 64))}}

ACCEPTED = [(name, key, value) for name in optimizers.OPTIMIZERS
            for key, values in optimizers.MOMENT_DTYPES[name].items() for value in values]
REFUSED = [(name, key, value) for name in optimizers.OPTIMIZERS
           for key in ("mu_dtype", "nu_dtype") for value in CHOICES
           if value not in optimizers.MOMENT_DTYPES[name].get(key, ())]


def _moment_leaves(state, field):
  """The leaves under every state node that has a ``field`` (mu or nu) entry;
  an int8 moment tree gives ``(codes, scales)`` pairs."""
  found = []

  def visit(node):
    if isinstance(node, foam_jax.QuantizedMoments):
      return
    if hasattr(node, "_fields") and field in node._fields:
      moments = getattr(node, field)
      if isinstance(moments, foam_jax.QuantizedMoments):
        found.extend(zip(jax.tree.leaves(moments.codes), jax.tree.leaves(moments.scales)))
      else:
        found.extend(jax.tree.leaves(moments))
    if isinstance(node, (tuple, list)):
      for child in node:
        visit(child)
    elif isinstance(node, dict):
      for child in node.values():
        visit(child)

  visit(state)
  return found


def test_the_registry_lists_what_the_issue_asks():
  foam_family = [n for n in optimizers.OPTIMIZERS if n.startswith("foam")]
  for name in foam_family:
    assert optimizers.MOMENT_DTYPES[name]["mu_dtype"] == CHOICES, name
  for name in ("adamw", "lion", "muon"):
    assert optimizers.MOMENT_DTYPES[name] == {"mu_dtype": ("float32", "bfloat16")}
  for name in ("adafactor", "galore"):
    assert optimizers.MOMENT_DTYPES[name] == {}


@pytest.mark.parametrize("name,key,value", ACCEPTED)
def test_an_accepted_flag_builds_moments_of_that_dtype(name, key, value):
  flag = "--" + key.replace("_", "-")
  cfg = train_config.parse_args(["--optimizer", name, flag, value])
  assert cfg.moment_dtypes() == {key: value}
  tx = optimizers.make_optimizer(name, None, hidden_size=32, **cfg.moment_dtypes())
  # Params in the other float dtype, so the default would not pass by chance.
  params = jax.tree.map(
      lambda p: p.astype(jnp.bfloat16 if value == "float32" else jnp.float32), PARAMS)
  leaves = _moment_leaves(jax.eval_shape(tx.init, params), key[:2])
  assert leaves, f"{name}: no {key[:2]} in its state"
  for leaf in leaves:
    if value == "int8":
      assert isinstance(leaf, tuple), (name, key, leaf)
      codes, scales = leaf
      assert codes.dtype == jnp.int8 and scales.dtype == jnp.float32
    else:
      assert leaf.dtype == jnp.dtype(value), (name, key, leaf)


@pytest.mark.parametrize("name,key,value", REFUSED)
def test_a_refused_flag_is_a_parser_error(name, key, value, capsys):
  flag = "--" + key.replace("_", "-")
  with pytest.raises(SystemExit) as exit_info:
    train_config.parse_args(["--optimizer", name, flag, value])
  assert exit_info.value.code == 2
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert "error: " in last and flag in last and repr(name) in last, last
  with pytest.raises(ValueError, match=key):
    optimizers.make_optimizer(name, None, hidden_size=32, **{key: value})


def test_the_summary_names_the_moment_storage(monkeypatch, tmp_path, capsys):
  class Stub:  # The summary line alone: no training.

    def __init__(self, cfg):
      del cfg

    def run(self):
      return {"initial_val_loss": 5.0, "final_val_loss": 2.0, "final_val_ppl": 7.4,
              "wall_time_s": 1.0, "tokens_per_s": 1.0, "state_bytes": 1,
              "adamw_state_bytes": 4, "state_ratio": 0.25, "out": str(tmp_path)}

  monkeypatch.setattr(train.trainer, "Trainer", Stub)
  train.main(["--mu-dtype", "int8", "--nu-dtype", "bfloat16", "--sample", "0"])
  assert "(moments: mu int8, nu bfloat16)" in capsys.readouterr().out
  assert train_config.parse_args(["--optimizer", "lion"]).moment_dtypes_label() == (
      "mu float32 (params')")
  assert train_config.parse_args(["--optimizer", "adafactor"]).moment_dtypes_label() == ""


class _Mlp(nnx.Module):

  def __init__(self, rngs):
    self.up = nnx.Linear(32, 512, rngs=rngs)
    self.down = nnx.Linear(512, 8, rngs=rngs)

  def __call__(self, x):
    return self.down(jax.nn.relu(self.up(x)))


def _steps(tx, apply, n=3):
  model = _Mlp(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x = jnp.linspace(-1.0, 1.0, 4 * 32).reshape(4, 32)

  @nnx.jit
  def step(model, optimizer):
    apply(optimizer, model, nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model))

  for _ in range(n):
    step(model, optimizer)
  return model, optimizer


def test_the_stock_nnx_optimizer_keeps_int8_moments_over_many_updates():
  for tx in (foam_jax.foam(1e-2, mu_dtype="int8", nu_dtype="int8"),
             foam_jax.foam_muon(1e-2, mu_dtype="int8"),
             foam_jax.foam_lion(1e-3, mu_dtype="int8")):
    model, optimizer = _steps(tx, lambda o, m, g: o.update(m, g), n=4)
    assert int(optimizer.step[...]) == 4
    leaves = jax.tree.leaves(nnx.as_pure(nnx.state(optimizer)))
    assert all(isinstance(x, jax.Array) for x in leaves)
    assert any(x.dtype == jnp.int8 for x in leaves)
    assert all(np.isfinite(np.asarray(x, np.float64)).all()
               for x in jax.tree.leaves(nnx.as_pure(nnx.state(model))))
