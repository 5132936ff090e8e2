"""Small models in the layouts people train with, and what FOAM should fold in each.

Each builder returns ``(params, expected)``: the tree the stack hands
``tx.init`` (built with the stack's own idioms), and ``[(path fragment,
axis)]`` where ``axis`` is the parameter axis FOAM should fold (counted from
0) or ``None`` for Adam's moments. The first fragment found in a leaf's
tree path applies.
"""

from __future__ import annotations

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

LAYERS, EMBED, HEADS, HEAD_DIM, MLP, VOCAB = 4, 64, 4, 16, 128, 256

# --- Flax NNX -------------------------------------------------------------


def _part(init, names):
  return nnx.with_partitioning(init, names)


class NnxBlock(nnx.Module):
  """A pre-norm MLP block whose every parameter has logical axis names."""

  def __init__(self, rngs: nnx.Rngs):
    kernel = nnx.initializers.lecun_normal()
    self.norm = nnx.RMSNorm(EMBED, scale_init=_part(nnx.initializers.ones, ("embed",)),
                            rngs=rngs)
    self.up = nnx.Linear(EMBED, MLP, kernel_init=_part(kernel, ("embed", "mlp")),
                         bias_init=_part(nnx.initializers.zeros, ("mlp",)), rngs=rngs)
    self.down = nnx.Linear(MLP, EMBED, kernel_init=_part(kernel, ("mlp", "embed")),
                           use_bias=False, rngs=rngs)

  def __call__(self, x):
    return x + self.down(jax.nn.relu(self.up(self.norm(x))))


class NnxScanned(nnx.Module):
  """Layers stacked by ``nnx.vmap`` and run by ``nnx.scan``, axis named ``layers``."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, EMBED, embedding_init=_part(
        nnx.initializers.normal(), ("vocab", "embed")), rngs=rngs)

    @nnx.split_rngs(splits=LAYERS)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(rngs):
      return NnxBlock(rngs)

    self.layers = make(rngs)
    self.lm_head = nnx.Linear(EMBED, VOCAB, kernel_init=_part(
        nnx.initializers.lecun_normal(), ("embed", "vocab")), use_bias=False, rngs=rngs)

  def __call__(self, tokens):
    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry,
              transform_metadata={nnx.PARTITION_NAME: "layers"})
    def body(block, x):
      return block(x)

    return self.lm_head(body(self.layers, self.embed(tokens)))


class NnxPlain(nnx.Module):
  """An unscanned NNX model without axis names: the control."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, EMBED, rngs=rngs)
    self.up = nnx.Linear(EMBED, MLP, rngs=rngs)
    self.down = nnx.Linear(MLP, EMBED, rngs=rngs)
    self.norm = nnx.RMSNorm(EMBED, rngs=rngs)
    self.lm_head = nnx.Linear(EMBED, VOCAB, use_bias=False, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    return self.lm_head(self.norm(x + self.down(jax.nn.relu(self.up(x)))))


def nnx_scanned():
  with nnx.use_eager_sharding(False):
    model = NnxScanned(nnx.Rngs(0))
  return model, [("embed", None), ("lm_head", None), ("norm", None), ("bias", None),
                 ("up", 1), ("down", 1)]


def nnx_plain():
  model = NnxPlain(nnx.Rngs(0))
  return model, [("embed", None), ("lm_head", None), ("norm", None), ("bias", None),
                 ("up", 0), ("down", 0)]


# --- Flax Linen, scanned as MaxText does ------------------------------------


def _logical(init, names):
  return nn.with_logical_partitioning(init, names)


class LinenBlock(nn.Module):
  """MaxText-style: logical names on every parameter, attention as DenseGeneral."""

  @nn.compact
  def __call__(self, x, _):
    kernel = nn.initializers.lecun_normal()
    scale = self.param("pre_norm", _logical(nn.initializers.ones, ("norm",)), (EMBED,))
    h = x * scale
    q = nn.DenseGeneral((HEADS, HEAD_DIM), kernel_init=_logical(kernel, ("embed", "heads", "kv")),
                        use_bias=False, name="query")(h)
    h = h + nn.DenseGeneral(EMBED, axis=(-2, -1), use_bias=False, name="out",
                            kernel_init=_logical(kernel, ("heads", "kv", "embed")))(q)
    up = nn.Dense(MLP, kernel_init=_logical(kernel, ("embed", "mlp")), use_bias=False,
                  name="wi")(h)
    return h + nn.Dense(EMBED, kernel_init=_logical(kernel, ("mlp", "embed")),
                        use_bias=False, name="wo")(nn.relu(up)), None


class LinenScanned(nn.Module):
  """Token embedder, ``nn.scan`` decoder (params on ``param_scan_axis``), logits head."""

  param_scan_axis: int = 0

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, EMBED, embedding_init=_logical(nn.initializers.normal(),
                                                       ("vocab", "embed")),
                 name="token_embedder")(tokens)
    stack = nn.scan(LinenBlock, variable_axes={"params": self.param_scan_axis},
                    split_rngs={"params": True}, length=LAYERS,
                    metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = stack(name="layers")(x, None)
    return nn.Dense(VOCAB, kernel_init=_logical(nn.initializers.lecun_normal(),
                                                ("embed", "vocab")),
                    use_bias=False, name="logits_dense")(x)


def linen_scanned(param_scan_axis: int):
  """Boxed params (``LogicallyPartitioned``), as MaxText's ``TrainState.create`` gets them."""
  model = LinenScanned(param_scan_axis=param_scan_axis)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((2, 8), jnp.int32))["params"]
  first = 1 if param_scan_axis == 0 else 0  # The first axis that is not `layers`.
  return model, params, [("token_embedder", None), ("logits_dense", None),
                         ("pre_norm", None), ("query", first), ("out", first),
                         ("wi", first), ("wo", first)]


# --- haliax (Levanter's layout) --------------------------------------------

Layers = hax.Axis("layers", LAYERS)
Embed = hax.Axis("embed", EMBED)
Heads = hax.Axis("heads", HEADS)
HeadSize = hax.Axis("head_size", HEAD_DIM)
Mlp = hax.Axis("mlp", MLP)
Vocab = hax.Axis("vocab", VOCAB)


class HaliaxLayer(eqx.Module):
  """Levanter's Llama layer, reduced: (Out..., In...) weights, named axes."""

  attn_norm: hnn.RmsNorm
  q_proj: hnn.Linear
  o_proj: hnn.Linear
  mlp_norm: hnn.RmsNorm
  up_proj: hnn.Linear
  down_proj: hnn.Linear

  @staticmethod
  def init(*, key):
    k = jax.random.split(key, 4)
    return HaliaxLayer(
        hnn.RmsNorm.init(Embed, use_bias=False),
        hnn.Linear.init(In=Embed, Out=(Heads, HeadSize), key=k[0], use_bias=False),
        hnn.Linear.init(In=(Heads, HeadSize), Out=Embed, key=k[1], use_bias=False),
        hnn.RmsNorm.init(Embed, use_bias=False),
        hnn.Linear.init(In=Embed, Out=Mlp, key=k[2], use_bias=False),
        hnn.Linear.init(In=Mlp, Out=Embed, key=k[3], use_bias=False))

  def __call__(self, x):
    q = self.q_proj(self.attn_norm(x))
    x = x + self.o_proj(q)
    return x + self.down_proj(hnn.relu(self.up_proj(self.mlp_norm(x))))


class HaliaxModel(eqx.Module):
  embeddings: hnn.Embedding
  layers: hnn.Stacked
  norm: hnn.RmsNorm
  lm_head: hnn.Linear

  @staticmethod
  def init(key):
    k = jax.random.split(key, 3)
    return HaliaxModel(
        hnn.Embedding.init(Vocab, Embed, key=k[0]),
        hnn.Stacked.init(Layers, HaliaxLayer)(key=jax.random.split(k[1], LAYERS)),
        hnn.RmsNorm.init(Embed, use_bias=False),
        hnn.Linear.init(In=Embed, Out=Vocab, key=k[2], use_bias=False))

  def __call__(self, tokens):
    x = self.layers.fold(self.embeddings.embed(tokens))
    return self.lm_head(self.norm(x))


def haliax_model():
  """``eqx.filter(model, is_inexact_array)``, as Levanter hands it to the optimizer."""
  model = HaliaxModel.init(jax.random.PRNGKey(0))
  # Weights: q_proj (layers, heads, head_size, embed), o_proj (layers, embed,
  # heads, head_size), up (layers, mlp, embed), down (layers, embed, mlp).
  return model, [("embeddings", None), ("lm_head", None), ("norm", None),
                 ("q_proj", 3), ("o_proj", 3), ("up_proj", 2), ("down_proj", 2)]


# --- Equinox ------------------------------------------------------------------


def equinox_mlp():
  model = eqx.nn.MLP(in_size=32, out_size=8, width_size=64, depth=2,
                     key=jax.random.PRNGKey(0))
  return model, [("bias", None), ("weight", 1)]


class EqxBlock(eqx.Module):
  norm: eqx.nn.LayerNorm
  attention: eqx.nn.MultiheadAttention
  up: eqx.nn.Linear
  down: eqx.nn.Linear

  def __init__(self, key):
    k = jax.random.split(key, 3)
    self.norm = eqx.nn.LayerNorm(EMBED)
    self.attention = eqx.nn.MultiheadAttention(HEADS, EMBED, key=k[0])
    self.up = eqx.nn.Linear(EMBED, MLP, key=k[1])
    self.down = eqx.nn.Linear(MLP, EMBED, key=k[2])

  def __call__(self, x):
    h = jax.vmap(self.norm)(x)
    x = x + self.attention(h, h, h)
    return x + jax.vmap(self.down)(jax.nn.relu(jax.vmap(self.up)(x)))


class EqxTransformer(eqx.Module):
  """Equinox's scan-over-layers idiom: blocks stacked by ``eqx.filter_vmap``."""

  embedding: eqx.nn.Embedding
  blocks: EqxBlock
  unembed: eqx.nn.Linear

  def __init__(self, key):
    k = jax.random.split(key, 3)
    self.embedding = eqx.nn.Embedding(VOCAB, EMBED, key=k[0])
    self.blocks = eqx.filter_vmap(EqxBlock)(jax.random.split(k[1], LAYERS))
    self.unembed = eqx.nn.Linear(EMBED, VOCAB, use_bias=False, key=k[2])

  def __call__(self, tokens):
    x = jax.vmap(self.embedding)(tokens)
    dynamic, static = eqx.partition(self.blocks, eqx.is_array)

    def body(x, block):
      return eqx.combine(block, static)(x), None

    x, _ = jax.lax.scan(body, x, dynamic)
    return jax.vmap(self.unembed)(x)


def equinox_transformer():
  model = EqxTransformer(jax.random.PRNGKey(0))
  # Stacked (layers, out, in) weights fold `in` (axis 2); stacked norms and
  # biases (layers, d) keep Adam's moments, as the embedding and `unembed`.
  return model, [("embedding", None), ("unembed", None), ("norm", None),
                 ("bias", None), ("weight", 2)]
