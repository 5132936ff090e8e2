"""The default policy folds the input-feature axis in every layout people train with.

For each layout of ``tests/clients/layouts.py`` (NNX scanned with names, Linen
``nn.scan`` with params on axis 0 and on axis 1 as MaxText, a Levanter-style
haliax model, Equinox, and an unscanned NNX model as the control):

* the state ``init`` builds, through the stack's own idiom, is folded along
  the expected axis of each parameter, and stacked vectors, embeddings and
  heads keep Adam's moments;
* training through the stack's own step equals training with the expected
  layout given as explicit ``FoldSpec`` s: ``update`` agrees with ``init``
  even where the step hands it bare arrays (NNX's ``Optimizer``, MaxText's
  unboxed state);
* the planning helpers agree with ``init``.
"""

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state

import foam_jax
from tests.clients import layouts

LR = 1e-2
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, layouts.VOCAB, (2, 8)), jnp.int32)


def _expected_axes(params, expected):
  """The expected fold axis (or None) of each leaf of ``params``, in leaf order."""
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = jax.tree_util.keystr(path)
    match = [axis for fragment, axis in expected if fragment in name]
    assert match, f"no expectation for {name} {leaf.shape}"
    out.append(match[0])
  return out


def _folded_axes(params, mu):
  """The axis along which each state leaf is smaller than its parameter."""
  out = []
  for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(mu), strict=True):
    differing = [a for a in range(p.ndim) if p.shape[a] != m.shape[a]]
    assert len(differing) <= 1 and m.ndim == p.ndim
    out.append(differing[0] if differing else None)
  return out


def _explicit(axes, level=2):
  """A ``fold_spec`` callable giving the expected layout to any tree of the same leaves."""
  specs = [None if a is None else foam_jax.FoldSpec(axis=a, level=level) for a in axes]
  return lambda params: jax.tree_util.tree_unflatten(jax.tree.structure(params), specs)


def _assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _check_helpers(params, axes, state):
  """``default_fold_specs``, ``state_bytes`` and the sharding helpers agree with ``init``."""
  leaves_of = jax.tree.structure(params).flatten_up_to
  specs = leaves_of(foam_jax.default_fold_specs(params))
  got = [None if s is None else s.axis % p.ndim
         for s, p in zip(specs, jax.tree.leaves(params), strict=True)]
  assert got == axes
  tx = foam_jax.foam(LR)
  assert foam_jax.state_bytes(tx, params) == sum(
      x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  fitted = leaves_of(foam_jax.sharding.fitted_fold_specs(params))
  assert [None if s is None else s.axis % p.ndim
          for s, p in zip(fitted, jax.tree.leaves(params), strict=True)] == axes


# --- Flax NNX, stock nnx.Optimizer -----------------------------------------


def _nnx_train(model, tx, steps=3):
  opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
  loss = lambda m: jnp.mean(jax.nn.log_softmax(m(TOKENS)) ** 2)
  for _ in range(steps):
    opt.update(model, nnx.grad(loss)(model))


@pytest.mark.parametrize("build", [layouts.nnx_scanned, layouts.nnx_plain])
def test_nnx_layouts(build):
  model, expected = build()
  params = nnx.state(model, nnx.Param)
  axes = _expected_axes(params, expected)
  opt = nnx.Optimizer(model, foam_jax.foam(LR), wrt=nnx.Param)
  assert _folded_axes(params, opt.opt_state[0].mu) == axes
  _check_helpers(params, axes, opt.opt_state)
  trained, reference = build()[0], build()[0]
  _nnx_train(trained, foam_jax.foam(LR))
  _nnx_train(reference, foam_jax.foam(LR, fold_spec=_explicit(axes)))
  _assert_trees_equal(nnx.state(trained, nnx.Param), nnx.state(reference, nnx.Param))


# --- Flax Linen nn.scan, as MaxText builds and steps it ------------------------


def _maxtext_train(model, boxed, tx, steps=3):
  """MaxText's idiom: ``TrainState.create`` on boxed params, then everything unboxed."""
  state = train_state.TrainState.create(apply_fn=model.apply, params=boxed, tx=tx)
  state = nn.meta.unbox(state)

  @jax.jit
  def step(state):
    loss = lambda p: jnp.mean(jax.nn.log_softmax(state.apply_fn({"params": p}, TOKENS)) ** 2)
    return state.apply_gradients(grads=jax.grad(loss)(state.params))

  for _ in range(steps):
    state = step(state)
  return state


@pytest.mark.parametrize("param_scan_axis", [0, 1])
def test_linen_scan_layouts(param_scan_axis):
  model, boxed, expected = layouts.linen_scanned(param_scan_axis)
  axes = _expected_axes(boxed, expected)
  state = train_state.TrainState.create(apply_fn=model.apply, params=boxed,
                                        tx=foam_jax.foam(LR))
  assert _folded_axes(boxed, state.opt_state[0].mu) == axes
  _check_helpers(boxed, axes, state.opt_state)
  trained = _maxtext_train(model, boxed, foam_jax.foam(LR))
  reference = _maxtext_train(model, boxed, foam_jax.foam(LR, fold_spec=_explicit(axes)))
  _assert_trees_equal(trained.params, reference.params)


# --- haliax and Equinox: eqx.filter, filter_grad, apply_updates ----------------


def _eqx_train(model, loss, tx, steps=3):
  params = eqx.filter(model, eqx.is_inexact_array)
  opt_state = tx.init(params)

  @eqx.filter_jit
  def step(model, opt_state):
    grads = eqx.filter_grad(loss)(model)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), opt_state

  for _ in range(steps):
    model, opt_state = step(model, opt_state)
  return model


def _haliax_loss(model):
  tokens = hax.named(TOKENS, ("batch", "position"))
  return hax.mean(model(tokens) ** 2).scalar()


def _equinox_loss(model):
  if isinstance(model, eqx.nn.MLP):
    x = jnp.linspace(-1, 1, 4 * 32).reshape(4, 32)
    return jnp.mean(jax.vmap(model)(x) ** 2)
  return jnp.mean(jax.nn.log_softmax(model(TOKENS[0])) ** 2)


@pytest.mark.parametrize("build, loss", [
    (layouts.haliax_model, _haliax_loss),
    (layouts.equinox_mlp, _equinox_loss),
    (layouts.equinox_transformer, _equinox_loss),
])
def test_module_tree_layouts(build, loss):
  model, expected = build()
  params = eqx.filter(model, eqx.is_inexact_array)
  axes = _expected_axes(params, expected)
  state = foam_jax.foam(LR).init(params)
  assert _folded_axes(params, state[0].mu) == axes
  _check_helpers(params, axes, state)
  trained = _eqx_train(model, loss, foam_jax.foam(LR))
  reference = _eqx_train(model, loss, foam_jax.foam(LR, fold_spec=_explicit(axes)))
  _assert_trees_equal(eqx.filter(trained, eqx.is_array), eqx.filter(reference, eqx.is_array))


def test_layer_axis_names_and_path_rules_are_configurable():
  model, boxed, _ = layouts.linen_scanned(0)
  # Without `layers` among the layer names, the stacked norm is a matrix.
  policy = foam_jax.FoldPolicy(layer_axis_names=("stage",))
  specs = foam_jax.default_fold_specs(boxed, policy=policy)
  assert specs["layers"]["pre_norm"].value == foam_jax.FoldSpec(axis=-2, level=2)
  # An extra path rule gives the MLP's output projection Adam's moments.
  policy = foam_jax.FoldPolicy(unfolded_paths=foam_jax.FoldPolicy().unfolded_paths + ("wo",))
  mu = foam_jax.foam(LR, fold_spec=policy).init(boxed)[0].mu["layers"]
  assert mu["wo"]["kernel"].value.shape == boxed["layers"]["wo"]["kernel"].value.shape
  assert mu["wi"]["kernel"].value.shape != boxed["layers"]["wi"]["kernel"].value.shape
  with pytest.raises(TypeError, match="layer_axis_names"):
    foam_jax.FoldPolicy(layer_axis_names="layers")


# --- Named shardings: folds fit them with no pin_layout ------------------------


@pytest.mark.parametrize("int8", [False, True])
def test_haliax_tensor_parallel_state_divides(int8):
  """heads and mlp mapped to a 2-device ``model`` axis: the state shards by the same names."""
  mesh = jax.make_mesh((2,), ("model",), devices=jax.devices()[:2],
                       axis_types=(jax.sharding.AxisType.Explicit,))
  mapping = {"heads": "model", "mlp": "model"}
  model, _ = layouts.haliax_model()
  params = hax.shard(eqx.filter(model, eqx.is_inexact_array), mapping, mesh)
  kwargs = {"mu_dtype": jnp.int8, "nu_dtype": jnp.int8} if int8 else {}
  tx = foam_jax.foam(LR, **kwargs)
  # The preferred folds need no adapting to these shardings.
  assert foam_jax.sharding.straddling_blocks(params) == []
  state = tx.init(params)
  # What Levanter does with the state: shard it by its axis names.
  moments = state[0].mu.codes if int8 else state[0].mu
  hax.shard(moments, mapping, mesh)
  if int8:  # The scales too: each quantization block lies in one shard.
    hax.shard((state[0].mu.scales, state[0].nu.scales), mapping, mesh)
  # The o_proj moments keep all 4 heads (folded along head_size).
  o_proj = moments.layers.stacked.o_proj.weight
  assert o_proj.axis_size("heads") == layouts.HEADS
  assert o_proj.axis_size("head_size") == layouts.HEAD_DIM // 4
  # A traced init (as Levanter's named_jit) folds the same way.
  traced = jax.eval_shape(tx.init, params)
  assert jax.tree.map(lambda x: x.shape, traced) == jax.tree.map(lambda x: x.shape, state)
  assert int(optax.tree_utils.tree_get(state, "count")) == 0  # A well-formed Optax state.


@pytest.mark.parametrize("make_tx", [
    lambda: foam_jax.foam_muon(1e-2), lambda: foam_jax.foam_muon(1e-2, mu_dtype=jnp.int8),
    lambda: foam_jax.foam_lion(1e-3)], ids=["foam_muon", "foam_muon_int8", "foam_lion"])
def test_folded_muon_and_lion_train_in_every_layout(make_tx):
  """Muon's partition labels are the same at init and update in every stack."""
  model, _ = layouts.nnx_scanned()
  before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
  _nnx_train(model, make_tx())
  after = nnx.state(model, nnx.Param)
  for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
    assert np.all(np.isfinite(y)) and not np.array_equal(x, y)
  model, boxed, _ = layouts.linen_scanned(1)
  state = _maxtext_train(model, boxed, make_tx())
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params))
  for build, loss in ((layouts.haliax_model, _haliax_loss),
                      (layouts.equinox_transformer, _equinox_loss)):
    trained = _eqx_train(build()[0], loss, make_tx())
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(eqx.filter(trained, eqx.is_array)))


def test_muon_matrices_follow_module_types():
  dims = foam_jax._src.muon.matrix_dimension_numbers  # noqa: SLF001
  params = eqx.filter(layouts.haliax_model()[0], eqx.is_inexact_array)
  got = dims(params).layers.stacked
  # o_proj (layers, embed, heads, head_size): reduce over In = (heads, head_size).
  assert got.o_proj.weight.array == (((-2, -1), -3))
  assert got.q_proj.weight.array == ((-1, (-3, -2)))
  assert got.attn_norm.weight.array is None
  eqx_dims = dims(eqx.filter(layouts.equinox_transformer()[0], eqx.is_inexact_array))
  assert eqx_dims.blocks.up.weight == (-1, -2) and eqx_dims.blocks.norm.weight is None
  assert eqx_dims.unembed.weight is None


# --- Attention projections and LoRA adapters. ---


def _mu_shapes(state):
  return {jax.tree_util.keystr(p): x.shape
          for p, x in jax.tree_util.tree_flatten_with_path(state[0].mu)[0]}


def test_nnx_attention_projections_fold_their_input_axis():
  attn = nnx.MultiHeadAttention(num_heads=4, in_features=16, qkv_features=32,
                                decode=False, rngs=nnx.Rngs(0))
  shapes = _mu_shapes(nnx.Optimizer(attn, foam_jax.foam(1e-3), wrt=nnx.Param).opt_state)
  for name in ("query", "key", "value"):
    assert shapes[f"['{name}']['kernel'].value"] == (4, 4, 8)   # (in/4, heads, head_dim)
    assert shapes[f"['{name}']['bias'].value"] == (4, 8)        # a bias: Adam's
  assert shapes["['out']['kernel'].value"] == (4, 2, 16)        # innermost input


def test_linen_attention_projections_fold_their_input_axis_also_scanned():
  attn = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=32)
  x = jnp.ones((1, 3, 16))
  params = attn.init(jax.random.key(0), x, x)["params"]
  shapes = _mu_shapes(foam_jax.foam(1e-3).init(params))
  assert shapes["['query']['kernel']"] == (4, 4, 8)
  stacked = jax.tree.map(lambda p: jnp.stack([p] * 3), params)  # An unnamed scan stack.
  shapes = _mu_shapes(foam_jax.foam(1e-3).init(stacked))
  assert shapes["['query']['kernel']"] == (3, 4, 4, 8)          # never the layer axis


def test_an_unnamed_rank_3_leaf_elsewhere_keeps_the_shape_rule():
  params = {"mlp": {"kernel": jnp.zeros((4, 16, 8))}}
  assert _mu_shapes(foam_jax.foam(1e-3).init(params))["['mlp']['kernel']"] == (4, 4, 8)


@pytest.mark.parametrize("names", [("lora_a", "lora_b"), ("lora_A", "lora_B")])
def test_lora_adapters_named_by_path_keep_adams_moments(names):
  params = {"q_proj": {names[0]: jnp.zeros((64, 4)), names[1]: jnp.zeros((4, 64)),
                       "kernel": jnp.zeros((64, 64))}}
  shapes = _mu_shapes(foam_jax.foam(1e-3).init(params))
  assert shapes[f"['q_proj']['{names[0]}']"] == (64, 4)
  assert shapes[f"['q_proj']['{names[1]}']"] == (4, 64)
  assert shapes["['q_proj']['kernel']"] == (16, 64)


def test_nnx_lora_params_keep_adams_moments_with_the_stock_optimizer():
  class Adapted(nnx.Module):

    def __init__(self, rngs):
      self.base = nnx.Linear(64, 64, rngs=rngs)
      self.adapter = nnx.LoRA(64, 4, 64, rngs=rngs)

  model = Adapted(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, foam_jax.foam(1e-3), wrt=nnx.LoRAParam)
  shapes = _mu_shapes(optimizer.opt_state)
  assert shapes == {"['adapter']['lora_a'].value": (64, 4),
                    "['adapter']['lora_b'].value": (4, 64)}
