"""Quantizer study for int8 moments (issue 13): 8-bit codes vs a float64 reference.

NumPy only. Run: python -m benchmarks.quantizer_study > benchmarks/results/quantizer_study.txt
"""
import numpy as np

rng = np.random.default_rng(0)
R, C = 32, 2048
sigma = 10.0 ** rng.uniform(-3, 0, (R, C))          # v spans 6 decades
STEPS, b1, b2, eps = 300, 0.9, 0.999, 1e-8

def blocks(x, B):
  return x.reshape(R, C // B, B)

def code_quant(x, B, values, signed, stoch, rs, u=None):
  """Nearest (or stochastic) rounding to scale*values, scale=absmax per block.

  Stochastic rounding draws its uniforms from ``rs``, or takes them as ``u``.
  """
  xb = blocks(x, B)
  s = np.abs(xb).max(-1, keepdims=True)
  s = np.where(s > 0, s, 1.0)
  r = xb / s
  vals = np.sort(values)
  i = np.clip(np.searchsorted(vals, r), 1, len(vals) - 1)
  lo, hi = vals[i - 1], vals[i]
  if stoch:
    p = (r - lo) / (hi - lo)
    q = np.where((rs.random(r.shape) if u is None else u.reshape(r.shape)) < p, hi, lo)
  else:
    q = np.where(r - lo < hi - r, lo, hi)
  return (q * s).reshape(R, C)

def dyn_map(signed):
  vals = [0.0, 1.0]
  for i in range(7):
    n = 2 ** (i if signed else i + 1)
    b = np.linspace(0.1, 1, n + 1)
    mids = (b[:-1] + b[1:]) / 2 * 10.0 ** (i - 6)
    vals += list(mids) + (list(-mids) if signed else [])
  if signed:
    vals.append(-1.0)
  return np.unique(vals)

def log_map(signed, rate):
  top = 127 if signed else 255
  v = 2.0 ** ((np.arange(1, top + 1) - top) / rate)
  return np.unique(np.concatenate([[0.0], v, -v if signed else []]))

lin_s = np.linspace(-1, 1, 255)
lin_u = np.linspace(0, 1, 256)
zero_free_u = (np.arange(256) + 1) / 256.0   # 4-bit paper's zero-free linear map, 8 bits

CANDIDATES = {
  # name: (m values, v values, store sqrt(v), B, zero_free)
  "linear absmax B=256": (lin_s, lin_u, False, 256),
  "linear absmax of sqrt(v) B=256": (lin_s, lin_u, True, 256),
  "zero-free linear (v), linear (m) B=256": (lin_s, zero_free_u, False, 256),
  "zero-free linear of sqrt(v) B=256": (lin_s, zero_free_u, True, 256),
  "dynamic tree B=256": (dyn_map(True), dyn_map(False), False, 256),
  "dynamic tree B=2048": (dyn_map(True), dyn_map(False), False, 2048),
  "log r_m=4 r_v=8 B=256 (chosen)": (log_map(True, 4), log_map(False, 8), False, 256),
  "log r_m=6 r_v=12 B=256": (log_map(True, 6), log_map(False, 12), False, 256),
  "log r_m=4 r_v=8 B=2048": (log_map(True, 4), log_map(False, 8), False, 2048),
}
def float_map(signed, b):
  """The float code: ``b`` mantissa bits, the top 127 (signed) or 255 values."""
  top = 127 if signed else 255
  g = np.array(sorted({2.0**e * (1 + j / 2**b) for e in range(-80, 1) for j in range(2**b)}))
  g = g[g <= 1.0][-top:]
  return np.unique(np.concatenate([[0.0], g, -g if signed else []]))
CANDIDATES["float code b=2/b=3 B=256 (before)"] = (float_map(True, 2), float_map(False, 3), False, 256)
CANDIDATES["float code b=3/b=3 B=256 (shipped)"] = (float_map(True, 3), float_map(False, 3), False, 256)
CANDIDATES["float code b=4/b=3 B=256"] = (float_map(True, 4), float_map(False, 3), False, 256)
import sys

if len(sys.argv) > 1:
  CANDIDATES = {k: v for k, v in CANDIDATES.items() if k.startswith(sys.argv[1])}

PHI = (np.sqrt(5) - 1) / 2

def run(cand, stoch):
  """stoch: False (nearest), True (independent uniforms every step) or
  "weyl" (per entry, a random start advanced by the golden ratio each step)."""
  mv, vv, sq, B = cand or (None, None, None, None)
  rs = np.random.default_rng(1)
  grs = np.random.default_rng(2)
  m = np.zeros((R, C)); v = np.zeros((R, C))
  mq = np.zeros((R, C)); vq = np.zeros((R, C))
  starts = np.random.default_rng(3)  # Its own stream: the other rows stay as they were.
  start_m, start_v = starts.random((R, C)), starts.random((R, C))
  for t in range(STEPS):
    g = sigma * grs.standard_normal((R, C))
    m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g
    if cand is None:
      continue
    um, uv = ((start_m + t * PHI) % 1, (start_v + t * PHI) % 1) if stoch == "weyl" else (None, None)
    mq = code_quant(b1 * mq + (1 - b1) * g, B, mv, True, bool(stoch), rs, um)
    vn = b2 * vq + (1 - b2) * g * g
    if sq:
      vq = code_quant(np.sqrt(vn), B, vv, False, bool(stoch), rs, uv) ** 2
    else:
      vq = code_quant(vn, B, vv, False, bool(stoch), rs, uv)
  return m, v, mq, vq

def errors(m, v, mq, vq):
  t = STEPS
  u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
  uq = (mq / (1 - b1**t)) / (np.sqrt(vq / (1 - b2**t)) + eps)
  rv = np.abs(vq - v) / v
  rm = np.linalg.norm(mq - m) / np.linalg.norm(m)
  ru = np.linalg.norm(uq - u) / np.linalg.norm(u)
  return (np.median(rv), np.quantile(rv, 0.99), (vq == 0).mean(), rm, ru,
          np.abs(uq).max())

def oneshot(cand, m, v):
  mv, vv, sq, B = cand
  rs = np.random.default_rng(1)
  mq = code_quant(m, B, mv, True, False, rs)
  vq = code_quant(np.sqrt(v), B, vv, False, False, rs) ** 2 if sq else code_quant(v, B, vv, False, False, rs)
  return errors(m, v, mq, vq)

m, v, _, _ = run(None, False)
print(f"v spans {np.log10(v.max()/v.min()):.1f} decades; |u|max float64 {np.abs((m/(1-b1**STEPS))/(np.sqrt(v/(1-b2**STEPS))+eps)).max():.2f}")
hdr = "| candidate | v rel.err median | v rel.err p99 | v stored as 0 | m rel.err (norm) | update rel.err (norm) | max abs update |"
print("\n(a) quantize once the float64 moments after 300 steps\n" + hdr + "\n|---|---|---|---|---|---|---|")
for name, cand in CANDIDATES.items():
  e = oneshot(cand, m, v)
  print(f"| {name} | {e[0]:.3g} | {e[1]:.3g} | {e[2]:.3g} | {e[3]:.3g} | {e[4]:.3g} | {e[5]:.3g} |")
ROUNDING = {False: "nearest rounding", True: "stochastic rounding",
            "weyl": "stochastic rounding, per-entry Weyl sequence (shipped)"}
for stoch in (False, True, "weyl"):
  print(f"\n(b) quantized every step for 300 steps, {ROUNDING[stoch]}\n" + hdr + "\n|---|---|---|---|---|---|---|")
  for name, cand in CANDIDATES.items():
    e = errors(*run(cand, stoch))
    print(f"| {name} | {e[0]:.3g} | {e[1]:.3g} | {e[2]:.3g} | {e[3]:.3g} | {e[4]:.3g} | {e[5]:.3g} |", flush=True)
