r"""Pre-train a LLaMA with FOAM (or AdamW, Adafactor, Lion, Muon) in Flax NNX.

The default run is the CPU demo: the ``tiny`` preset, byte-level, on the
English documentation text inside CPython (no download), a few minutes on 2
cores::

  python examples/llama/train.py
  python examples/llama/train.py --optimizer adamw --sample 200
  python examples/llama/train.py --data my.txt --steps 1000 --resume
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python examples/llama/train.py --mesh fsdp=2,tp=4

Outputs go under ``--out`` (default ``runs/llama-<preset>-<optimizer>``):
``config.json``, ``metrics.jsonl`` (one record per evaluation), ``loss.png``
and Orbax checkpoints in ``checkpoints/``. The last line printed is
``final val_loss <float>``.

Library use (a benchmark, a notebook)::

  import sys; sys.path.insert(0, "examples/llama")
  import train
  summary = train.train(train.TrainConfig(steps=50, out="/tmp/run"))
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import shutil
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm
from flax import nnx

import foam_jax

import configs as configs_lib
import data as data_lib
import generate as generate_lib
import model as model_lib
import optimizers as optimizers_lib
import outputs as outputs_lib
import sharding as sharding_lib

from optimizers import DEFAULT_LR, make_optimizer  # re-exported
# pylint: enable=g-import-not-at-top,wrong-import-position

__all__ = [
    "DEFAULT_LR",
    "TrainConfig",
    "create_state",
    "evaluate",
    "main",
    "make_eval_step",
    "make_optimizer",
    "make_train_step",
    "parse_args",
    "train",
]


@dataclasses.dataclass
class TrainConfig:
  """Everything a training run needs; ``main`` builds one from the flags.

  Attributes:
    preset: a key of ``configs.PRESETS``.
    model_overrides: ``LlamaConfig`` fields replacing the preset's.
    optimizer: ``foam, foam_mini, adamw, adafactor, lion, muon``.
    steps: optimizer steps (the schedule's horizon).
    batch_size: sequences per step.
    seq_len: tokens per sequence; ``None`` takes the preset's ``max_seq_len``.
    lr: peak learning rate; ``None`` takes ``optimizers.DEFAULT_LR``.
    warmup: fraction of the steps in linear warmup (paper: 0.1).
    weight_decay: decoupled weight decay (paper: 0).
    clip: global-norm gradient clipping, ``0`` disables (paper: none).
    b1: first-moment decay.
    b2: second-moment decay (paper: 0.95).
    seed: seeds the weights and the training batches.
    data: a UTF-8 text file to train on.
    data_dir: a folder of UTF-8 text files to train on.
    tokenizer: a SentencePiece model file; ``None`` is byte-level.
    val_fraction: tail fraction of the token stream held out.
    out: output folder; ``None`` is ``runs/llama-<preset>-<optimizer>``.
    eval_every: steps between validation evaluations.
    eval_batches: batches per validation evaluation.
    checkpoint_every: steps between Orbax checkpoints (``0``: only at the end).
    resume: continue from the latest checkpoint in ``out``.
    mesh: device mesh such as ``"fsdp=2,tp=4"``; ``None`` is one device.
    sample: tokens to generate at the end (``0``: none).
    temperature: sampling temperature (``0`` is greedy).
    prompt: text the sample starts from.
    log_every: steps between progress-bar updates (each one syncs).
    progress: show the tqdm progress bar.
  """

  preset: str = "tiny"
  model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  optimizer: str = "foam"
  steps: int = 300
  batch_size: int = 16
  seq_len: int | None = None
  lr: float | None = None
  warmup: float = 0.1
  weight_decay: float = 0.0
  clip: float = 0.0
  b1: float = 0.9
  b2: float = 0.95
  seed: int = 0
  data: str | None = None
  data_dir: str | None = None
  tokenizer: str | None = None
  val_fraction: float = 0.05
  out: str | None = None
  eval_every: int = 50
  eval_batches: int = 8
  checkpoint_every: int = 100
  resume: bool = False
  mesh: str | None = None
  sample: int = 0
  temperature: float = 0.0
  prompt: str = "The "
  log_every: int = 10
  progress: bool = True

  def __post_init__(self):
    if self.optimizer not in optimizers_lib.OPTIMIZERS:
      raise ValueError(
          f"optimizer must be one of {optimizers_lib.OPTIMIZERS}, got "
          f"{self.optimizer!r}."
      )
    if self.preset not in configs_lib.PRESETS:
      raise ValueError(
          f"preset must be one of {sorted(configs_lib.PRESETS)}, got "
          f"{self.preset!r}."
      )
    for name in ("steps", "batch_size", "eval_every", "eval_batches", "log_every"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    for name in ("checkpoint_every", "sample"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    if self.seq_len is not None and (
        isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int)
        or self.seq_len < 1):
      raise ValueError(f"seq_len must be a positive int, got {self.seq_len!r}.")

  def model_config(self) -> configs_lib.LlamaConfig:
    overrides = dict(self.model_overrides)
    if self.seq_len is not None:
      overrides.setdefault("max_seq_len", self.seq_len)
    return configs_lib.get_config(self.preset, **overrides)

  def out_dir(self) -> str:
    return self.out or os.path.join("runs", f"llama-{self.preset}-{self.optimizer}")


# ----------------------------------------------------------------------------
# Model and optimizer state.


def create_state(
    model_cfg: configs_lib.LlamaConfig,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    seed: int = 0,
) -> tuple[nnx.GraphDef, nnx.State, Any]:
  """Builds the model and optimizer on ``mesh``: ``(graphdef, state, shardings)``.

  The weights are created already sharded (inside ``jit``); the optimizer
  state is then initialised from the concrete sharded weights, so FOAM's
  default policy sees each weight's sharding and keeps its blocks inside
  shards. ``state`` is ``nnx.state((model, optimizer))``; ``shardings`` are
  its ``NamedSharding``s, from the weights' annotations (``model.SHARDING``).
  """
  def sharded_model():
    with nnx.use_eager_sharding(False):  # We place the arrays ourselves.
      model = model_lib.Llama(model_cfg, rngs=nnx.Rngs(seed))
    params = nnx.state(model)
    nnx.update(model, jax.lax.with_sharding_constraint(
        params, sharding_lib.state_shardings(params, mesh)))
    return model

  with jax.set_mesh(mesh):
    if mesh.devices.size > 1:  # Born sharded: no device holds all weights.
      model = nnx.jit(sharded_model)()
    else:  # One device: eager creation skips compiling the initialisers.
      with nnx.use_eager_sharding(False):
        model = model_lib.Llama(model_cfg, rngs=nnx.Rngs(seed))
    with nnx.use_eager_sharding(False):
      optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  shardings = sharding_lib.state_shardings(state, mesh)
  state = jax.device_put(state, shardings)
  return graphdef, state, shardings


def loss_fn(model: nnx.Module, batch: dict[str, jax.Array]) -> jax.Array:
  """Mean next-token cross-entropy in nats."""
  logits_BTV = model(batch["inputs"])
  return optax.softmax_cross_entropy_with_integer_labels(
      logits_BTV, batch["targets"]
  ).mean()


def make_train_step(
    graphdef: nnx.GraphDef,
    state_shardings: Any = None,
    batch_sharding: Any = None,
) -> Callable[[nnx.State, dict[str, jax.Array]], tuple[nnx.State, jax.Array]]:
  """A jitted ``(state, batch) -> (state, loss)``; the input state is donated.

  Args:
    graphdef: from :func:`create_state`.
    state_shardings: the state's shardings (kept fixed across steps).
    batch_sharding: the batch's sharding.

  Returns:
    The step function. Time it after one warm-up call (the compile).
  """

  def train_step(state, batch):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss

  if state_shardings is None:
    return jax.jit(train_step, donate_argnums=0)
  return jax.jit(
      train_step,
      in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, None),
      donate_argnums=0,
  )


def make_eval_step(
    graphdef: nnx.GraphDef, state_shardings: Any = None, batch_sharding: Any = None
) -> Callable[[nnx.State, dict[str, jax.Array]], jax.Array]:
  """A jitted ``(state, batch) -> loss`` (no donation, no update)."""

  def eval_step(state, batch):
    model, _ = nnx.merge(graphdef, state)
    return loss_fn(model, batch)

  if state_shardings is None:
    return jax.jit(eval_step)
  return jax.jit(eval_step, in_shardings=(state_shardings, batch_sharding))


def evaluate(eval_step, state, dataset, batch_size, num_batches, put) -> float:
  """Mean validation loss over ``num_batches`` fixed batches."""
  losses = [eval_step(state, put(b)) for b in dataset.val_batches(batch_size, num_batches)]
  return float(np.mean(jax.device_get(losses)))


# ----------------------------------------------------------------------------
# Checkpoints.


def _checkpoint_manager(directory: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
      ),
  )


def _save(manager, step: int, state, meta: dict[str, Any]) -> None:
  manager.save(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(nnx.to_pure_dict(state)),
          meta=ocp.args.JsonSave(meta),
      ),
      force=True,
  )


def _restore(manager, step: int, state, shardings):
  pure = nnx.to_pure_dict(state)
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      pure,
      nnx.to_pure_dict(shardings),
  )
  restored = manager.restore(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
  )
  nnx.replace_by_pure_dict(state, restored["state"])
  return state, restored["meta"]


# ----------------------------------------------------------------------------
# The run.


def _machine() -> dict[str, Any]:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  return {
      "cpu": cpu,
      "cpu_count": os.cpu_count(),
      "devices": [str(d) for d in jax.devices()],
      "jax": jax.__version__,
      "python": platform.python_version(),
  }


def train(cfg: TrainConfig) -> dict[str, Any]:
  """Runs (or resumes) a whole training and returns its summary.

  Args:
    cfg: the run's configuration.

  Returns:
    A dict with ``initial_val_loss``, ``final_val_loss``, ``final_val_ppl``,
    ``tokens_per_s`` (steady state, compile excluded), ``steps``, ``tokens``,
    ``wall_time_s``, ``num_params``, ``state_bytes`` (this optimizer),
    ``adamw_state_bytes`` (what AdamW would need, via ``jax.eval_shape``),
    ``state_ratio``, ``out``, with ``cfg.sample`` the generated ``sample``
    text, and the trained ``graphdef`` and ``state`` (``nnx.merge(graphdef,
    state)`` gives back ``(model, optimizer)``).
  """
  out = cfg.out_dir()
  ckpt_dir = os.path.join(out, "checkpoints")
  os.makedirs(out, exist_ok=True)
  if not cfg.resume and os.path.isdir(ckpt_dir):
    print(f"Starting fresh: removing old checkpoints in {ckpt_dir} (--resume keeps them).")
    shutil.rmtree(ckpt_dir)

  # Data.
  tokenizer = data_lib.load_tokenizer(cfg.tokenizer)
  text = data_lib.read_corpus(cfg.data, cfg.data_dir)
  tokens = tokenizer.encode(text)
  model_cfg = cfg.model_config()
  if model_cfg.vocab_size < tokenizer.vocab_size:
    if "vocab_size" in cfg.model_overrides:
      raise ValueError(
          f"vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
          f"vocabulary ({tokenizer.vocab_size})."
      )
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
  seq_len = cfg.seq_len or model_cfg.max_seq_len
  dataset = data_lib.TokenDataset(tokens, seq_len, cfg.val_fraction)

  # Devices.
  sizes = sharding_lib.parse_mesh(cfg.mesh, jax.device_count())
  mesh = sharding_lib.make_mesh(sizes)
  if cfg.batch_size % sizes["fsdp"]:
    raise ValueError(
        f"batch_size ({cfg.batch_size}) must be divisible by the mesh's fsdp "
        f"size ({sizes['fsdp']})."
    )
  batch_sharding = sharding_lib.batch_sharding(mesh)
  put = lambda b: jax.device_put(b, batch_sharding)  # pylint: disable=unnecessary-lambda-assignment

  # Model and optimizer.
  lr = cfg.lr if cfg.lr is not None else optimizers_lib.DEFAULT_LR[cfg.optimizer]
  tx = make_optimizer(
      cfg.optimizer, lr, cfg.steps, warmup_fraction=cfg.warmup,
      weight_decay=cfg.weight_decay, clip=cfg.clip, b1=cfg.b1, b2=cfg.b2,
  )
  graphdef, state, shardings = create_state(model_cfg, tx, mesh, cfg.seed)
  params = nnx.state(nnx.merge(graphdef, state)[0], nnx.Param)
  abstract_params = foam_jax.memory.abstract(nnx.to_pure_dict(params))
  state_bytes = foam_jax.state_bytes(tx, abstract_params)
  adamw_bytes = foam_jax.state_bytes(optax.adamw(1e-3), abstract_params)
  num_params = foam_jax.memory.tree_size(abstract_params)
  del params

  train_step = make_train_step(graphdef, shardings, batch_sharding)
  eval_step = make_eval_step(graphdef, shardings, batch_sharding)
  schedule = optimizers_lib.schedule(lr, cfg.steps, cfg.warmup)

  # What a checkpoint must share with this run to continue it exactly.
  data_identity = {
      "seed": cfg.seed, "batch_size": cfg.batch_size, "seq_len": seq_len,
      "val_fraction": cfg.val_fraction, "corpus_tokens": int(len(tokens)),
      "corpus_crc32": zlib.crc32(np.asarray(tokens).tobytes()),
  }
  run_identity = {
      "optimizer": cfg.optimizer, "lr": lr, "steps": cfg.steps,
      "warmup": cfg.warmup, "weight_decay": cfg.weight_decay, "clip": cfg.clip,
      "b1": cfg.b1, "b2": cfg.b2, "model": dataclasses.asdict(model_cfg),
  }

  # Resume.
  manager = _checkpoint_manager(ckpt_dir)
  start_step, tokens_seen, elapsed_before = 0, 0, 0.0
  initial_val_loss = None
  if cfg.resume and manager.latest_step() is not None:
    start_step = manager.latest_step()
    state, meta = _restore(manager, start_step, state, shardings)
    if meta["data"] != data_identity:
      raise ValueError(
          f"--resume: the checkpoint's data stream {meta['data']} differs from "
          f"this run's {data_identity}; resume with the same data settings."
      )
    changed = {k: (meta.get("run", {}).get(k), v) for k, v in run_identity.items()
               if meta.get("run", {}).get(k) != v}
    if changed:
      print(f"--resume: settings differ from the checkpointed run's {changed} "
            "(old, new); the result will not match an uninterrupted run.")
    tokens_seen = meta["tokens"]
    elapsed_before = meta["wall_time"]
    initial_val_loss = meta.get("initial_val_loss")
    print(f"Resumed from {ckpt_dir} at step {start_step}.")
  elif cfg.resume:
    print(f"--resume: no checkpoint in {ckpt_dir}; starting fresh.")

  outputs_lib.write_json(os.path.join(out, "config.json"), {
      "train": dataclasses.asdict(cfg),
      "model": dataclasses.asdict(model_cfg),
      "lr": lr,
      "seq_len": seq_len,
      "mesh": sizes,
      "corpus_tokens": int(len(tokens)),
      "tokenizer": type(tokenizer).__name__,
      "machine": _machine(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "command": " ".join(sys.argv),
  })
  metrics = outputs_lib.MetricsLog(
      os.path.join(out, "metrics.jsonl"),
      keep_until_step=start_step if start_step else None,
  )

  print(
      f"LLaMA {cfg.preset}: {num_params / 1e6:.2f}M params, {cfg.optimizer} "
      f"(peak lr {lr:g}), {cfg.steps} steps x {cfg.batch_size} x {seq_len} "
      f"tokens, mesh {sizes}, corpus {len(tokens):,} tokens "
      f"({type(tokenizer).__name__}). Output: {out}"
  )

  t_start = time.perf_counter()
  tokens_per_step = cfg.batch_size * seq_len
  if start_step == 0:
    initial_val_loss = evaluate(eval_step, state, dataset, cfg.batch_size, cfg.eval_batches, put)
    metrics.append({
        "step": 0, "tokens": 0, "train_loss": None, "val_loss": initial_val_loss,
        "val_ppl": math.exp(initial_val_loss), "lr": float(schedule(0)),
        "wall_time": 0.0,
    })

  train_losses = []
  last_loss = float("nan")
  timed_s = 0.0
  val_loss = None
  bar = tqdm.tqdm(
      total=cfg.steps, initial=start_step, unit="step", disable=not cfg.progress,
      desc=f"{cfg.optimizer}", dynamic_ncols=True, mininterval=0.5,
  )
  step_t0 = time.perf_counter()
  for step in range(start_step, cfg.steps):
    batch = put(dataset.train_batch(cfg.batch_size, cfg.seed, step))
    state, loss = train_step(state, batch)
    train_losses.append(loss)
    tokens_seen += tokens_per_step
    done = step + 1
    if step == start_step:  # First call compiles: keep it out of tokens/s.
      last_loss = float(loss)
      step_t0 = time.perf_counter()
    elif done % cfg.log_every == 0 or done == cfg.steps:
      last_loss = float(loss)
      now = time.perf_counter()
      timed_s += now - step_t0
      step_t0 = now
    if done % cfg.log_every == 0 or done == cfg.steps:
      rate = (done - start_step - 1) * tokens_per_step / timed_s if timed_s > 0 else float("nan")
      bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
    bar.update(1)

    is_eval = done % cfg.eval_every == 0 or done == cfg.steps
    is_ckpt = done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)
    if is_eval or is_ckpt:
      jax.block_until_ready(state)  # The step's compute is training time.
      t0 = time.perf_counter()
      if is_eval:
        train_loss = float(np.mean(jax.device_get(train_losses))) if train_losses else None
        val_loss = evaluate(eval_step, state, dataset, cfg.batch_size, cfg.eval_batches, put)
        metrics.append({
            "step": done, "tokens": tokens_seen, "train_loss": train_loss,
            "val_loss": val_loss, "val_ppl": math.exp(val_loss),
            "lr": float(schedule(done)),
            "wall_time": elapsed_before + time.perf_counter() - t_start,
        })
        bar.write(
            f"step {done:6d}  tokens {tokens_seen:,}  train_loss {train_loss:.4f}"
            f"  val_loss {val_loss:.4f}  val_ppl {math.exp(val_loss):.2f}"
        )
        train_losses = []
      if is_ckpt:
        _save(manager, done, state, {
            "step": done, "tokens": tokens_seen,
            "data": data_identity,
            "wall_time": elapsed_before + time.perf_counter() - t_start,
            "initial_val_loss": initial_val_loss,
            "run": run_identity,
        })
      step_t0 += time.perf_counter() - t0  # Evaluations and checkpoints are not training time.
  bar.close()
  manager.wait_until_finished()
  manager.close()

  if val_loss is None:  # Resumed at the end: evaluate the restored state.
    val_loss = evaluate(eval_step, state, dataset, cfg.batch_size, cfg.eval_batches, put)
  wall = time.perf_counter() - t_start
  timed_tokens = (cfg.steps - start_step - 1) * tokens_per_step
  tokens_per_s = timed_tokens / timed_s if timed_s > 0 else float("nan")
  outputs_lib.plot_losses(
      os.path.join(out, "metrics.jsonl"), os.path.join(out, "loss.png"),
      title=f"LLaMA {cfg.preset}, {cfg.optimizer}",
  )

  summary = {
      "initial_val_loss": initial_val_loss,
      "final_val_loss": val_loss,
      "final_val_ppl": math.exp(val_loss),
      "tokens_per_s": tokens_per_s,
      "steps": cfg.steps,
      "tokens": tokens_seen,
      "wall_time_s": wall,
      "num_params": num_params,
      "state_bytes": state_bytes,
      "adamw_state_bytes": adamw_bytes,
      "state_ratio": state_bytes / adamw_bytes,
      "out": out,
  }
  if cfg.sample:
    model = nnx.merge(graphdef, state)[0]
    prompt_ids = tokenizer.encode(cfg.prompt) if cfg.prompt else np.zeros(1, np.int32)
    ids = generate_lib.generate(
        model, prompt_ids, cfg.sample, window=seq_len,
        temperature=cfg.temperature, seed=cfg.seed,
    )
    summary["sample"] = tokenizer.decode(ids)
  summary["state"] = state
  summary["graphdef"] = graphdef
  return summary


# ----------------------------------------------------------------------------
# Command line.


def _model_flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      description="Pre-train a LLaMA with FOAM in Flax NNX.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  d = TrainConfig()
  p.add_argument("--preset", default=d.preset, choices=sorted(configs_lib.PRESETS))
  p.add_argument("--optimizer", default=d.optimizer, choices=optimizers_lib.OPTIMIZERS)
  p.add_argument("--steps", type=int, default=d.steps)
  p.add_argument("--batch-size", type=int, default=d.batch_size)
  p.add_argument("--seq-len", type=int, default=None,
                 help="tokens per sequence (default: the preset's max_seq_len)")
  p.add_argument("--lr", type=float, default=None,
                 help=f"peak learning rate (default per optimizer: {optimizers_lib.DEFAULT_LR})")
  p.add_argument("--warmup", type=float, default=d.warmup,
                 help="fraction of steps in linear warmup")
  p.add_argument("--weight-decay", type=float, default=d.weight_decay)
  p.add_argument("--clip", type=float, default=d.clip,
                 help="global-norm gradient clipping; 0 disables")
  p.add_argument("--b1", type=float, default=d.b1)
  p.add_argument("--b2", type=float, default=d.b2)
  p.add_argument("--seed", type=int, default=d.seed)
  p.add_argument("--data", default=None, help="a UTF-8 text file to train on")
  p.add_argument("--data-dir", default=None, help="a folder of UTF-8 text files")
  p.add_argument("--tokenizer", default=None,
                 help="a SentencePiece .model file (needs `pip install sentencepiece`)")
  p.add_argument("--val-fraction", type=float, default=d.val_fraction)
  p.add_argument("--out", default=None,
                 help="output folder (default: runs/llama-<preset>-<optimizer>)")
  p.add_argument("--eval-every", type=int, default=d.eval_every)
  p.add_argument("--eval-batches", type=int, default=d.eval_batches)
  p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                 help="steps between checkpoints; 0: only at the end")
  p.add_argument("--resume", action="store_true",
                 help="continue from the latest checkpoint in --out")
  p.add_argument("--mesh", default=None,
                 help="device mesh, e.g. fsdp=2,tp=4 or fsdp=-1 (all devices)")
  p.add_argument("--sample", type=int, default=200,
                 help="generate this many tokens at the end (0: none)")
  p.add_argument("--temperature", type=float, default=d.temperature,
                 help="sampling temperature; 0 is greedy")
  p.add_argument("--prompt", default=d.prompt)
  p.add_argument("--log-every", type=int, default=d.log_every)
  p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
  model = p.add_argument_group("model (override the preset's fields)")
  for f in dataclasses.fields(configs_lib.LlamaConfig):
    if f.name == "remat":
      model.add_argument("--remat", action=argparse.BooleanOptionalAction, default=None)
    elif f.name in ("dtype", "param_dtype"):
      model.add_argument(_model_flag(f.name), default=None)
    elif f.name in ("rms_eps", "rope_theta", "init_std"):
      model.add_argument(_model_flag(f.name), type=float, default=None)
    else:
      model.add_argument(_model_flag(f.name), type=int, default=None)
  return p


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
  """Turns command-line flags into a :class:`TrainConfig`.

  Examples:
    >>> cfg = parse_args(["--optimizer", "adamw", "--num-layers", "2"])
    >>> cfg.optimizer, cfg.model_overrides
    ('adamw', {'num_layers': 2})
  """
  args = _parser().parse_args(argv)
  model_fields = [f.name for f in dataclasses.fields(configs_lib.LlamaConfig)]
  overrides = {n: getattr(args, n) for n in model_fields if getattr(args, n) is not None}
  kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
            if hasattr(args, f.name) and f.name not in ("progress",)}
  kwargs["model_overrides"] = overrides
  kwargs["progress"] = not args.no_progress
  cfg = TrainConfig(**kwargs)
  cfg.model_config()  # Validate the overrides now, with a clear message.
  return cfg


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Command-line entry point; returns the summary of :func:`train`."""
  cfg = parse_args(argv)
  summary = train(cfg)
  if "sample" in summary:
    print(f"--- sample ({cfg.sample} tokens, temperature {cfg.temperature}) ---")
    print(cfg.prompt + summary["sample"])
    print("---")
  mib = lambda b: b / 2**20  # pylint: disable=unnecessary-lambda-assignment
  print(
      f"initial val_loss {summary['initial_val_loss']:.4f} -> final "
      f"{summary['final_val_loss']:.4f} (perplexity {summary['final_val_ppl']:.2f}) "
      f"in {summary['wall_time_s']:.1f} s, " + (
          f"{summary['tokens_per_s']:,.0f} tokens/s"
          if math.isfinite(summary["tokens_per_s"]) else "no steps timed")
  )
  print(
      f"optimizer state: {mib(summary['state_bytes']):.3f} MiB for "
      f"{cfg.optimizer} vs {mib(summary['adamw_state_bytes']):.3f} MiB for "
      f"AdamW ({summary['state_ratio']:.1%})"
  )
  print(f"outputs: {summary['out']}/{{config.json,metrics.jsonl,loss.png,checkpoints}}")
  print(f"final val_loss {summary['final_val_loss']:.6f}")
  return summary


if __name__ == "__main__":
  main()
