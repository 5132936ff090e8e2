"""int8 moments where the stack names the axes and init cannot see the mesh.

Each stack's own idiom, with the sharded axis the weight's last (an attention
output projection ``(heads, head_dim, embed)`` sharded on ``embed``):
Linen boxes read by ``nn.get_sharding(jax.eval_shape(init), mesh)`` then
``jax.jit(init, out_shardings=...)`` (nanodo), logical names mapped by rules
(MaxText), NNX ``Variable`` metadata read by ``nnx.get_partition_spec``, and
haliax axis mappings. The int8 scales' last axis must stay divisible by the
mesh axis its name stands for (init raised ``IndivisibleError`` before), and
the compiled step must hold no collective, on 2 and 4 devices.
"""

from __future__ import annotations

import flax.linen as nn
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import foam_jax
from benchmarks.hlo import count_collectives

HEADS, HEAD_DIM, EMBED, VOCAB = 4, 8, 256, 64


def _tx(name: str = "foam"):
  if name == "foam_lion":
    return foam_jax.foam_lion(1e-4, mu_dtype=jnp.int8)
  if name == "foam_muon":
    return foam_jax.foam_muon(1e-3, mu_dtype=jnp.int8)
  return foam_jax.foam(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8)


def _mesh(devices: int) -> Mesh:
  return Mesh(np.array(jax.devices()[:devices]), ("fsdp",))


def _no_collectives(compiled) -> None:
  counts = count_collectives(compiled.as_text())
  assert not any(counts.values()), counts


def _scales(tree):
  """Every int8 scales array under ``tree`` (boxes, Variables, NamedArrays unwrapped)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return [x for path, x in leaves if "scales" in jax.tree_util.keystr(path)]


class _Attention(nn.Module):
  logical: bool = False

  @nn.compact
  def __call__(self, x):
    if self.logical:
      out_init = nn.with_logical_partitioning(
          nn.initializers.normal(), ("heads", "kv", "embed"))
      table_init = nn.with_logical_partitioning(nn.initializers.normal(), ("vocab", "embed"))
    else:
      out_init = nn.with_partitioning(nn.initializers.normal(), (None, None, "fsdp"))
      table_init = nn.with_partitioning(nn.initializers.normal(), (None, "fsdp"))
    out = self.param("out", out_init, (HEADS, HEAD_DIM, EMBED))
    table = self.param("embedding", table_init, (VOCAB, EMBED))
    return jnp.einsum("bhd,hde->be", x, out) @ table.T


_RULES = (("embed", "fsdp"), ("heads", None), ("kv", None), ("vocab", None))


def _linen_shardings(abstract, mesh, logical):
  if logical:
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, _RULES)
  return nn.get_sharding(abstract, mesh)


@pytest.mark.parametrize("optimizer, logical", [
    ("foam", False), ("foam", True), ("foam_lion", False), ("foam_muon", True)])
@pytest.mark.parametrize("devices", [2, 4])
def test_linen_boxes_nanodo_style(devices, optimizer, logical):
  """(Muon's orthogonalization of a sharded matrix needs collectives: not counted.)"""
  model = _Attention(logical=logical)
  x = jnp.ones((2, HEADS, HEAD_DIM))

  def init(rng):
    params = model.init(rng, x)["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=_tx(optimizer))

  mesh = _mesh(devices)
  abstract = jax.eval_shape(init, jax.random.key(0))  # No mesh in context.
  shardings = _linen_shardings(abstract, mesh, logical)
  state = jax.jit(init, out_shardings=shardings)(jax.random.key(0))
  for scales in _scales(nn.unbox(state.opt_state)):
    assert scales.shape[-1] % devices == 0 or scales.sharding.spec[-1:] in ((), (None,))
  out_scales = [s for s in _scales(nn.unbox(state.opt_state)) if s.ndim == 3]
  assert out_scales and all(s.sharding.spec[-1] == "fsdp" for s in out_scales)

  def update(state, grads):  # The optimizer's step alone: the model's own collectives aside.
    return state.apply_gradients(grads=grads)

  grads = jax.tree.map(jnp.ones_like, state.params)
  compiled = jax.jit(update, in_shardings=(shardings, shardings.params),
                     out_shardings=shardings, donate_argnums=0).lower(state, grads).compile()
  if optimizer != "foam_muon":
    _no_collectives(compiled)
  state = compiled(state, grads)
  assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(nn.unbox(state.params)))


class _NnxAttention(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    init = nnx.initializers.normal()
    self.out = nnx.Param(init(rngs.params(), (HEADS, HEAD_DIM, EMBED)),
                         out_sharding=(None, None, "fsdp"))

  def __call__(self, x):
    return jnp.einsum("bhd,hde->be", x, self.out[...])


@pytest.mark.parametrize("devices", [2, 4])
def test_nnx_variables_sharded_after_an_eager_init(devices):
  """The model and its optimizer made eagerly, then placed by their specs.

  (Flax 0.12 places Variables as they are made when a mesh is in context,
  and init then sees the split; without eager sharding it does not.)
  """
  with nnx.use_eager_sharding(False):
    model = _NnxAttention(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, _tx(), wrt=nnx.Param)
  mesh = _mesh(devices)
  state = nnx.state((model, optimizer))
  specs = nnx.get_partition_spec(state)
  placed = jax.device_put(state, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
  nnx.update((model, optimizer), placed)
  scales = [s for s in _scales(nnx.state(optimizer)) if s.ndim == 3]
  assert scales and all(s.sharding.spec[-1] == "fsdp" for s in scales)

  grads = jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param))

  @nnx.jit
  def update(model, optimizer, grads):
    optimizer.update(model, grads)

  _no_collectives(update.lower(model, optimizer, grads).compile())
  update(model, optimizer, grads)
  assert int(optimizer.step[...]) == 1


@pytest.mark.parametrize("devices", [2, 4])
def test_haliax_axis_mapping(devices):
  """haliax folds the last axis (``embed``) too: 512 / 4 = 128 leaves 16 entries 8 ways."""
  heads, head_dim = hax.Axis("heads", HEADS), hax.Axis("head_dim", HEAD_DIM)
  embed = hax.Axis("embed", 2 * EMBED)
  params = {"o_proj": hax.random.normal(jax.random.key(0), (heads, head_dim, embed))}
  tx = _tx()
  state = tx.init(params)
  mesh = _mesh(devices)
  mapping = {"embed": "fsdp"}
  with hax.partitioning.set_mesh(mesh), hax.axis_mapping(mapping):
    params, state = hax.shard((params, state))
    scales = [s for s in _scales(state) if s.ndim == 3]
    assert scales and all(s.sharding.spec[-1] == "fsdp" for s in scales)

    def step(params, state):
      grads = jax.tree.map(jnp.ones_like, params)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    compiled = jax.jit(step).lower(params, state).compile()
  _no_collectives(compiled)


def test_a_named_axis_no_block_fits_is_replicated():
  """(4, 8, 24): no block of 16 or more fits a split of 24; the scales lose the name."""
  class Small(nn.Module):

    @nn.compact
    def __call__(self, x):
      w = self.param("out", nn.with_partitioning(nn.initializers.normal(), (None, None, "fsdp")),
                     (HEADS, HEAD_DIM, 24))
      return jnp.einsum("bhd,hde->be", x, w)

  model, x = Small(), jnp.ones((2, HEADS, HEAD_DIM))
  tx = _tx()

  def init(rng):
    params = model.init(rng, x)["params"]
    return params, tx.init(params)

  assert jax.device_count() == 8
  abstract = jax.eval_shape(init, jax.random.key(0))
  assert abstract[1][0].mu.scales["out"].names == (None, None, None)
  params, state = jax.jit(init, out_shardings=nn.get_sharding(abstract, _mesh(2)))(
      jax.random.key(0))
  assert state[0].mu.codes["out"].value.sharding.spec == P(None, None, "fsdp")
  grads = jax.tree.map(jnp.ones_like, params)
  sharded, new_state = jax.jit(tx.update)(grads, state, params)
  # Boxed as init made it, the state keeps its boxes' names through update.
  assert jax.tree.structure(new_state) == jax.tree.structure(state)
  assert new_state[0].mu.scales["out"].names == (None, None, None)
  plain_params = jax.device_get(nn.unbox(params))  # Unsharded: one block of 24.
  plain, _ = tx.update(jax.device_get(nn.unbox(grads)), tx.init(plain_params), plain_params)
  np.testing.assert_allclose(nn.unbox(sharded)["out"], plain["out"], rtol=1e-6)
