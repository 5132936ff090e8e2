"""An independent float64 NumPy reference of FOAM, written from the equations.

Nothing here imports ``foam_jax``: blocks are built with explicit Python
loops over index ranges, so the reference shares no code (and no reshape
tricks) with the library. See ``shared/docs/foam-algorithm.md``:

    gm = fold(g); sm = fold(|g|^2)          (or |gm|^2: "square_of_mean")
    R  = g - unfold(gm)
    m  = b1 m + (1 - b1) gm;  v = b2 v + (1 - b2) sm
    M  = unfold(m) + c R;     V = unfold(v) + c^2 |R|^2
    W -= lr * sqrt(1 - b2^t) * alpha * Mhat / (sqrt(V + eps_root (1 - b2^t)) + eps)
    W -= lr * wd * W

with ``Mhat = M / (1 - b1^t)``, or with Nesterov (Optax's form)
``Mhat = b1 M / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t)``. Complex
gradients are folded as complex numbers; ``v`` is real.

``bias_correction="folded_moments"`` corrects the folded moments before the
residual is added:

    M = mhat + c R,  mhat = unfold(m) / (1 - b1^t)
          (Nesterov: b1 unfold(m) / (1 - b1^(t+1)) + (1 - b1) unfold(gm) / (1 - b1^t))
    V = unfold(v) / (1 - b2^t) + c^2 |R|^2
    W -= lr * alpha * M / (sqrt(V + eps_root) + eps)

(a leaf that is not folded: ``gm = g``, ``R = 0``, Optax's Adam).
"""

from __future__ import annotations

import dataclasses

import numpy as np


def block_ranges(n: int, k: int) -> list[tuple[int, int]]:
  """Index ranges ``[start, stop)`` of the blocks of an axis of length n."""
  k = max(1, min(k, n)) if n else 1
  return [(start, min(start + k, n)) for start in range(0, n, k)]


def wide(x) -> np.ndarray:
  """``x`` in float64, or complex128 if it is complex."""
  x = np.asarray(x)
  return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def np_fold(x: np.ndarray, axis: int, k: int) -> np.ndarray:
  """Block means along ``axis``, each over its true length."""
  x = np.moveaxis(wide(x), axis, 0)
  blocks = [x[a:b].mean(axis=0) for a, b in block_ranges(x.shape[0], k)]
  out = np.stack(blocks) if blocks else np.zeros((0,) + x.shape[1:])
  return np.moveaxis(out, 0, axis)


def np_unfold(y: np.ndarray, axis: int, k: int, n: int) -> np.ndarray:
  """Writes each block value over its block: the axis grows back to n."""
  y = np.moveaxis(wide(y), axis, 0)
  out = np.zeros((n,) + y.shape[1:], y.dtype)
  for b, (start, stop) in enumerate(block_ranges(n, k)):
    out[start:stop] = y[b]
  return np.moveaxis(out, 0, axis)


@dataclasses.dataclass
class LeafRule:
  """How the reference treats one leaf: ``axis=None`` means plain Adam."""

  axis: int | None = None
  k: int = 1


class NumpyFoam:
  """float64 FOAM (``foam_jax.foam`` semantics) over a dict of arrays."""

  def __init__(self, rules, *, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0,
               alpha=1.0, c=1.0, second_moment="mean_of_squares",
               decay_mask=None, eps_root=0.0, nesterov=False,
               bias_correction="step_size"):
    self.rules = rules
    self.bias_correction = bias_correction
    self.lr, self.b1, self.b2, self.eps, self.wd = lr, b1, b2, eps, wd
    self.eps_root, self.nesterov = eps_root, nesterov
    self.alpha, self.c, self.second_moment = alpha, c, second_moment
    self.decay_mask = decay_mask or {}
    self.t = 0
    self.m, self.v = {}, {}

  def init(self, params):
    for name, p in params.items():
      rule = self.rules[name]
      shape = np.shape(p)
      if rule.axis is not None:
        shape = np_fold(np.zeros(shape), rule.axis, rule.k).shape
      self.m[name] = np.zeros(shape, wide(p).dtype)
      self.v[name] = np.zeros(shape)

  def _step_direction(self, big_m, big_v, g, alpha):
    """``alpha sqrt(1 - b2^t) Mhat / (sqrt(V + eps_root (1 - b2^t)) + eps)``."""
    b1, b2, t = self.b1, self.b2, self.t
    if self.nesterov:
      m_hat = b1 * big_m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1**t)
    else:
      m_hat = big_m / (1 - b1**t)
    denominator = np.sqrt(big_v + self.eps_root * (1 - b2**t)) + self.eps
    return alpha * np.sqrt(1 - b2**t) * m_hat / denominator

  def _folded_direction(self, m, gm, r, v, alpha):
    """``bias_correction="folded_moments"``: ``m``, ``gm``, ``v`` unfolded."""
    b1, b2, t, c = self.b1, self.b2, self.t, self.c
    if self.nesterov:
      m_hat = b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * gm / (1 - b1**t)
    else:
      m_hat = m / (1 - b1**t)
    big_m = m_hat + c * r
    big_v = v / (1 - b2**t) + c**2 * np.abs(r) ** 2
    return alpha * big_m / (np.sqrt(big_v + self.eps_root) + self.eps)

  def direction(self, name, g):
    """The scale_by_foam output for one leaf (before lr and decay)."""
    b1, b2 = self.b1, self.b2
    rule = self.rules[name]
    g = wide(g)
    if rule.axis is None:
      self.m[name] = b1 * self.m[name] + (1 - b1) * g
      self.v[name] = b2 * self.v[name] + (1 - b2) * np.abs(g) ** 2
      if self.bias_correction == "folded_moments":
        return self._folded_direction(self.m[name], g, 0.0, self.v[name], 1.0)
      return self._step_direction(self.m[name], self.v[name], g, 1.0)
    axis, k, n = rule.axis, rule.k, g.shape[rule.axis]
    gm = np_fold(g, axis, k)
    if self.second_moment == "mean_of_squares":
      sm = np_fold(np.abs(g) ** 2, axis, k).real
    else:
      sm = np.abs(gm) ** 2
    r = g - np_unfold(gm, axis, k, n)
    self.m[name] = b1 * self.m[name] + (1 - b1) * gm
    self.v[name] = b2 * self.v[name] + (1 - b2) * sm
    if self.bias_correction == "folded_moments":
      return self._folded_direction(
          np_unfold(self.m[name], axis, k, n), np_unfold(gm, axis, k, n), r,
          np_unfold(self.v[name], axis, k, n).real, self.alpha)
    big_m = np_unfold(self.m[name], axis, k, n) + self.c * r
    big_v = np_unfold(self.v[name], axis, k, n).real + self.c**2 * np.abs(r) ** 2
    return self._step_direction(big_m, big_v, g, self.alpha)

  def step(self, params, grads):
    """Returns the new params after one ``foam`` step."""
    self.t += 1
    new = {}
    for name, p in params.items():
      p = wide(p)
      u = self.direction(name, grads[name])
      if self.decay_mask.get(name, True):
        u = u + self.wd * p
      new[name] = p - self.lr * u
    return new
