"""LLaMA in Flax NNX: pre-norm decoder, RMSNorm, rotary attention, SwiGLU.

Parameter names follow the Hugging Face LLaMA (``embed_tokens``, ``layers``,
``q_proj``, ..., ``norm``, ``lm_head``), so FOAM's default policy leaves
``embed_tokens`` and ``lm_head`` with Adam's moments and folds the rest.
Every kernel is 2-D ``(in, out)``; FOAM folds axis ``-2``, the input axis.

Shapes carry their axes in their names: ``B`` batch, ``T`` sequence, ``D``
hidden, ``F`` MLP width, ``N`` query heads, ``K`` key/value heads, ``H`` head
size, ``V`` vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from examples.llama import configs as configs_lib

__all__ = ["Llama", "SHARDING", "abstract_params", "rope"]

# Every weight's PartitionSpec over the mesh axes ("fsdp", "tp"), in one place.
# Column-parallel kernels (D -> more) split their output over "tp";
# row-parallel ones (more -> D) split their input; "fsdp" shards the other
# axis of every matrix. Norm scales are replicated.
SHARDING: dict[str, tuple[str | None, ...]] = {
    "embed_tokens": ("tp", "fsdp"),  # (V, D)
    "q_proj": ("fsdp", "tp"),  # (D, N*H)
    "k_proj": ("fsdp", "tp"),  # (D, K*H)
    "v_proj": ("fsdp", "tp"),  # (D, K*H)
    "o_proj": ("tp", "fsdp"),  # (N*H, D)
    "gate_proj": ("fsdp", "tp"),  # (D, F)
    "up_proj": ("fsdp", "tp"),  # (D, F)
    "down_proj": ("tp", "fsdp"),  # (F, D)
    "norm": (None,),  # (D,): every RMSNorm scale
    "lm_head": ("fsdp", "tp"),  # (D, V)
}


def _init(cfg: configs_lib.LlamaConfig, name: str):
  return nnx.with_partitioning(
      nnx.initializers.normal(cfg.init_std), SHARDING[name]
  )


def _linear(cfg, name, d_in, d_out, rngs) -> nnx.Linear:
  return nnx.Linear(
      d_in,
      d_out,
      use_bias=False,
      kernel_init=_init(cfg, name),
      dtype=jnp.dtype(cfg.dtype),
      param_dtype=jnp.dtype(cfg.param_dtype),
      rngs=rngs,
  )


def _norm(cfg, rngs) -> nnx.RMSNorm:
  return nnx.RMSNorm(
      cfg.hidden_size,
      epsilon=cfg.rms_eps,
      scale_init=nnx.with_partitioning(nnx.initializers.ones, SHARDING["norm"]),
      dtype=jnp.dtype(cfg.dtype),
      param_dtype=jnp.dtype(cfg.param_dtype),
      rngs=rngs,
  )


def rope(x_BTNH: jax.Array, positions_T: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding (LLaMA's rotate-half form), in float32.

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.ones((1, 3, 1, 4))
    >>> y = rope(x, jnp.arange(3), 10000.0)
    >>> bool(jnp.allclose(y[0, 0], x[0, 0]))  # position 0 is unrotated
    True
  """
  h = x_BTNH.shape[-1] // 2
  freq_h = theta ** (-jnp.arange(h, dtype=jnp.float32) / h)
  angle_TH = positions_T.astype(jnp.float32)[:, None] * freq_h[None, :]
  sin = jnp.sin(angle_TH)[None, :, None, :]
  cos = jnp.cos(angle_TH)[None, :, None, :]
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTNH.dtype)


class Attention(nnx.Module):
  """Causal self-attention with rotary positions and grouped-query heads."""

  def __init__(self, cfg: configs_lib.LlamaConfig, *, rngs: nnx.Rngs):
    d, h = cfg.hidden_size, cfg.head_dim
    self.cfg = cfg
    self.q_proj = _linear(cfg, "q_proj", d, cfg.num_heads * h, rngs)
    self.k_proj = _linear(cfg, "k_proj", d, cfg.num_kv_heads * h, rngs)
    self.v_proj = _linear(cfg, "v_proj", d, cfg.num_kv_heads * h, rngs)
    self.o_proj = _linear(cfg, "o_proj", cfg.num_heads * h, d, rngs)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    cfg = self.cfg
    b, t, _ = x_BTD.shape
    positions_T = jnp.arange(t)
    q_BTNH = self.q_proj(x_BTD).reshape(b, t, cfg.num_heads, cfg.head_dim)
    k_BTKH = self.k_proj(x_BTD).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    v_BTKH = self.v_proj(x_BTD).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    q_BTNH = rope(q_BTNH, positions_T, cfg.rope_theta)
    k_BTKH = rope(k_BTKH, positions_T, cfg.rope_theta)
    out_BTNH = jax.nn.dot_product_attention(q_BTNH, k_BTKH, v_BTKH, is_causal=True)
    return self.o_proj(out_BTNH.reshape(b, t, cfg.num_heads * cfg.head_dim))


class MLP(nnx.Module):
  """SiLU-gated MLP: ``down(silu(gate(x)) * up(x))``."""

  def __init__(self, cfg: configs_lib.LlamaConfig, *, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = _linear(cfg, "gate_proj", d, f, rngs)
    self.up_proj = _linear(cfg, "up_proj", d, f, rngs)
    self.down_proj = _linear(cfg, "down_proj", f, d, rngs)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    return self.down_proj(nnx.silu(self.gate_proj(x_BTD)) * self.up_proj(x_BTD))


class Block(nnx.Module):
  """Pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

  def __init__(self, cfg: configs_lib.LlamaConfig, *, rngs: nnx.Rngs):
    self.input_layernorm = _norm(cfg, rngs)
    self.self_attn = Attention(cfg, rngs=rngs)
    self.post_attention_layernorm = _norm(cfg, rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    x_BTD = x_BTD + self.self_attn(self.input_layernorm(x_BTD))
    return x_BTD + self.mlp(self.post_attention_layernorm(x_BTD))


def _apply_block(block: Block, x_BTD: jax.Array) -> jax.Array:
  return block(x_BTD)


_apply_block_remat = nnx.remat(_apply_block)


class Llama(nnx.Module):
  """A LLaMA decoder: ``tokens (B, T) int -> logits (B, T, V) float32``.

  Examples:
    >>> cfg = configs_lib.get_config("tiny", num_layers=1, hidden_size=32,
    ...                              intermediate_size=64, num_heads=2)
    >>> with nnx.use_eager_sharding(False):
    ...   model = Llama(cfg, rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 8), jnp.int32)).shape
    (2, 8, 256)
  """

  def __init__(self, config: configs_lib.LlamaConfig, *, rngs: nnx.Rngs):
    if not isinstance(config, configs_lib.LlamaConfig):
      raise TypeError(
          f"config must be a LlamaConfig, got {type(config).__name__}."
      )
    cfg = self.config = config
    self.embed_tokens = nnx.Embed(
        cfg.vocab_size,
        cfg.hidden_size,
        embedding_init=_init(cfg, "embed_tokens"),
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        rngs=rngs,
    )
    self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.norm = _norm(cfg, rngs)
    self.lm_head = _linear(cfg, "lm_head", cfg.hidden_size, cfg.vocab_size, rngs)

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    x_BTD = self.embed_tokens(tokens_BT)
    apply = _apply_block_remat if self.config.remat else _apply_block
    for block in self.layers:
      x_BTD = apply(block, x_BTD)
    return self.lm_head(self.norm(x_BTD)).astype(jnp.float32)


def abstract_params(config: configs_lib.LlamaConfig) -> nnx.State:
  """The weights of ``Llama(config)`` as ``jax.ShapeDtypeStruct``s, unallocated.

  ``nnx.eval_shape`` traces the constructor: a 7B model's shapes take
  milliseconds and no memory. The dtype is ``config.param_dtype``.

  Examples:
    >>> params = abstract_params(configs_lib.get_config("7b"))
    >>> params["lm_head"]["kernel"].shape
    (4096, 32000)
  """
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: Llama(config, rngs=nnx.Rngs(0)))
  return nnx.state(model, nnx.Param)
