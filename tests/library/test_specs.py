"""The default fold policy: which leaves fold, along which axis."""

import jax
import jax.numpy as jnp

import foam_jax
from foam_jax import FoldSpec


def test_default_policy_is_the_papers():
  params = {
      "Embed_Tokens": {"embedding": jnp.zeros((32, 8))},
      "layers_0": {"attn": {"q_proj": {"kernel": jnp.zeros((8, 8))}},
                   "norm": {"scale": jnp.zeros(8)}},
      "stacked": {"kernel": jax.ShapeDtypeStruct((4, 8, 16), jnp.float32)},
      "LM_HEAD": {"kernel": jnp.zeros((8, 32))},
      "temperature": jnp.zeros(()),
  }
  specs = foam_jax.default_fold_specs(params, fold_level=3)
  assert specs["Embed_Tokens"]["embedding"] is None
  assert specs["LM_HEAD"]["kernel"] is None
  assert specs["layers_0"]["norm"]["scale"] is None
  assert specs["temperature"] is None
  assert specs["layers_0"]["attn"]["q_proj"]["kernel"] == FoldSpec(axis=-2, level=3)
  assert specs["stacked"]["kernel"] == FoldSpec(axis=-2, level=3)


def test_default_policy_result_is_a_valid_override_starting_point():
  params = {"w": jnp.zeros((16, 4)), "embed": jnp.zeros((10, 4))}
  specs = foam_jax.default_fold_specs(params)
  specs["embed"] = FoldSpec(axis=-1, level=1)  # fold the embedding too
  state = foam_jax.foam(1e-3, fold_spec=specs).init(params)
  assert state[0].mu["w"].shape == (4, 4)
  assert state[0].mu["embed"].shape == (10, 2)
