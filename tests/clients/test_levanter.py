"""FOAM inside Levanter: its config registry, its ``Trainer``, its checkpoints.

Runs where ``marin-levanter`` is installed (``pip install -e ".[levanter]"``;
``.ci/run``'s Levanter step), once per device count: ``FOAM_JAX_TEST_DEVICES=1``
(one device) and ``=2`` (a data-parallel and a tensor-parallel mesh). Each
run selects the optimizer as a user does, by its name in a config decoded
with draccus, trains a small Llama (Levanter's own) through ``Trainer``,
checkpoints half-way with Levanter's checkpointer, and resumes from there
in a fresh ``Trainer``: the resumed run must end bit for bit where the
uninterrupted one did.
"""

import dataclasses

import draccus
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from levanter.checkpoint import CheckpointerConfig
from levanter.models.llama import LlamaConfig
from levanter.models.lm_model import LmExample
from levanter.optim.config import AdamConfig
from levanter.optim.config import OptimizerConfig
from levanter.tracker import NoopConfig
from levanter.trainer import Trainer
from levanter.trainer import TrainerConfig
from levanter.utils.mesh import MeshConfig

import foam_jax
import foam_jax.levanter

Pos = hax.Axis("position", 16)
Vocab = hax.Axis("vocab", 64)
Batch = hax.Axis("batch", 8)
MODEL = LlamaConfig(max_seq_len=16, hidden_dim=128, intermediate_dim=256, num_layers=2,
                    num_heads=4, num_kv_heads=4, gradient_checkpointing=False)
STEPS, HALF = 8, 4

OPTIMIZERS = {
    "foam": {"type": "foam", "learning_rate": 1e-2, "alpha": 0.25, "warmup": 0.1},
    "foam_int8": {"type": "foam", "learning_rate": 1e-2, "alpha": 0.25, "warmup": 0.1,
                  "mu_dtype": "int8", "nu_dtype": "int8"},
    "foam_lion": {"type": "foam_lion", "learning_rate": 1e-3, "warmup": 0.1},
    "foam_muon": {"type": "foam_muon", "learning_rate": 2e-2, "adam_lr": 3e-3,
                  "warmup": 0.1, "weight_decay": 0.1},
}


def _meshes():
  """The meshes this process's device count offers."""
  n = jax.device_count()
  if n == 1:
    return {"one_device": {"data": 1, "replica": 1, "model": 1}}
  return {"data_parallel": {"data": n, "replica": 1, "model": 1},
          "tensor_parallel": {"data": 1, "replica": 1, "model": n}}


def _batch(step):
  """Step ``step``'s batch: sequences counting up from random starts (learnable)."""
  starts = np.random.default_rng(step).integers(0, Vocab.size, (Batch.size, 1))
  tokens = (starts + np.arange(Pos.size)[None, :]) % Vocab.size
  return hax.vmap(LmExample.causal, Batch)(hax.named(jnp.asarray(tokens, jnp.int32),
                                                     (Batch, Pos)))


def _batches(first):
  step = first
  while True:
    yield _batch(step)
    step += 1


def _loss(model, example, *, key=None):
  return model.compute_next_token_loss(example, key=key)


def _trainer_config(tmp_path, mesh, **kwargs):
  return TrainerConfig(
      num_train_steps=STEPS, train_batch_size=Batch.size, tracker=NoopConfig(),
      log_jaxprs=False, log_xla_hlo=False, id="run", mesh=MeshConfig(axes=mesh),
      checkpointer=CheckpointerConfig(base_path=str(tmp_path), keep=[dict(every=HALF)],
                                      save_interval=None, append_run_id_to_base_path=False),
      **kwargs)


def _train(config, optimizer, first=0):
  """Trains from a fresh or loaded state (at step ``first``) to the end; the data
  of step ``i`` is ``_batch(i)`` whether or not the run resumed."""
  with Trainer(config, optimizer.build(config.num_train_steps), _loss) as trainer:
    state = trainer.initial_state(jax.random.PRNGKey(0),
                                  model_init=lambda: MODEL.build(Vocab, key=jax.random.PRNGKey(1)))
    assert int(state.step) == first
    losses = []
    for info in trainer.training_steps(state, _batches(first)):
      losses.append(info.loss)
    trainer.run_hooks(info, force=True)  # The final checkpoint, as Trainer.train does.
    return info.state, losses


def _arrays(tree):
  return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array))]


def test_the_configs_are_registered_by_name_with_levanters_fields():
  for name, cls in (("foam", foam_jax.levanter.FoamConfig),
                    ("foam_lion", foam_jax.levanter.FoamLionConfig),
                    ("foam_muon", foam_jax.levanter.FoamMuonConfig)):
    config = draccus.decode(OptimizerConfig, {
        "type": name, "learning_rate": 3e-3, "weight_decay": 0.05, "warmup": 5,
        "decay": 0.5, "min_lr_ratio": 0.2, "lr_schedule": "linear", "max_grad_norm": 0.5,
        "weight_decay_modules": ["q_proj"], "fold_level": 3})
    assert isinstance(config, cls) and config.fold_level == 3
    assert config.learning_rate == 3e-3 and config.min_lr_ratio == 0.2
  with pytest.raises(draccus.utils.DecodingError, match="no_such_field"):
    draccus.decode(OptimizerConfig, {"type": "foam", "no_such_field": 1})
  with pytest.raises(draccus.utils.DecodingError):
    draccus.decode(OptimizerConfig, {"type": "foam", "bias_correction": "nope"})
  mini = draccus.decode(OptimizerConfig, {"type": "foam", "fold_level": "whole_axis"})
  assert mini.fold_level == "whole_axis"


def test_foam_at_level_0_steps_as_levanters_adam():
  """Same schedule, clipping and decay as AdamConfig: at level 0 and alpha 1,
  with Optax's bias correction, Levanter's Adam bit for bit."""
  fields = {"learning_rate": 1e-2, "weight_decay": 0.1, "warmup": 0.25, "max_grad_norm": 1.0}
  adam = AdamConfig(**fields).build(STEPS)
  foam = foam_jax.levanter.FoamConfig(**fields, fold_level=0, alpha=1.0,
                                      bias_correction="moments").build(STEPS)
  model = MODEL.build(Vocab, key=jax.random.PRNGKey(1))
  params = eqx.filter(model, eqx.is_inexact_array)
  s_adam, s_foam = adam.init(params), foam.init(params)
  p_adam = p_foam = params
  for step in range(3):
    scalar_loss = lambda m, ex: _loss(m, ex).scalar()  # noqa: E731
    grads = eqx.filter_grad(scalar_loss)(eqx.combine(p_adam, model), _batch(step))
    u_adam, s_adam = adam.update(grads, s_adam, p_adam)
    grads = eqx.filter_grad(scalar_loss)(eqx.combine(p_foam, model), _batch(step))
    u_foam, s_foam = foam.update(grads, s_foam, p_foam)
    p_adam, p_foam = eqx.apply_updates(p_adam, u_adam), eqx.apply_updates(p_foam, u_foam)
  for a, b in zip(_arrays(p_adam), _arrays(p_foam), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mesh", list(_meshes()))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_trains_in_levanters_trainer_and_resumes_exactly(tmp_path, name, mesh):
  optimizer = draccus.decode(OptimizerConfig, OPTIMIZERS[name])
  whole, losses = _train(_trainer_config(tmp_path / "whole", _meshes()[mesh]), optimizer)
  assert len(losses) == STEPS and np.mean(losses[-2:]) < losses[0] - 0.1, losses
  # The state is folded: every moment of a weight matrix is smaller than it.
  sizes = {x.size for x in jax.tree.leaves(eqx.filter(whole.opt_state, eqx.is_array))}
  assert max(sizes) < MODEL.hidden_dim * MODEL.intermediate_dim * MODEL.num_layers
  # Resume in a fresh Trainer from the half-way checkpoint of the first run
  # (Levanter names it after the step it completed, counting from 0).
  config = _trainer_config(tmp_path / "resumed", _meshes()[mesh],
                           load_checkpoint_path=str(tmp_path / "whole" / f"step-{HALF}"))
  resumed, _ = _train(config, optimizer, first=HALF + 1)
  assert int(resumed.step) == int(whole.step) == STEPS
  for a, b in zip(_arrays(whole.model), _arrays(resumed.model), strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(_arrays(whole.opt_state), _arrays(resumed.opt_state), strict=True):
    np.testing.assert_array_equal(a, b)
  if name == "foam_int8":
    codes = [x for x in jax.tree.leaves(eqx.filter(whole.opt_state, eqx.is_array))
             if x.dtype == jnp.int8]
    assert codes, "the int8 moments were not in the state Levanter saved"


def test_the_module_serves_its_configs_and_nothing_else():
  assert foam_jax.levanter.is_available()
  with pytest.raises(AttributeError):
    _ = foam_jax.levanter.NoSuchConfig  # noqa: B018
  assert dataclasses.is_dataclass(foam_jax.levanter.FoamMuonConfig)
  assert issubclass(foam_jax.levanter.FoamLionConfig, OptimizerConfig)
