"""The run's configuration, and the command line generated from it.

Every ``TrainConfig`` field is a flag (``batch_size`` -> ``--batch-size``)
whose help is the field's ``help`` metadata; every ``LlamaConfig`` field is a
model flag that overrides the preset (``--num-layers 2``). A bad value ends
the parser with one ``error: ...`` line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from examples.llama import configs as configs_lib
from examples.llama import optimizers as optimizers_lib

__all__ = ["MOMENT_DTYPE_CHOICES", "TrainConfig", "make_parser", "parse_args"]

MOMENT_DTYPE_CHOICES = ("float32", "bfloat16", "int8")


def _field(default: Any, help: str, **flag: Any) -> Any:  # noqa: A002
  """A dataclass field whose metadata describes its command-line flag."""
  if isinstance(default, dict):
    return dataclasses.field(default_factory=dict, metadata={"help": help, **flag})
  return dataclasses.field(default=default, metadata={"help": help, **flag})


@dataclasses.dataclass
class TrainConfig:
  """Everything a training run needs; ``parse_args`` builds one from flags.

  Examples:
    >>> cfg = TrainConfig(steps=10, model_overrides={"num_layers": 2})
    >>> cfg.model_config().num_layers, cfg.out_dir()
    (2, 'runs/llama-tiny-foam')
  """

  preset: str = _field("tiny", "a model preset", choices=sorted(configs_lib.PRESETS))
  model_overrides: dict[str, Any] = _field({}, "LlamaConfig fields replacing the preset's",
                                           flag=False)
  optimizer: str = _field("foam", "the optimizer family", choices=optimizers_lib.OPTIMIZERS)
  steps: int = _field(300, "optimizer steps (the schedule's horizon)")
  batch_size: int = _field(16, "sequences per step")
  seq_len: int | None = _field(
      None, "tokens per sequence (default: the preset's max_seq_len)", type=int)
  lr: float | None = _field(
      None, f"peak learning rate (default per optimizer: {optimizers_lib.DEFAULT_LR})",
      type=float)
  warmup: float = _field(0.1, "fraction of steps in linear warmup")
  weight_decay: float = _field(0.0, "decoupled weight decay (paper: 0)")
  clip: float = _field(0.0, "global-norm gradient clipping; 0 disables")
  b1: float = _field(0.9, "first-moment decay")
  b2: float = _field(0.95, "second-moment decay (paper: 0.95)")
  mu_dtype: str | None = _field(
      None, "storage dtype of the first moment (default: the params'); int8 is "
      "blockwise 8-bit, FOAM-family optimizers only", choices=MOMENT_DTYPE_CHOICES)
  nu_dtype: str | None = _field(
      None, "storage dtype of the second moment (default: the params'); for FOAM "
      "and FOAM-Mini", choices=MOMENT_DTYPE_CHOICES)
  fold_level: int | None = _field(
      None, "FOAM's fold level: blocks of 2**level entries (default: 2); for foam, "
      "foam_muon and foam_lion", type=int)
  fold_axis: int | None = _field(
      None, "the axis FOAM folds (default -2, a Flax kernel's input axis; -1: the last "
      "axis); for foam and foam_mini", type=int, choices=optimizers_lib.FOLD_AXES)
  seed: int = _field(0, "seeds the weights and the training batches")
  data: str | None = _field(None, "a UTF-8 text file to train on")
  data_dir: str | None = _field(None, "a folder of UTF-8 text files")
  tokenizer: str | None = _field(
      None, "a SentencePiece .model file (needs `pip install sentencepiece`); "
      "default: bytes")
  val_fraction: float | None = _field(
      None, "tail fraction of the token stream held out (default 0.05; with --dataset, "
      "the dataset's)", type=float)
  dataset: str | None = _field(
      None, "a folder made by prepare_data.py: memory-mapped token shards (its "
      "metadata.json defines the tokenizer and the split)")
  out: str | None = _field(None, "output folder (default: runs/llama-<preset>-<optimizer>)")
  eval_every: int = _field(50, "steps between validation evaluations")
  eval_batches: int = _field(8, "batches per validation evaluation")
  checkpoint_every: int = _field(100, "steps between checkpoints; 0: only at the end")
  resume: bool = _field(False, "continue from the latest checkpoint in --out",
                        action="store_true")
  mesh: str | None = _field(None, "device mesh, e.g. fsdp=2,tp=4 or fsdp=-1 (all devices)")
  coordinator: str | None = _field(None, "HOST:PORT of process 0 (multi-process runs)")
  num_processes: int | None = _field(None, "processes in the run (with --coordinator)",
                                     type=int)
  process_id: int | None = _field(None, "this process's index (with --coordinator)",
                                  type=int)
  distributed: bool = _field(False, "join a TPU pod or SLURM / Open MPI cluster through "
                             "jax.distributed.initialize()'s auto-detection",
                             action="store_true")
  sample: int = _field(0, "generate this many tokens at the end (0: none)", cli_default=200)
  temperature: float = _field(0.0, "sampling temperature; 0 is greedy")
  prompt: str = _field("The ", "text the sample starts from")
  log_every: int = _field(10, "steps between progress-bar updates (each one syncs)")
  progress: bool = _field(True, "hide the progress bar", flag_name="--no-progress",
                          action="store_false")

  def __post_init__(self):
    if self.optimizer not in optimizers_lib.OPTIMIZERS:
      raise ValueError(
          f"optimizer must be one of {optimizers_lib.OPTIMIZERS}, got {self.optimizer!r}.")
    if self.preset not in configs_lib.PRESETS:
      raise ValueError(
          f"preset must be one of {sorted(configs_lib.PRESETS)}, got {self.preset!r}.")
    for name in ("steps", "batch_size", "eval_every", "eval_batches", "log_every"):
      _check_int(name, getattr(self, name), minimum=1)
    for name in ("checkpoint_every", "sample"):
      _check_int(name, getattr(self, name), minimum=0)
    if self.seq_len is not None:
      _check_int("seq_len", self.seq_len, minimum=1)
    if self.lr is not None and not self.lr > 0:
      raise ValueError(f"lr must be a positive number, got {self.lr!r}.")
    if not 0.0 <= self.warmup <= 1.0:
      raise ValueError(f"warmup must be in [0, 1], got {self.warmup!r}.")
    if self.val_fraction is not None and not 0.0 < self.val_fraction < 1.0:
      raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}.")
    if self.weight_decay < 0 or self.clip < 0:
      raise ValueError("weight_decay and clip must be >= 0.")
    for name, value in self.optimizer_settings().items():
      check = (optimizers_lib.check_fold_settings if name.startswith("fold_")
               else optimizers_lib.check_moment_dtypes)
      try:
        check(self.optimizer, **{name: value})
      except ValueError as e:
        raise ValueError(f"--{name.replace('_', '-')} {value}: {e}") from None

  def moment_dtypes(self) -> dict[str, str]:
    """The ``mu_dtype``/``nu_dtype`` settings given (for ``make_optimizer``)."""
    return {k: v for k in ("mu_dtype", "nu_dtype")
            if (v := getattr(self, k)) is not None}

  def optimizer_settings(self) -> dict[str, Any]:
    """The moment dtypes and fold settings given (for ``make_optimizer``)."""
    return {**self.moment_dtypes(),
            **{k: v for k in ("fold_level", "fold_axis") if (v := getattr(self, k)) is not None}}

  def moment_dtypes_label(self) -> str:
    """The moments' storage, e.g. ``mu int8, nu float32 (params')``."""
    allowed = optimizers_lib.MOMENT_DTYPES[self.optimizer]
    params = self.model_config().param_dtype
    return ", ".join(
        f"{k[:2]} " + (getattr(self, k) or f"{params} (params')") for k in allowed)

  def model_config(self) -> configs_lib.LlamaConfig:
    """The preset with ``model_overrides`` (and ``seq_len``) applied."""
    overrides = dict(self.model_overrides)
    if self.seq_len is not None:
      overrides.setdefault("max_seq_len", self.seq_len)
    return configs_lib.get_config(self.preset, **overrides)

  def out_dir(self) -> str:
    """``out``, or ``runs/llama-<preset>-<optimizer>``."""
    return self.out or os.path.join("runs", f"llama-{self.preset}-{self.optimizer}")


def _check_int(name: str, value: Any, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    raise ValueError(f"{name} must be {what}, got {value!r}.")


def _add_flag(group, name: str, default: Any, meta: dict[str, Any]) -> None:
  flag = meta.get("flag_name", "--" + name.replace("_", "-"))
  kwargs = {"dest": name, "help": meta.get("help")}
  if "action" in meta:
    kwargs.update(action=meta["action"], default=default)
  else:
    kwargs.update(default=meta.get("cli_default", default),
                  type=meta.get("type", type(default) if default is not None else str))
    if "choices" in meta:
      kwargs["choices"] = meta["choices"]
  group.add_argument(flag, **kwargs)


def make_parser() -> argparse.ArgumentParser:
  """The parser: one flag per ``TrainConfig`` and ``LlamaConfig`` field."""
  parser = argparse.ArgumentParser(
      description="Pre-train a LLaMA with FOAM in Flax NNX.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  defaults = TrainConfig()
  for f in dataclasses.fields(TrainConfig):
    if f.metadata.get("flag", True):
      _add_flag(parser, f.name, getattr(defaults, f.name), dict(f.metadata))
  model = parser.add_argument_group("model (override the preset's fields)")
  for f in dataclasses.fields(configs_lib.LlamaConfig):
    default = f.default
    if isinstance(default, bool):
      model.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                         action=argparse.BooleanOptionalAction)
    else:
      model.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                         type=int if default is None else type(default))
  return parser


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
  """Turns command-line flags into a checked :class:`TrainConfig`.

  A value the config or the model rejects exits through ``parser.error``:
  one ``error: ...`` line and status 2, no traceback.

  Examples:
    >>> cfg = parse_args(["--optimizer", "adamw", "--num-layers", "2"])
    >>> cfg.optimizer, cfg.model_overrides, cfg.sample
    ('adamw', {'num_layers': 2}, 200)
  """
  parser = make_parser()
  args = vars(parser.parse_args(argv))
  model_fields = [f.name for f in dataclasses.fields(configs_lib.LlamaConfig)]
  overrides = {n: args.pop(n) for n in model_fields if args[n] is not None}
  for n in model_fields:
    args.pop(n, None)
  try:
    cfg = TrainConfig(model_overrides=overrides, **args)
    cfg.model_config()  # Check the overrides now.
  except ValueError as e:
    parser.error(str(e))
  return cfg
