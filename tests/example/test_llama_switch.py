"""``--resume --optimizer foam`` on an AdamW checkpoint (examples.llama.switch).

One shrunken ``tiny`` AdamW run of 30 steps checkpoints at step 15; copies of
it resume as FOAM from there: moments converted, moments zeroed, on a mesh,
and switches ``convert_state`` refuses.
"""

import doctest
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import foam_jax
from examples.llama import checkpoints
from examples.llama import model as model_lib
from examples.llama import optimizers as optimizers_lib
from examples.llama import sharding as sharding_lib
from examples.llama import state as state_lib
from examples.llama import switch
from examples.llama import trainer
from examples.llama.train_config import TrainConfig

SMALL = {"num_layers": 1, "hidden_size": 64, "intermediate_size": 176, "num_heads": 4}
# One lr and schedule for both optimizers; checkpoints at 15 and 30.
RUN = dict(seq_len=32, batch_size=8, eval_batches=2, log_every=5, progress=False,
           lr=3e-3, steps=30, checkpoint_every=15, eval_every=5, seed=0)
SWITCH = 15


def config(out, **kw) -> TrainConfig:
  return TrainConfig(**{**RUN, "model_overrides": dict(SMALL), "out": str(out), **kw})


def val_losses(out) -> dict[int, float]:
  return {r["step"]: r["val_loss"]
          for r in map(json.loads, open(os.path.join(out, "metrics.jsonl")))}


@pytest.fixture(scope="module")
def adamw_run(tmp_path_factory):
  """AdamW for 30 steps; its step-15 checkpoint is where every switch starts."""
  out = tmp_path_factory.mktemp("adamw") / "run"
  trainer.train(config(out, optimizer="adamw"))
  return out


def killed_at_switch(adamw_run, dest):
  """A copy of the AdamW run as if it died after its step-15 checkpoint."""
  shutil.copytree(adamw_run, dest)
  shutil.rmtree(os.path.join(dest, "checkpoints", str(RUN["steps"])))
  return dest


def resumed(cfg, zero_moments=False):
  """A Trainer resumed from its checkpoint (not yet trained on)."""
  run = trainer.Trainer(cfg)
  run.zero_moments_on_switch = zero_moments
  run.create_state()
  run.resume()
  return run


def train_on(run):
  run.write_config()
  run.loop()
  return run.summarise()


def opt_state_of(run):
  _, optimizer = nnx.merge(run.graphdef, run.state)
  return optimizer, nnx.as_pure(optimizer.opt_state)


def test_adamw_to_foam_carries_every_count_and_trains_on(adamw_run, tmp_path, capsys):
  out = killed_at_switch(adamw_run, tmp_path / "converted")
  capsys.readouterr()
  run = resumed(config(out, optimizer="foam", resume=True))
  printed = capsys.readouterr().out
  assert ("switched the optimizer from adamw to foam at step 15 "
          "(foam_jax.convert_state): moments mu, nu: block means for 7 folded weights, "
          "copies for 5 others") in printed  # 7 matrices; embeddings, head, 3 norms
  assert "2 step counts carried ([15])" in printed
  optimizer, opt_state = opt_state_of(run)
  fresh = run.tx.init(nnx.as_pure(nnx.state(nnx.merge(run.graphdef, run.state)[0],
                                            nnx.Param)))
  # Every count of FOAM's chain (its moments' and the lr schedule's) is 15,
  # and so is nnx.Optimizer's own step.
  counts = switch.step_counts(opt_state)
  assert counts == {k: SWITCH for k in switch.step_counts(fresh)}
  assert set(counts) == {"[0].count", "[2].count"}  # scale_by_foam, the schedule
  assert int(optimizer.step[...]) == SWITCH
  # The moments are folded (FOAM's shapes) and hold AdamW's statistics.
  q_mu = opt_state[0].mu["layers"][0]["self_attn"]["q_proj"]["kernel"]
  assert q_mu.shape == (64 // 4, 64) and float(np.abs(q_mu).max()) > 0
  assert jax.tree.structure(opt_state) == jax.tree.structure(fresh)

  # The restored weights are AdamW's at step 15 (evaluated again, not read back).
  assert run.evaluate() == pytest.approx(val_losses(adamw_run)[SWITCH], abs=1e-6)
  train_on(run)
  converted = val_losses(out)
  zero_run = resumed(config(killed_at_switch(adamw_run, tmp_path / "zeroed"),
                            optimizer="foam", resume=True), zero_moments=True)
  assert switch.step_counts(opt_state_of(zero_run)[1]) == counts
  assert all(float(np.abs(m).max()) == 0
             for m in jax.tree.leaves(opt_state_of(zero_run)[1][0].mu))
  train_on(zero_run)
  zeroed = val_losses(zero_run.out)
  before = converted[SWITCH]
  assert zeroed[SWITCH] == before == val_losses(adamw_run)[SWITCH]
  after = SWITCH + 10
  # Ten steps on, both runs have gone down. Which of the two is lower after
  # ten steps of this toy run depends on the JAX release (when this test was
  # written: 3.204 converted, 3.216 zeroed; jax 0.12.0.1: 3.323 converted,
  # 3.301 zeroed), so
  # it is not asserted: what the conversion carries is (the counts and the
  # block means above, and the restored weights' loss).
  assert converted[after] <= before
  assert zeroed[after] <= before


def test_a_switch_to_the_same_optimizer_continues_exactly(tmp_path):
  """The whole path (old optimizer's restore target, convert_state, the live
  state's objects and shardings) is the identity on FOAM -> FOAM."""
  foam = config(tmp_path / "foam", optimizer="foam", steps=8, checkpoint_every=4,
                eval_every=4)
  full = trainer.train(foam)
  shutil.rmtree(os.path.join(foam.out, "checkpoints", "8"))
  run = trainer.Trainer(config(foam.out, optimizer="foam", steps=8, checkpoint_every=4,
                               eval_every=4, resume=True))
  run.create_state()
  run.manager = checkpoints.manager(os.path.join(foam.out, "checkpoints"))
  run.state, meta = switch.restore_switched(run, 4, switch.read_meta(run.manager, 4))
  run.start_step, run.tokens_seen, run.elapsed_before = 4, 4 * 8 * 32, 0.0
  run.initial_val_loss, run.loader_state = None, meta.get("loader")
  run.metrics = trainer.outputs.MetricsLog(os.path.join(foam.out, "metrics.jsonl"), 4)
  run.loop()
  assert run.val_loss == pytest.approx(full["final_val_loss"], abs=1e-6)


def test_switch_on_a_mesh_lands_on_the_live_shardings(adamw_run, tmp_path):
  out = killed_at_switch(adamw_run, tmp_path / "mesh")
  run = resumed(config(out, optimizer="foam", resume=True, mesh="fsdp=2,tp=4"))
  # The shardings create_state gives a fresh FOAM state (and the compiled
  # steps expect), and FOAM's shapes and dtypes.
  want = sharding_lib.variable_shardings(run.state, run.mesh)
  assert jax.tree.leaves(jax.tree.map(lambda x: x.sharding, run.state)) == jax.tree.leaves(
      want)
  _, abstract = state_lib.abstract_state(run.model_cfg, run.tx)
  assert ([(x.shape, x.dtype) for x in jax.tree.leaves(run.state)]
          == [(x.shape, x.dtype) for x in jax.tree.leaves(abstract)])
  _, opt_state = opt_state_of(run)
  q_mu = opt_state[0].mu["layers"][0]["self_attn"]["q_proj"]["kernel"]
  assert q_mu.sharding.spec == P("fsdp", "tp") and len(q_mu.sharding.device_set) == 8
  assert set(switch.step_counts(opt_state).values()) == {SWITCH}


def test_a_switch_convert_state_cannot_make_is_refused(adamw_run, tmp_path):
  out = killed_at_switch(adamw_run, tmp_path / "muon")
  with pytest.raises(checkpoints.RestoreError) as e:
    resumed(config(out, optimizer="muon", resume=True))
  message = str(e.value)
  assert message.startswith("Checkpoint 15 in ")
  assert ("was written by --optimizer adamw; its optimizer state does not fit "
          "--optimizer muon and cannot be converted to it") in message
  assert "tx holds none of foam_jax's folded" in message
  assert "resume with --optimizer adamw, or start muon fresh with another --out" in message


def test_lion_to_foam_is_refused(tmp_path):
  """Lion has no second moments for FOAM's nu (the CLI path: test_llama_train)."""
  small = dict(steps=2, checkpoint_every=2, eval_every=2, eval_batches=1)
  trainer.train(config(tmp_path / "lion", optimizer="lion", **small))
  with pytest.raises(checkpoints.RestoreError) as e:
    resumed(config(tmp_path / "lion", optimizer="foam", resume=True, **small))
  message = str(e.value)
  assert message.startswith("Checkpoint 2 in ") and "written by --optimizer lion" in message
  assert "none of them has second moments" in message
  assert "start foam fresh with another --out" in message


def test_the_docstring_examples_run():
  """(Here rather than in test_doctests' list, which other branches edit.)"""
  assert doctest.testmod(switch, optionflags=doctest.ELLIPSIS).failed == 0


def test_every_registry_switch_carries_every_count():
  """The registry's chains (schedules, Muon's two parts, clipping): each count,
  set to a distinct value, reaches the new state (same place, else the first
  moments' count, which moves with every other)."""
  shapes = model_lib.abstract_params(TrainConfig(model_overrides=dict(SMALL)).model_config())
  params = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), nnx.as_pure(shapes))
  make = lambda name, clip: optimizers_lib.make_optimizer(  # noqa: E731
      name, None, 20, clip=clip, hidden_size=SMALL["hidden_size"])
  at_step = lambda path, x: (  # noqa: E731
      jnp.full_like(x, 7) if getattr(path[-1], "name", None) == "count" else x)
  for old, new, clip in [("adamw", "foam", 0.0), ("adamw", "foam_mini", 1.0),
                         ("muon", "foam_muon", 0.0), ("lion", "foam_lion", 1.0)]:
    state = jax.tree_util.tree_map_with_path(at_step, make(old, clip).init(params))
    new_tx = make(new, clip)
    counts = switch.step_counts(foam_jax.convert_state(state, new_tx, params))
    assert counts.keys() == switch.step_counts(new_tx.init(params)).keys()
    assert set(counts.values()) == {7}, (old, new, counts)
