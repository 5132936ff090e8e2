"""Muon's Newton-Schulz and shape scaling, against float64 NumPy and against Optax.

The float64 reference is written here from the equations of
``foam_jax._src.newton_schulz``'s docstring. Optax's own Muon
(``optax.contrib.muon``) is compared bit for bit through its public
function, with every argument the installed Optax has.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import MuonDimensionNumbers

import foam_jax
from foam_jax._src import newton_schulz as ns


def _reference(x, coeffs, steps, preconditioning, eps=1e-8):
  """Newton-Schulz in float64 NumPy, from the equations."""
  x = np.asarray(x, np.float64)
  tall = x.shape[0] > x.shape[1]
  if tall:
    x = x.T
  if preconditioning == "frobenius":
    x = x / (np.sqrt(np.sum(x * x)) + eps)
  elif preconditioning == "spectral":
    x = x / (np.linalg.svd(x, compute_uv=False)[0] + eps)
  coeffs = np.asarray(coeffs, np.float64)
  triples = [coeffs] * steps if coeffs.ndim == 1 else list(coeffs)
  for i, (c0, c1, c2) in enumerate(triples):
    a = x @ x.T
    if i == 0 and preconditioning == "aol":
      s = 1 / np.sqrt(np.maximum(np.abs(a).sum(-1), 1e-8))[:, None]
      x, a = x * s, a * s * s.T
    elif i == 0 and preconditioning == "schatten":
      s = 1 / np.sqrt(max(np.sqrt(np.sum(a * a)), 1e-8))
      x, a = x * s, a * s**2
    x = c0 * x + (c1 * a + c2 * a @ a) @ x
  return x.T if tall else x


@pytest.mark.parametrize("preconditioning", ns.PRECONDITIONINGS)
@pytest.mark.parametrize("preset", sorted(ns.PRESETS))
@pytest.mark.parametrize("shape", [(6, 10), (12, 5)])
def test_orthogonalize_matches_float64_reference(preconditioning, preset, shape):
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  coeffs = jnp.asarray(ns.PRESETS[preset], jnp.float32)
  got = ns.orthogonalize(jnp.asarray(x), coeffs, 5, preconditioning)
  np.testing.assert_allclose(got, _reference(x, ns.PRESETS[preset], 5, preconditioning),
                             rtol=2e-3, atol=2e-4)


def test_orthogonalize_batches_by_dimension_numbers():
  """(layers, out, in) with reduction -1, output -2: each layer's (in, out) matrix."""
  x = np.random.default_rng(1).standard_normal((3, 8, 5)).astype(np.float32)
  dims = MuonDimensionNumbers(reduction_axis=-1, output_axis=-2)
  got = ns.orthogonalize(jnp.asarray(x), jnp.asarray(ns.DEFAULT_NS_COEFFS), 5, dims=dims)
  for layer in range(3):
    want = _reference(x[layer].T, ns.DEFAULT_NS_COEFFS, 5, "frobenius").T
    np.testing.assert_allclose(got[layer], want, rtol=2e-3, atol=2e-4)
  # Several reduction axes are flattened into rows: (heads, head_size) -> embed.
  y = np.random.default_rng(2).standard_normal((4, 2, 6)).astype(np.float32)
  dims = MuonDimensionNumbers(reduction_axis=(0, 1), output_axis=2)
  got = ns.orthogonalize(jnp.asarray(y), jnp.asarray(ns.DEFAULT_NS_COEFFS), 5, dims=dims)
  want = _reference(y.reshape(8, 6), ns.DEFAULT_NS_COEFFS, 5, "frobenius").reshape(4, 2, 6)
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4)
  with pytest.raises(ValueError, match="overlap"):
    ns.orthogonalize(jnp.asarray(y), jnp.asarray(ns.DEFAULT_NS_COEFFS),
                     dims=MuonDimensionNumbers(0, 0))
  with pytest.raises(ValueError, match="dimension numbers"):
    ns.orthogonalize(jnp.asarray(y), jnp.asarray(ns.DEFAULT_NS_COEFFS))
  with pytest.raises(ValueError, match="preconditioning"):
    ns.orthogonalize(jnp.asarray(x[0]), jnp.asarray(ns.DEFAULT_NS_COEFFS),
                     preconditioning="nope")


@pytest.mark.parametrize("consistent_rms", [None, 0.2])
def test_scale_by_shape_matches_the_fans(consistent_rms):
  u = {"wide": jnp.ones((4, 16)), "tall": jnp.ones((16, 4)),
       "stacked": jnp.ones((3, 16, 4))}
  dims = {"wide": MuonDimensionNumbers(0, 1), "tall": MuonDimensionNumbers(0, 1),
          "stacked": MuonDimensionNumbers(-1, -2)}
  out, _ = ns.scale_by_shape(dims, consistent_rms).update(u, optax.EmptyState())
  for name, (fan_in, fan_out) in {"wide": (4, 16), "tall": (16, 4),
                                  "stacked": (4, 16)}.items():
    want = (np.sqrt(max(1, fan_out / fan_in)) if consistent_rms is None
            else np.sqrt(max(fan_in, fan_out)) * consistent_rms)
    np.testing.assert_allclose(out[name], want * np.ones(u[name].shape), rtol=1e-6)


SHAPES = {"w1": (16, 24), "w2": (24, 8), "stack": (3, 8, 12), "b": (8,)}


def _rule(params):
  return jax.tree.map(lambda p: MuonDimensionNumbers(-2, -1) if p.ndim >= 2 else None,
                      params)


def _accepts(name):
  return name in inspect.signature(optax.contrib.muon).parameters


# Muon's options as the installed Optax's muon has them; each run bit for bit.
VARIANTS = [
    ({}, ()), ({"ns_coeffs": ns.PRESETS["dion"]}, ()),
    ({"preconditioning": "spectral"}, ("preconditioning",)),
    ({"preconditioning": "aol"}, ("preconditioning",)),
    ({"preconditioning": "schatten"}, ("preconditioning",)),
    ({"consistent_rms": 0.2}, ("consistent_rms",)),
]


@pytest.mark.single_device
@pytest.mark.parametrize("kwargs, needs", VARIANTS,
                         ids=["default", "dion", "spectral", "aol", "schatten", "rms"])
def test_foam_muon_level_0_is_optax_muon_bit_for_bit(kwargs, needs):
  missing = [n for n in needs if not _accepts(n)]
  if missing:
    pytest.skip(f"optax {optax.__version__}'s muon has no {missing}: nothing to compare.")
  rng = np.random.default_rng(0)
  params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
  ref = optax.contrib.muon(1e-2, muon_weight_dimension_numbers=_rule, **kwargs)
  ours = foam_jax.foam_muon(1e-2, fold_level=0, **kwargs)
  s_ref, s_ours = ref.init(params), ours.init(params)
  p_ref, p_ours = params, params
  for step in range(4):
    grads = jax.tree.map(lambda p, step=step: jnp.sin(p * (step + 1)), p_ref)
    u_ref, s_ref = jax.jit(ref.update)(grads, s_ref, p_ref)
    u_ours, s_ours = jax.jit(ours.update)(grads, s_ours, p_ours)
    for a, b in zip(jax.tree.leaves(u_ref), jax.tree.leaves(u_ours), strict=True):
      np.testing.assert_array_equal(a, b)
    p_ref, p_ours = optax.apply_updates(p_ref, u_ref), optax.apply_updates(p_ours, u_ours)


def test_orthogonalize_under_explicit_sharding_keeps_the_sharding():
  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
  sharding = jax.sharding.NamedSharding(mesh, jax.P(None, "x"))
  x = np.random.default_rng(3).standard_normal((2, 8, 4)).astype(np.float32)
  dims = MuonDimensionNumbers(-2, -1)
  coeffs = jnp.asarray(ns.DEFAULT_NS_COEFFS)
  with jax.set_mesh(mesh):
    sharded = jax.device_put(x, sharding)
    got = jax.jit(lambda v: ns.orthogonalize(v, coeffs, dims=dims))(sharded)
    assert jax.typeof(got).sharding.spec == jax.typeof(sharded).sharding.spec
  # Gathered, the same arithmetic as unsharded (up to XLA's fusion choices).
  unsharded = jax.jit(lambda v: ns.orthogonalize(v, coeffs, dims=dims))(jnp.asarray(x))
  np.testing.assert_allclose(got, unsharded, rtol=1e-5, atol=1e-6)
