"""State sizes: exact per-leaf counts, abstract init, the paper's 7B figure."""

import math

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import foam_jax
from examples.llama import configs
from examples.llama import model


def test_abstract_init_and_exact_state_sizes():
  params = {
      "w": jax.ShapeDtypeStruct((5461, 64), jnp.float32),   # tail block
      "stacked": jax.ShapeDtypeStruct((3, 100, 7), jnp.float32),
      "embed_tokens": jax.ShapeDtypeStruct((50, 64), jnp.float32),
      "b": jax.ShapeDtypeStruct((64,), jnp.float32),
  }
  for level in range(5):
    k = 2**level
    state = jax.eval_shape(
        foam_jax.foam(1e-3, weight_decay=0.0, fold_level=level).init, params)[0]
    for name, p in params.items():
      size = math.prod(p.shape)
      if name in ("w", "stacked"):
        n = p.shape[-2]
        want = 2 * math.ceil(n / k) * (size // n)
      else:
        want = 2 * size
      got = math.prod(state.mu[name].shape) + math.prod(state.nu[name].shape)
      assert got == want, (name, level)
      assert isinstance(state.mu[name], jax.ShapeDtypeStruct)


def _bytes(tree):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _llama7b_bf16():
  """The example's LLaMA-7B weights in bf16, unallocated (``nnx.eval_shape``)."""
  cfg = configs.get_config("7b", param_dtype="bfloat16")
  return nnx.to_pure_dict(model.abstract_params(cfg))


@pytest.mark.parametrize(
    "tx_name,paper_gb", [("adam", 40.38), ("foam", 20.97), ("foam_mini", 14.49)])
def test_llama7b_weights_plus_state_match_the_paper_figure(tx_name, paper_gb):
  params = _llama7b_bf16()
  tx = {"adam": optax.adam(1e-3), "foam": foam_jax.foam(1e-3, weight_decay=0.0),
        "foam_mini": foam_jax.foam_mini(1e-3, weight_decay=0.0)}[tx_name]
  total = _bytes(params) + foam_jax.state_bytes(tx, params)
  # The paper's figure reads off at about +-0.05 GB (decimal GB).
  assert abs(total / 1e9 - paper_gb) < 0.1, total / 1e9


def test_llama7b_foam_is_about_52_percent_of_adam():
  params = _llama7b_bf16()
  weights = _bytes(params)
  foam_total = weights + foam_jax.state_bytes(foam_jax.foam(1e-3, weight_decay=0.0), params)
  adam_total = weights + foam_jax.state_bytes(optax.adam(1e-3), params)
  assert 0.51 < foam_total / adam_total < 0.53
