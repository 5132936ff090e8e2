"""Independent float64 NumPy references of folded Lion and folded Muon.

Written from the equations of the folding issue, not from the library:
nothing here imports ``foam_jax``. Blocks come from ``reference.np_fold`` /
``np_unfold`` (explicit loops over index ranges). For a folded leaf with
``F`` = block means, ``U`` = broadcast back, ``R(g) = g - U F(g)``:

Lion::

    M = U m + c R(g);   u = sign(b1 M + (1 - b1) g);   m = b2 m + (1 - b2) F(g)
    W -= lr (u + wd W)

Muon (hidden matrices; reduction axis -2, output axis -1, leading axes
batch)::

    m = beta m + (1 - beta) F(g);   M = U m + c R(g)
    Mhat = beta M / (1 - beta^(t+1)) + (1 - beta) g / (1 - beta^t)  (Nesterov)
         = M / (1 - beta^t)                                           (else)
    X = Mhat / (|Mhat|_F + eps), transposed when rows > cols
    5 times: A = X X^T;  X = a X + (b A + c A A) X
    W -= lr (sqrt(max(1, fan_out / fan_in)) X + wd W)

Muon's AdamW part (Optax's form, moments folded where the rule says)::

    m = b1 m + (1 - b1) F(g);   v = b2 v + (1 - b2) F(g^2)
    M = U m + c R;   V = U v + c^2 R^2
    u = alpha (M / (1 - b1^t)) / (sqrt(V / (1 - b2^t) + eps_root) + eps)
    W -= lr (u + wd_adam W)
"""

from __future__ import annotations

import numpy as np
from reference import LeafRule
from reference import np_fold
from reference import np_unfold
from reference import wide

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def fold_read(m, g, rule: LeafRule, c):
  """``U m + c R(g)`` for a folded leaf, ``m`` for an unfolded one."""
  if rule.axis is None:
    return m
  n = g.shape[rule.axis]
  r = g - np_unfold(np_fold(g, rule.axis, rule.k), rule.axis, rule.k, n)
  return np_unfold(m, rule.axis, rule.k, n) + c * r


def fold_energy(v, g, rule: LeafRule, c):
  """``U v + c^2 R(g)^2`` for a folded leaf, ``v`` for an unfolded one."""
  if rule.axis is None:
    return v
  n = g.shape[rule.axis]
  r = g - np_unfold(np_fold(g, rule.axis, rule.k), rule.axis, rule.k, n)
  return np_unfold(v, rule.axis, rule.k, n) + c**2 * r * r


def fold_or_keep(x, rule: LeafRule):
  return x if rule.axis is None else np_fold(x, rule.axis, rule.k)


def zeros_for(p, rule: LeafRule):
  return np.zeros_like(fold_or_keep(wide(p), rule))


class NumpyFoldedLion:
  """float64 ``foam_lion`` over a dict of arrays."""

  def __init__(self, rules, *, lr, b1=0.9, b2=0.99, wd=1e-3, c=1.0):
    self.rules, self.lr, self.b1, self.b2, self.wd, self.c = (
        rules, lr, b1, b2, wd, c)
    self.m = {}

  def init(self, params):
    self.m = {k: zeros_for(p, self.rules[k]) for k, p in params.items()}

  def step(self, params, grads):
    new = {}
    for k, p in params.items():
      rule, g, p = self.rules[k], wide(grads[k]), wide(p)
      big_m = fold_read(self.m[k], g, rule, self.c)
      u = np.sign(self.b1 * big_m + (1 - self.b1) * g)
      self.m[k] = self.b2 * self.m[k] + (1 - self.b2) * fold_or_keep(g, rule)
      new[k] = p - self.lr * (u + self.wd * p)
    return new


def newton_schulz(x, steps=5, eps=1e-8, coeffs=NS_COEFFS):
  """Optax's quintic Newton-Schulz on one matrix, Frobenius-normalised."""
  transposed = x.shape[0] > x.shape[1]
  if transposed:
    x = x.T
  x = x / (np.linalg.norm(x) + eps)
  a, b, c = coeffs
  for _ in range(steps):
    gram = x @ x.T
    x = a * x + (b * gram + c * gram @ gram) @ x
  return x.T if transposed else x


def orthogonalize(m):
  """Newton-Schulz over the last two axes; leading axes are a batch."""
  batch = m.reshape((-1,) + m.shape[-2:])
  out = np.stack([newton_schulz(x) for x in batch])
  fan_in, fan_out = m.shape[-2], m.shape[-1]
  return np.sqrt(max(1.0, fan_out / fan_in)) * out.reshape(m.shape)


class NumpyFoldedMuon:
  """float64 ``foam_muon`` over a dict of arrays.

  ``muon``: names of the hidden matrices; ``rules``: every leaf's fold.
  """

  def __init__(self, rules, muon, *, lr, beta=0.95, eps=1e-8, wd=0.0,
               nesterov=True, adam_b1=0.9, adam_b2=0.999, adam_wd=0.0,
               alpha=1.0, c=1.0):
    self.rules, self.muon, self.lr = rules, set(muon), lr
    self.beta, self.eps, self.wd, self.nesterov = beta, eps, wd, nesterov
    self.b1, self.b2, self.adam_wd, self.alpha, self.c = (
        adam_b1, adam_b2, adam_wd, alpha, c)
    self.t = 0
    self.m, self.v = {}, {}

  def init(self, params):
    for k, p in params.items():
      self.m[k] = zeros_for(p, self.rules[k])
      if k not in self.muon:
        self.v[k] = zeros_for(p, self.rules[k])

  def _muon(self, k, g):
    beta, t, rule = self.beta, self.t, self.rules[k]
    self.m[k] = beta * self.m[k] + (1 - beta) * fold_or_keep(g, rule)
    big_m = fold_read(self.m[k], g, rule, self.c)
    if self.nesterov:
      m_hat = (beta * big_m / (1 - beta ** (t + 1))
               + (1 - beta) * g / (1 - beta**t))
    else:
      m_hat = big_m / (1 - beta**t)
    return orthogonalize(m_hat)

  def _adam(self, k, g):
    b1, b2, t, rule = self.b1, self.b2, self.t, self.rules[k]
    self.m[k] = b1 * self.m[k] + (1 - b1) * fold_or_keep(g, rule)
    self.v[k] = b2 * self.v[k] + (1 - b2) * fold_or_keep(g * g, rule)
    big_m = fold_read(self.m[k], g, rule, self.c)
    big_v = fold_energy(self.v[k], g, rule, self.c)
    if self.nesterov:
      m_hat = b1 * big_m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1**t)
    else:
      m_hat = big_m / (1 - b1**t)
    u = m_hat / (np.sqrt(big_v / (1 - b2**t)) + self.eps)
    return u if rule.axis is None else self.alpha * u

  def step(self, params, grads):
    self.t += 1
    new = {}
    for k, p in params.items():
      g, p = wide(grads[k]), wide(p)
      if k in self.muon:
        new[k] = p - self.lr * (self._muon(k, g) + self.wd * p)
      else:
        new[k] = p - self.lr * (self._adam(k, g) + self.adam_wd * p)
    return new
