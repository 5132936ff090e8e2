"""Flax Linen as a client: ``TrainState``, Optax wrappers and boxed partitioning."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax.training import train_state
from jax.sharding import PartitionSpec as P

import foam_jax

TXS = {
    "foam": lambda: foam_jax.foam(1e-2),
    "foam_int8": lambda: foam_jax.foam(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "foam_muon": lambda: foam_jax.foam_muon(2e-2),
    "foam_muon_int8": lambda: foam_jax.foam_muon(2e-2, mu_dtype=jnp.int8),
}


class Mlp(nn.Module):
  """Two Dense layers whose kernels carry logical axis names."""

  @nn.compact
  def __call__(self, x):
    dense = lambda n, names, name: nn.Dense(  # noqa: E731
        n, name=name,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), names))
    x = nn.relu(dense(256, ("embed", "mlp"), "up")(x))
    return dense(4, ("mlp", "out"), "down")(x)


def _data():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
  return x, jnp.sin(x[:, :4])


def _state(tx):
  x, _ = _data()
  params = nn.meta.unbox(Mlp().init(jax.random.PRNGKey(0), x)["params"])
  return train_state.TrainState.create(apply_fn=Mlp().apply, params=params, tx=tx)


def _loss(params, apply_fn):
  x, y = _data()
  return jnp.mean((apply_fn({"params": params}, x) - y) ** 2)


@jax.jit
def _train_step(state):
  grads = jax.grad(_loss)(state.params, state.apply_fn)
  return state.apply_gradients(grads=grads)


def _losses(state, steps=25):
  out = [float(_loss(state.params, state.apply_fn))]
  for _ in range(steps):
    state = _train_step(state)
  out.append(float(_loss(state.params, state.apply_fn)))
  return out, state


@pytest.mark.parametrize("name", list(TXS))
def test_train_state_apply_gradients_trains(name):
  (first, last), state = _losses(_state(TXS[name]()))
  assert last < 0.5 * first, (first, last)
  assert int(state.step) == 25


def test_multi_steps_accumulates_then_applies():
  tx = optax.MultiSteps(foam_jax.foam(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
                        every_k_schedule=2)
  state = _state(tx)
  once = _train_step(state)
  jax.tree.map(np.testing.assert_array_equal, once.params, state.params)  # Accumulating.
  twice = _train_step(once)
  assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in
             zip(jax.tree.leaves(twice.params), jax.tree.leaves(state.params)))


@pytest.mark.parametrize("name", ["foam", "foam_int8"])
def test_multi_transform_freezes_what_it_labels_frozen(name):
  labels = {"up": {"kernel": "frozen", "bias": "frozen"},
            "down": {"kernel": "train", "bias": "train"}}
  tx = optax.multi_transform({"train": TXS[name](), "frozen": optax.set_to_zero()}, labels)
  start = _state(tx)
  _, state = _losses(start, steps=5)
  jax.tree.map(np.testing.assert_array_equal, state.params["up"], start.params["up"])
  assert np.any(np.asarray(state.params["down"]["kernel"])
                != np.asarray(start.params["down"]["kernel"]))


def test_reduce_on_plateau_takes_the_loss_as_value():
  tx = optax.chain(foam_jax.foam(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
                   optax.contrib.reduce_on_plateau(patience=1, cooldown=0, factor=0.5))
  state = _state(tx)

  @jax.jit
  def step(state):
    loss, grads = jax.value_and_grad(_loss)(state.params, state.apply_fn)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params, value=loss)
    return state.replace(step=state.step + 1, opt_state=opt_state,
                         params=optax.apply_updates(state.params, updates)), loss

  losses = []
  for _ in range(10):
    state, loss = step(state)
    losses.append(float(loss))
  assert losses[-1] < losses[0]
  assert 0.0 < float(state.opt_state[1].scale) <= 1.0


@pytest.mark.parametrize("name", list(TXS))
def test_boxed_params_give_the_state_their_logical_specs(name):
  """MaxText's recipe: the state's PartitionSpecs from the boxed params.

  int8 scales of ``down`` (its last axis, ``out``, 4 long: too short for a
  block of 16 in any split) keep no name on that axis.
  """
  x, _ = _data()
  tx = TXS[name]()

  def create():
    params = Mlp().init(jax.random.PRNGKey(0), x)["params"]
    return train_state.TrainState.create(apply_fn=Mlp().apply, params=params, tx=tx)

  abstract = jax.eval_shape(create)
  specs = nn.get_partition_spec(abstract)
  is_box = lambda x: isinstance(x, nn.Partitioned)  # noqa: E731
  arrays = {jax.tree_util.keystr(path) for path, box in
            jax.tree_util.tree_flatten_with_path(abstract, is_leaf=is_box)[0]
            if is_box(box) and hasattr(box.value, "shape")}  # Not optax.MaskedNode.
  found = {}

  def visit(path, spec):
    keys = jax.tree_util.keystr(path)
    if keys not in arrays:
      return
    down = P("mlp", None) if ".scales" in keys else P("mlp", "out")
    for layer, want in (("up", P("embed", "mlp")), ("down", down)):
      if f"['{layer}']['kernel']" in keys and ".opt_state" in keys:
        found.setdefault(layer, []).append(spec == want)

  jax.tree_util.tree_map_with_path(visit, specs, is_leaf=lambda s: isinstance(s, P))
  assert found["up"] and all(found["up"]) and found["down"] and all(found["down"]), found
