"""Tunix (PyPI ``google-tunix``) fine-tuning with FOAM, as its users write it.

A small Qwen3 of Tunix's own model code, made on a 4-device ``fsdp`` mesh (its
default sharding: the attention output ``(heads, head_dim, embed)`` sharded on
``embed``), trained by Tunix's ``PeftTrainer`` with ``foam_jax.foam`` where
its docs pass ``optax.adamw``: full fine-tuning, a qwix LoRA adapter, gradient
accumulation (``TrainingConfig(gradient_accumulation_steps=...)``, which
wraps the optimizer in ``optax.MultiSteps``), and Tunix's Orbax checkpoints
with int8 moments, restored by a new trainer.

Runs where Tunix is installed (``.ci/run``'s Tunix step); elsewhere it is not
collected (``tests/conftest.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import qwix
from flax import nnx
from tunix.models.qwen3 import model as qwen3
from tunix.sft import peft_trainer
from tunix.sft import utils

import foam_jax

SEQ, BATCH = 16, 4


def _mesh():  # Automatic axes, as Tunix's own mesh helper makes them.
  return jax.make_mesh((4, 1), ("fsdp", "tp"), devices=jax.devices()[:4],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _config():
  return qwen3.ModelConfig(num_layers=2, vocab_size=64, embed_dim=64, hidden_dim=128,
                           num_heads=4, head_dim=16, num_kv_heads=2, rope_theta=10_000,
                           norm_eps=1e-6)


def _model(mesh, seed=0):
  with jax.set_mesh(mesh):
    return qwen3.Qwen3(_config(), rngs=nnx.Rngs(seed))


def _batches(n, seed=0):
  """Sequences that count up by a random stride: learnable in a few steps."""
  rng = np.random.default_rng(seed)
  for _ in range(n):
    start = rng.integers(1, 64, size=(BATCH, 1))
    stride = rng.integers(1, 4, size=(BATCH, 1))
    tokens = (start + stride * np.arange(SEQ)) % 63 + 1
    yield peft_trainer.TrainingInput(input_tokens=tokens.astype(np.int32),
                                     input_mask=np.ones((BATCH, SEQ), np.int32))


def _model_input(x: peft_trainer.TrainingInput):  # As Tunix's peft_main writes it.
  pad_mask = x.input_tokens != 0
  return {"input_tokens": x.input_tokens, "input_mask": x.input_mask,
          "positions": utils.build_positions_from_mask(pad_mask),
          "attention_mask": utils.make_causal_attn_mask(pad_mask)}


def _loss(model, batches):
  losses = []
  for x in batches:
    inputs = _model_input(x)
    logits, _ = model(inputs["input_tokens"], inputs["positions"], None,
                      inputs["attention_mask"])
    logp = jax.nn.log_softmax(logits[:, :-1])
    target = jax.nn.one_hot(inputs["input_tokens"][:, 1:], logits.shape[-1])
    losses.append(float(-jnp.mean(jnp.sum(logp * target, -1))))
  return float(np.mean(losses))


def _train(model, optimizer, mesh, steps, **config):
  trainer = peft_trainer.PeftTrainer(
      model, optimizer,
      peft_trainer.TrainingConfig(eval_every_n_steps=1000, max_steps=steps, **config))
  trainer = trainer.with_gen_model_input_fn(_model_input)
  with jax.set_mesh(mesh):
    trainer.train(list(_batches(steps * config.get("gradient_accumulation_steps", 1))))
  return trainer


def _lora(model):
  provider = qwix.LoraProvider(
      module_path=".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj",
      rank=4, alpha=2.0)
  x = next(_batches(1))
  return qwix.apply_lora_to_model(model, provider, **{
      k: v for k, v in _model_input(x).items() if k != "input_mask"} | {"cache": None})


def test_full_fine_tuning_learns_as_adamw_does():
  mesh = _mesh()
  held_out = list(_batches(4, seed=99))
  drops = {}
  for name, tx in (("adamw", optax.adamw(3e-3)), ("foam", foam_jax.foam(3e-3))):
    model = _model(mesh)
    before = _loss(model, held_out)
    trainer = _train(model, tx, mesh, steps=30)
    assert trainer.train_steps == 30
    drops[name] = before - _loss(model, held_out)
  assert drops["adamw"] > 0.5 and drops["foam"] > 0.5 * drops["adamw"], drops


def test_lora_fine_tuning_updates_the_adapters_only_and_learns():
  """Tunix trains ``nnx.LoRAParam`` only; FOAM keeps the adapters on Adam's
  moments, so it learns as AdamW does (it barely learned when it folded them)."""
  mesh = _mesh()
  held_out = list(_batches(4, seed=99))
  drops = {}
  for name, tx in (("adamw", optax.adamw(3e-3)), ("foam", foam_jax.foam(3e-3))):
    model = _lora(_model(mesh))
    frozen = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
    base = jax.tree.map(jnp.copy, nnx.state(model, frozen))
    assert jax.tree.leaves(nnx.state(model, nnx.LoRAParam))
    before = _loss(model, held_out)
    trainer = _train(model, tx, mesh, steps=30)
    drops[name] = before - _loss(model, held_out)
    after = nnx.state(model, frozen)
    assert all(bool(jnp.array_equal(a, b)) for a, b in
               zip(jax.tree.leaves(base), jax.tree.leaves(after)))
    opt_state = nnx.state(trainer.optimizer, nnx.OptState)
    assert jax.tree.leaves(opt_state)  # The adapters' moments.
  assert drops["adamw"] > 0.2 and drops["foam"] > 0.8 * drops["adamw"], drops


def test_gradient_accumulation_wraps_foam_in_multi_steps():
  mesh = _mesh()
  model = _model(mesh)
  trainer = _train(model, foam_jax.foam(3e-3), mesh, steps=4, gradient_accumulation_steps=2)
  assert trainer.train_steps == 4
  state = trainer.optimizer.opt_state
  assert int(jax.tree.leaves(state)[0]) in (0, 1, 2)  # MultiSteps' mini-step counter.


@pytest.mark.parametrize("moments", [None, jnp.int8])
def test_sharded_checkpoints_restore_into_a_new_trainer(tmp_path, moments):
  mesh = _mesh()
  make_tx = lambda: foam_jax.foam(3e-3, mu_dtype=moments, nu_dtype=moments)  # noqa: E731
  options = ocp.CheckpointManagerOptions(save_interval_steps=2, max_to_keep=2)
  model = _model(mesh)
  trainer = _train(model, make_tx(), mesh, steps=4, checkpoint_root_directory=str(tmp_path),
                   checkpointing_options=options)
  trainer.close() if hasattr(trainer, "close") else None
  saved = jax.tree.map(np.asarray, nnx.state(trainer.optimizer, nnx.OptState))

  fresh = peft_trainer.PeftTrainer(
      _model(mesh, seed=1), make_tx(),
      peft_trainer.TrainingConfig(eval_every_n_steps=1000, max_steps=4,
                                  checkpoint_root_directory=str(tmp_path),
                                  checkpointing_options=options))
  assert fresh.train_steps == 4
  restored = nnx.state(fresh.optimizer, nnx.OptState)
  for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, np.asarray(b))
  leaves = jax.tree.leaves(restored)
  if moments is not None:
    assert any(x.dtype == jnp.int8 for x in leaves)
  # The moments of the embedding-sized and attention weights stay sharded over fsdp.
  assert any("fsdp" in str(x.sharding.spec) for x in leaves if x.ndim >= 2)
