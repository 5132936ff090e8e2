"""LLaMA model configurations: the CPU demo and the paper's sizes.

``PRESETS`` holds the ``tiny`` CPU demo (byte-level vocabulary of 256) and the
paper's LLaMA-20M ... 7B (vocabulary 32000, the T5/LLaMA SentencePiece size).
``get_config(name, **overrides)`` returns a preset with fields replaced.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

__all__ = ["LlamaConfig", "PRESETS", "get_config"]


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Shape and numerics of a LLaMA decoder.

  Attributes:
    vocab_size: number of token ids (256 for the byte tokenizer).
    hidden_size: width of the residual stream ``D``.
    intermediate_size: width of the SiLU-gated MLP ``F``.
    num_layers: number of decoder blocks.
    num_heads: query heads ``N``; ``hidden_size / num_heads`` is the head size.
    num_kv_heads: key/value heads ``K`` (grouped-query attention when
      ``K < N``); ``None`` means ``num_heads``.
    rms_eps: RMSNorm epsilon.
    rope_theta: base of the rotary position frequencies.
    max_seq_len: longest sequence the model is used with.
    dtype: compute dtype (activations, matmuls), e.g. ``"bfloat16"``.
    param_dtype: storage dtype of the weights.
    remat: recompute each block's activations in the backward pass
      (``jax.checkpoint``), trading compute for memory.
    init_std: standard deviation of the normal weight initialiser.

  Examples:
    >>> cfg = LlamaConfig(hidden_size=64, num_heads=4, num_kv_heads=2)
    >>> cfg.head_dim, cfg.num_kv_heads
    (16, 2)
  """

  vocab_size: int = 256
  hidden_size: int = 128
  intermediate_size: int = 352
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int | None = None
  rms_eps: float = 1e-6
  rope_theta: float = 10000.0
  max_seq_len: int = 128
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  init_std: float = 0.02

  def __post_init__(self):
    if self.num_kv_heads is None:
      object.__setattr__(self, "num_kv_heads", self.num_heads)
    for name in ("vocab_size", "hidden_size", "intermediate_size",
                 "num_layers", "num_heads", "num_kv_heads", "max_seq_len"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"LlamaConfig.{name} must be a positive int, got {value!r}."
        )
    for name in ("rms_eps", "rope_theta", "init_std"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f"LlamaConfig.{name} must be a positive number, got {value!r}."
        )
    if self.hidden_size % self.num_heads:
      raise ValueError(
          f"LlamaConfig.hidden_size ({self.hidden_size}) must be divisible by "
          f"num_heads ({self.num_heads})."
      )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"LlamaConfig.num_heads ({self.num_heads}) must be divisible by "
          f"num_kv_heads ({self.num_kv_heads})."
      )
    if self.head_dim % 2:
      raise ValueError(
          f"LlamaConfig head size hidden_size / num_heads = {self.head_dim} "
          "must be even for rotary embeddings."
      )
    for name in ("dtype", "param_dtype"):
      value = getattr(self, name)
      try:
        jnp.dtype(value)
      except TypeError:
        raise ValueError(
            f"LlamaConfig.{name} must name a dtype (e.g. 'float32', "
            f"'bfloat16'), got {value!r}."
        ) from None
    if not isinstance(self.remat, bool):
      raise TypeError(f"LlamaConfig.remat must be a bool, got {self.remat!r}.")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def num_params(self) -> int:
    """Number of weights (embeddings and lm_head included).

    Examples:
      >>> PRESETS["60m"].num_params()
      58073600
    """
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    kv = self.num_kv_heads * self.head_dim
    attn = 2 * d * d + 2 * d * kv
    block = attn + 3 * d * f + 2 * d
    return self.num_layers * block + 2 * v * d + d


def _paper(hidden, intermediate, layers, heads, remat=False) -> LlamaConfig:
  # The paper trains in BF16: bf16 compute, float32 master weights here.
  return LlamaConfig(
      vocab_size=32000,
      hidden_size=hidden,
      intermediate_size=intermediate,
      num_layers=layers,
      num_heads=heads,
      max_seq_len=256,
      dtype="bfloat16",
      param_dtype="float32",
      remat=remat,
  )


PRESETS: dict[str, LlamaConfig] = {
    # The CPU demo: byte-level, ~0.9M weights; a few hundred steps on 2 cores
    # take about two minutes. Every fold axis (128, 352) stays divisible by
    # 4 * 2 (fsdp) and 4 * 4 (tp) so FOAM's level-2 blocks fit any such mesh.
    "tiny": LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=352,
        num_layers=4,
        num_heads=4,
        max_seq_len=128,
    ),
    # The paper's table (arXiv 2512.07112; GaLore's LLaMA configs).
    "20m": _paper(256, 688, 4, 4),
    "60m": _paper(512, 1376, 8, 8),
    "130m": _paper(768, 2048, 12, 12),
    "350m": _paper(1024, 2736, 24, 16),
    "1b": _paper(2048, 5461, 24, 32, remat=True),
    "3b": _paper(2560, 6848, 32, 32, remat=True),
    "7b": _paper(4096, 11008, 32, 32, remat=True),
}


def get_config(name: str, **overrides) -> LlamaConfig:
  """A preset with some fields replaced.

  Args:
    name: a key of ``PRESETS``.
    **overrides: ``LlamaConfig`` fields to replace.

  Returns:
    The ``LlamaConfig``.

  Raises:
    ValueError: unknown preset or field, or an invalid value.

  Examples:
    >>> get_config("tiny", num_layers=2).num_layers
    2
    >>> get_config("7b").hidden_size
    4096
  """
  if name not in PRESETS:
    raise ValueError(
        f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}."
    )
  fields = {f.name for f in dataclasses.fields(LlamaConfig)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(
        f"Unknown LlamaConfig field(s) {unknown}; valid fields: {sorted(fields)}."
    )
  preset = PRESETS[name]
  if ("num_heads" in overrides and "num_kv_heads" not in overrides
      and preset.num_kv_heads == preset.num_heads):
    overrides["num_kv_heads"] = None  # Keep plain multi-head attention.
  return dataclasses.replace(preset, **overrides)
