"""The training run, in named steps: set up, create state, resume, loop, summarise.

``Trainer(cfg)`` sets up (data, mesh, optimizer; a bad setting raises
``ValueError`` here, before any compile); ``run()`` does the rest and returns
the summary. ``train(cfg)`` is both in one call.

Examples:
  A notebook or a benchmark::

    from examples.llama import train_config, trainer
    summary = trainer.train(train_config.TrainConfig(steps=50, out="/tmp/run"))
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from typing import Any

import jax
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.experimental import multihost_utils

import foam_jax
from examples.llama import checkpoints
from examples.llama import distributed
from examples.llama import generate as generate_lib
from examples.llama import loader
from examples.llama import optimizers as optimizers_lib
from examples.llama import outputs
from examples.llama import sharding as sharding_lib
from examples.llama import state as state_lib
from examples.llama import steps as steps_lib
from examples.llama import switch
from examples.llama.train_config import TrainConfig

__all__ = ["Trainer", "train"]


class _TrainClock:
  """Seconds spent training: from the end of the first (compiling) step on,
  with evaluations and checkpoints left out."""

  def __init__(self):
    self.seconds = 0.0
    self._mark = None

  def start(self) -> None:
    self._mark = time.perf_counter()

  def lap(self) -> None:
    """Counts the time since the last mark (call after a sync)."""
    if self._mark is not None:
      now = time.perf_counter()
      self.seconds += now - self._mark
      self._mark = now

  def skip(self, seconds: float) -> None:
    """Leaves ``seconds`` just spent (an evaluation) out of the count."""
    if self._mark is not None:
      self._mark += seconds


class Trainer:
  """One training run of ``cfg``; see the module docstring for the steps."""

  # A benchmark's control: --resume onto another optimizer with its moments
  # zeroed instead of converted (switch.restore_switched).
  zero_moments_on_switch = False

  def __init__(self, cfg: TrainConfig):
    self.cfg = cfg
    self.setup()

  # -- 1. Set up: data, devices, optimizer. ----------------------------------

  def setup(self) -> None:
    cfg = self.cfg
    self.out = cfg.out_dir()
    self.data = loader.open_data(cfg.data, cfg.data_dir, cfg.dataset, cfg.tokenizer,
                                 cfg.val_fraction)
    self.tokenizer = self.data.tokenizer
    model_cfg = cfg.model_config()
    if model_cfg.vocab_size < self.tokenizer.vocab_size:
      if "vocab_size" in cfg.model_overrides:
        raise ValueError(
            f"vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
            f"vocabulary ({self.tokenizer.vocab_size}).")
      model_cfg = dataclasses.replace(model_cfg, vocab_size=self.tokenizer.vocab_size)
    self.model_cfg = model_cfg
    self.seq_len = cfg.seq_len or model_cfg.max_seq_len
    self.source = self.data.batches(self.seq_len, cfg.batch_size, cfg.seed)

    self.mesh_sizes = sharding_lib.parse_mesh(cfg.mesh, jax.device_count())
    if cfg.batch_size % self.mesh_sizes["fsdp"]:
      raise ValueError(
          f"batch_size ({cfg.batch_size}) must be divisible by the mesh's fsdp "
          f"size ({self.mesh_sizes['fsdp']}).")
    self.mesh = sharding_lib.make_mesh(self.mesh_sizes)
    self.batch_sharding = sharding_lib.batch_sharding(self.mesh)
    self.rows = loader.process_rows(self.batch_sharding, cfg.batch_size)  # This process's.
    self.is_main = distributed.is_main()

    self.lr = cfg.lr if cfg.lr is not None else optimizers_lib.DEFAULT_LR[cfg.optimizer]
    self.tx = optimizers_lib.make_optimizer(
        cfg.optimizer, self.lr, cfg.steps, warmup_fraction=cfg.warmup, clip=cfg.clip,
        hidden_size=model_cfg.hidden_size, weight_decay=cfg.weight_decay, b1=cfg.b1,
        b2=cfg.b2, **cfg.optimizer_settings())
    self.schedule = optimizers_lib.schedule(self.lr, cfg.steps, cfg.warmup)
    # What a checkpoint must share with this run to continue it exactly.
    self.data_identity = {
        "seed": cfg.seed, "batch_size": cfg.batch_size, "seq_len": self.seq_len,
        **self.data.identity,
    }
    self.run_identity = {
        "optimizer": cfg.optimizer, "lr": self.lr, "steps": cfg.steps,
        "warmup": cfg.warmup, "weight_decay": cfg.weight_decay, "clip": cfg.clip,
        "b1": cfg.b1, "b2": cfg.b2, "model": dataclasses.asdict(model_cfg),
        **cfg.optimizer_settings(),
    }

  def put(self, rows: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """The global batch from this process's rows of it."""
    return loader.global_batch(self.batch_sharding, rows, self.cfg.batch_size)

  # -- 2. Create the state and compile the steps. ----------------------------

  def create_state(self) -> None:
    self.graphdef, self.state, shardings = state_lib.create_state(
        self.model_cfg, self.tx, self.mesh, self.cfg.seed)
    self.train_step = steps_lib.make_train_step(self.graphdef, shardings, self.batch_sharding)
    self.eval_step = steps_lib.make_eval_step(self.graphdef, shardings, self.batch_sharding)
    params = nnx.to_pure_dict(self.state)[0]
    self.num_params = optax.tree.size(params)
    self.state_bytes = foam_jax.state_bytes(self.tx, params)
    self.adamw_state_bytes = foam_jax.state_bytes(optax.adamw(1e-3), params)

  def evaluate(self) -> float:
    """Mean validation loss over ``eval_batches`` fixed batches."""
    n = self.cfg.eval_batches
    losses = [self.eval_step(self.state, self.put(self.source.val_rows(i, n, *self.rows)))
              for i in range(n)]
    return float(np.mean(jax.device_get(losses)))

  # -- 3. Resume from the latest checkpoint, or start fresh. -----------------

  def resume(self) -> None:
    cfg, ckpt_dir = self.cfg, os.path.join(self.out, "checkpoints")
    os.makedirs(self.out, exist_ok=True)
    if not cfg.resume and os.path.isdir(ckpt_dir) and self.is_main:
      print(f"Starting fresh: removing old checkpoints in {ckpt_dir} (--resume keeps them).")
      shutil.rmtree(ckpt_dir)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("llama: checkpoints folder ready")
    self.manager = checkpoints.manager(ckpt_dir)
    self.start_step, self.tokens_seen, self.elapsed_before = 0, 0, 0.0
    self.initial_val_loss, self.loader_state = None, None
    latest = self.manager.latest_step()
    if cfg.resume and latest is not None:
      meta = switch.read_meta(self.manager, latest)
      if switch.needs_conversion(meta, cfg.optimizer, cfg.optimizer_settings()):
        self.state, meta = switch.restore_switched(
            self, latest, meta, zero_moments=self.zero_moments_on_switch)
      else:
        self.state, meta = checkpoints.restore(self.manager, latest, self.state)
      if meta["data"] != self.data_identity:
        raise checkpoints.RestoreError(
            f"--resume: the checkpoint's data stream {meta['data']} differs from "
            f"this run's {self.data_identity}; resume with the same data settings.")
      old_run = meta.get("run", {})
      changed = {k: (old_run.get(k), v) for k, v in self.run_identity.items()
                 if old_run.get(k) != v}
      if changed:
        print(f"--resume: settings differ from the checkpointed run's {changed} "
              "(old, new); the result will not match an uninterrupted run.")
      self.start_step, self.tokens_seen = latest, meta["tokens"]
      self.elapsed_before = meta["wall_time"]
      self.initial_val_loss = meta.get("initial_val_loss")
      self.loader_state = meta.get("loader")  # Absent in older checkpoints: the step.
      self._print(f"Resumed from {ckpt_dir} at step {latest}.")
    elif cfg.resume:
      self._print(f"--resume: no checkpoint in {ckpt_dir}; starting fresh.")
    self.metrics = outputs.MetricsLog(
        os.path.join(self.out, "metrics.jsonl"),
        keep_until_step=self.start_step if self.start_step else None) if self.is_main else None

  # -- 4. The loop. -----------------------------------------------------------

  def _record_eval(self, step: int, train_losses: list[jax.Array], wall: float) -> float:
    train_loss = float(np.mean(jax.device_get(train_losses))) if train_losses else None
    val_loss = self.evaluate()
    if self.metrics is None:  # Not process 0: it writes the metrics.
      return val_loss
    self.metrics.append({
        "step": step, "tokens": self.tokens_seen, "train_loss": train_loss,
        "val_loss": val_loss, "val_ppl": math.exp(val_loss),
        "lr": float(self.schedule(step)), "wall_time": wall,
    })
    if step:
      tqdm.tqdm.write(
          f"step {step:6d}  tokens {self.tokens_seen:,}  train_loss {train_loss:.4f}"
          f"  val_loss {val_loss:.4f}  val_ppl {math.exp(val_loss):.2f}")
    return val_loss

  def loop(self) -> None:
    cfg = self.cfg
    self.t_start = time.perf_counter()
    wall = lambda: self.elapsed_before + time.perf_counter() - self.t_start
    if self.start_step == 0:
      self.initial_val_loss = self._record_eval(0, [], 0.0)
    self.clock, self.val_loss = _TrainClock(), None
    train_losses, last_loss = [], float("nan")
    bar = tqdm.tqdm(total=cfg.steps, initial=self.start_step, unit="step",
                    disable=not (cfg.progress and self.is_main), desc=cfg.optimizer,
                    dynamic_ncols=True, mininterval=0.5)
    batches = loader.train_iterator(self.source, *self.rows, start_step=self.start_step,
                                    state=self.loader_state)
    for step in range(self.start_step, cfg.steps):
      batch = self.put(next(batches))
      self.state, loss = self.train_step(self.state, batch)
      train_losses.append(loss)
      self.tokens_seen += cfg.batch_size * self.seq_len
      done = step + 1
      if step == self.start_step or done % cfg.log_every == 0 or done == cfg.steps:
        last_loss = float(loss)  # Syncs: the steps so far are complete.
        if step == self.start_step:  # It compiled: time from its end on.
          self.clock.start()
        else:
          self.clock.lap()
        timed = (done - self.start_step - 1) * cfg.batch_size * self.seq_len
        rate = timed / self.clock.seconds if self.clock.seconds else float("nan")
        bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
      bar.update(1)

      is_eval = done % cfg.eval_every == 0 or done == cfg.steps
      is_ckpt = done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)
      if is_eval or is_ckpt:
        jax.block_until_ready(self.state)
        self.clock.lap()
        t0 = time.perf_counter()
        if is_eval:
          self.val_loss = self._record_eval(done, train_losses, wall())
          train_losses = []
        if is_ckpt:
          checkpoints.save(self.manager, done, self.state, {
              "step": done, "tokens": self.tokens_seen, "data": self.data_identity,
              "wall_time": wall(), "initial_val_loss": self.initial_val_loss,
              "run": self.run_identity, "loader": batches.get_state(),
          })
        self.clock.skip(time.perf_counter() - t0)
    bar.close()
    self.manager.wait_until_finished()
    self.manager.close()

  # -- 5. Summarise. -----------------------------------------------------------

  def summarise(self) -> dict[str, Any]:
    cfg = self.cfg
    if self.val_loss is None:  # Resumed at the end: evaluate the restored state.
      self.val_loss = self.evaluate()
    timed_tokens = (cfg.steps - self.start_step - 1) * cfg.batch_size * self.seq_len
    if self.is_main:
      outputs.plot_losses(os.path.join(self.out, "metrics.jsonl"),
                          os.path.join(self.out, "loss.png"),
                          title=f"LLaMA {cfg.preset}, {cfg.optimizer}")
    summary = {
        "initial_val_loss": self.initial_val_loss,
        "final_val_loss": self.val_loss,
        "final_val_ppl": math.exp(self.val_loss),
        "tokens_per_s": (timed_tokens / self.clock.seconds if self.clock.seconds
                         else float("nan")),
        "steps": cfg.steps,
        "tokens": self.tokens_seen,
        "wall_time_s": time.perf_counter() - self.t_start,
        "num_params": self.num_params,
        "state_bytes": self.state_bytes,
        "adamw_state_bytes": self.adamw_state_bytes,
        "state_ratio": self.state_bytes / self.adamw_state_bytes,
        "out": self.out,
    }
    if cfg.sample and jax.process_count() > 1:
      self._print("--sample: skipped in a multi-process run.")
    elif cfg.sample:
      model = nnx.merge(self.graphdef, self.state)[0]
      prompt = (self.tokenizer.encode(cfg.prompt) if cfg.prompt
                else np.zeros(1, np.int32))
      ids = generate_lib.generate(model, prompt, cfg.sample, window=self.seq_len,
                                  temperature=cfg.temperature, seed=cfg.seed)
      summary["sample"] = self.tokenizer.decode(ids)
    summary["state"], summary["graphdef"] = self.state, self.graphdef
    return summary

  def _print(self, *args) -> None:
    if self.is_main:
      print(*args)

  def write_config(self) -> None:
    if not self.is_main:
      return
    outputs.write_json(os.path.join(self.out, "config.json"), {
        "train": dataclasses.asdict(self.cfg), "model": dataclasses.asdict(self.model_cfg),
        "lr": self.lr, "seq_len": self.seq_len, "mesh": self.mesh_sizes,
        "corpus_tokens": self.data.num_tokens, "dataset": self.cfg.dataset,
        "processes": jax.process_count(),
        "tokenizer": type(self.tokenizer).__name__, "machine": outputs.machine_info(),
    })

  def run(self) -> dict[str, Any]:
    """Creates the state, resumes, trains and returns the summary.

    Returns:
      ``initial_val_loss``, ``final_val_loss``, ``final_val_ppl``,
      ``tokens_per_s`` (compile, evaluations and checkpoints excluded),
      ``steps``, ``tokens``, ``wall_time_s``, ``num_params``, ``state_bytes``
      (this optimizer), ``adamw_state_bytes``, ``state_ratio``, ``out``, with
      ``cfg.sample`` the generated ``sample``, and the trained ``graphdef``
      and ``state`` (``nnx.merge`` gives back ``(model, optimizer)``).
    """
    self.create_state()
    self.resume()
    self.write_config()
    cfg = self.cfg
    self._print(f"LLaMA {cfg.preset}: {self.num_params / 1e6:.2f}M params, {cfg.optimizer} "
          f"(peak lr {self.lr:g}), {cfg.steps} steps x {cfg.batch_size} x {self.seq_len} "
          f"tokens, mesh {self.mesh_sizes} on {jax.process_count()} process(es), corpus "
                f"{self.data.num_tokens:,} tokens "
          f"({type(self.tokenizer).__name__}). Output: {self.out}")
    self.loop()
    return self.summarise()


def train(cfg: TrainConfig) -> dict[str, Any]:
  """Runs (or resumes) a whole training; see :meth:`Trainer.run`."""
  return Trainer(cfg).run()
