"""An experiment: FOAM's optimizer step as one hand-written loop per matrix.

On XLA:CPU the default float32 FOAM step stays near 0.8x ``optax.adamw``'s
(``results/archive/perf-notes.md``, 0.2): XLA emits one loop per output array, so both
moment loops and the update loop read the gradient, and the update loop
recomputes each block mean. This experiment asks what a loop written by hand
would give, and whether it can keep Optax's ``tx.update`` +
``optax.apply_updates`` split. ``native_step.cc`` holds four XLA FFI
handlers for a float32 matrix folded along axis -2 (level 2, blocks of 4
rows), each one pass per block of rows:

* ``native_apply``: FOAM, weight decay, learning rate and the apply in one
  loop, params and moments updated in place (not an Optax transformation:
  it returns new params);
* ``native_update``: FOAM's update written to a buffer of its own (what
  ``scale_by_foam`` must return), then weight decay, learning rate and the
  apply as XLA code;
* ``native_moments``: both moments in one pass over the gradient, in place;
  FOAM's update, weight decay, learning rate and the apply stay XLA code
  (one fused loop, as in ``foam_jax``), which recomputes the block means;
* ``native_moments_mean``: the same, the native pass also writing the block
  means for the update to read.

The leaves FOAM does not fold (embedding, head, norms) take the same Adam
in XLA code in all four. The script compiles ``native_step.cc`` with the
system's C++ compiler (``$CXX``, default ``g++``) against jaxlib's FFI
headers, checks each against ``foam_jax.foam`` over three steps, then
times ``optax.adamw``, ``foam_jax.foam`` and the four side by side
as ``benchmarks/step_time.py`` does (jitted, params and state donated,
interleaved repeats, median of paired ratios).

Usage::

  python -m benchmarks.native_step --out benchmarks/results/native_step.md
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import foam_jax
from benchmarks import common
from benchmarks import step_time
from benchmarks import step_time_runners as runners_lib

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_step.cc")
LR, WEIGHT_DECAY, B1, B2, EPS = 1e-3, 1e-4, 0.9, 0.999, 1e-8
TARGETS = {"native_apply": "FoamApplyF32", "native_update": "FoamUpdateF32",
           "native_moments": "FoamMomentsF32", "native_moments_mean": "FoamMomentsMeanF32"}
DESCRIPTION = (
    "Matrices FOAM folds (float32, axis -2, level 2) take a hand-written loop "
    "(`benchmarks/native_step.cc`, XLA FFI, single-threaded, one pass per block "
    "of 4 rows): `native_apply` does FOAM, weight decay, learning rate and the "
    "apply in that loop, in place (not an Optax transformation: it returns new "
    "params); `native_update` writes FOAM's update to a buffer of its own, as "
    "`scale_by_foam` must, and leaves weight decay, learning rate and the apply "
    "to XLA; `native_moments` updates only both moments in one pass, in place, "
    "and leaves FOAM's update (recomputing the block means), weight decay, "
    "learning rate and the apply to one XLA loop; `native_moments_mean` also "
    "writes the block means for that loop to read. The other leaves take Adam "
    "as XLA code in all. AdamW and FOAM are "
    "`optax.adamw` and `foam_jax.foam` (weight decay 1e-4, lr 1e-3). All jitted, "
    "params and state donated, timed side by side (`step_time_runners`), median "
    "of paired ratios.")


def build_and_register(workdir: str) -> None:
  """Compiles ``native_step.cc`` and registers its handlers for the CPU."""
  library = os.path.join(workdir, "libfoam_native_step.so")
  cxx = os.environ.get("CXX", "g++")
  subprocess.run(
      [cxx, "-O3", "-march=native", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC",
       "-w", f"-I{jax.ffi.include_dir()}", SOURCE, "-o", library], check=True)
  lib = ctypes.cdll.LoadLibrary(library)
  for name, symbol in TARGETS.items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)),
                                platform="cpu")


def native_step(kind: str):
  """``(params, state, grads) -> (params, state)`` on ``foam_jax.foam``'s state."""
  apply = kind == "native_apply"

  def moments_leaf(p, g, mu, nu, scalars):
    k = p.shape[0] // mu.shape[0]
    mean_shape = mu.shape if kind == "native_moments_mean" else (1, 1)
    mu, nu, mean = jax.ffi.ffi_call(
        kind, (jax.ShapeDtypeStruct(mu.shape, mu.dtype),
               jax.ShapeDtypeStruct(nu.shape, nu.dtype),
               jax.ShapeDtypeStruct(mean_shape, mu.dtype)),
        input_output_aliases={1: 0, 2: 1})(
            g, mu, nu, b1=np.float32(B1), b2=np.float32(B2), k=np.int64(k))
    blocks = g.reshape(mu.shape[0], k, mu.shape[1])
    if kind == "native_moments":  # The block mean as slices + adds, fused.
      mean = sum(blocks[:, i, :] for i in range(1, k)) + blocks[:, 0, :]
      mean = mean / k
    res = blocks - mean[:, None, :]
    u = scalars[0] * (mu[:, None, :] + res) / (jnp.sqrt(nu[:, None, :] + res * res) + EPS)
    return p - LR * (u.reshape(p.shape) + WEIGHT_DECAY * p), mu, nu

  def folded_leaf(p, g, mu, nu, scalars):
    if kind.startswith("native_moments"):
      return moments_leaf(p, g, mu, nu, scalars)
    k = p.shape[0] // mu.shape[0]
    aliases = {2: 1, 3: 2} | ({0: 0} if apply else {})
    out, mu, nu = jax.ffi.ffi_call(
        kind, (jax.ShapeDtypeStruct(p.shape, p.dtype),
               jax.ShapeDtypeStruct(mu.shape, mu.dtype),
               jax.ShapeDtypeStruct(nu.shape, nu.dtype)),
        input_output_aliases=aliases)(
            p, g, mu, nu, scalars, b1=np.float32(B1), b2=np.float32(B2),
            eps=np.float32(EPS), wd=np.float32(WEIGHT_DECAY), k=np.int64(k))
    if not apply:
      out = p - LR * (out + WEIGHT_DECAY * p)
    return out, mu, nu

  def adam_leaf(p, g, mu, nu, step_scale):
    mu = B1 * mu + (1 - B1) * g
    nu = B2 * nu + (1 - B2) * g * g
    u = step_scale * mu / (jnp.sqrt(nu) + EPS)
    return p - LR * (u + WEIGHT_DECAY * p), mu, nu

  def step(params, state, grads):
    foam_state, *rest = state
    count = foam_state.count + 1
    t = count.astype(jnp.float32)
    step_scale = jnp.sqrt(1 - B2**t) / (1 - B1**t)
    scalars = jnp.stack([step_scale, jnp.float32(LR)])
    leaves, treedef = jax.tree.flatten(params)
    new = []
    for p, g, mu, nu in zip(leaves, jax.tree.leaves(grads), jax.tree.leaves(foam_state.mu),
                            jax.tree.leaves(foam_state.nu)):
      if mu.shape != p.shape:
        new.append(folded_leaf(p, g, mu, nu, scalars))
      else:
        new.append(adam_leaf(p, g, mu, nu, step_scale))
    unflatten = lambda i: treedef.unflatten([n[i] for n in new])
    foam_state = foam_state._replace(count=count, mu=unflatten(1), nu=unflatten(2))
    return unflatten(0), (foam_state, *rest)

  return step


class NativeRunner(runners_lib.Runner):
  """A ``step_time_runners.Runner`` whose step is a native one."""

  def __init__(self, kind, params, grads):  # pylint: disable=super-init-not-called
    self.name = kind
    self.params = jax.tree.map(jnp.copy, params)
    self.state = jax.jit(foam_jax.foam(LR, weight_decay=WEIGHT_DECAY).init)(self.params)
    self.grads = grads
    self.step = jax.jit(native_step(kind), donate_argnums=(0, 1)).lower(
        self.params, self.state, grads).compile()
    self.memory = runners_lib.compiled_memory(self.step)
    self.state_bytes = common.tree_bytes(self.state)


def check(params, grads, steps: int = 3) -> dict[str, float]:
  """Largest deviation of each native step from ``foam_jax.foam`` after ``steps``.

  Per leaf ``max |p_native - p_foam| / max |p_foam - p_0|``, the largest over
  the folded leaves (those the kernels step); float32 rounding (the
  operations run in another order) is ~1e-6.
  """
  tx = foam_jax.foam(LR, weight_decay=WEIGHT_DECAY)
  ref = runners_lib.make_step(tx)
  out = {}
  for kind in TARGETS:
    step = jax.jit(native_step(kind))
    p_ref, s_ref = params, tx.init(params)
    p_nat, s_nat = params, tx.init(params)
    for i in range(steps):
      g = jax.tree.map(lambda x, i=i: x * (1.0 + i), grads)
      p_ref, s_ref = ref(jax.tree.map(jnp.copy, p_ref), s_ref, g)
      p_nat, s_nat = step(p_nat, s_nat, g)
    folded = [m.shape != p.shape for m, p in zip(jax.tree.leaves(s_ref[0].mu),
                                                  jax.tree.leaves(params))]
    out[kind] = max(
        float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a - p0)))
        for a, b, p0, f in zip(jax.tree.leaves(p_ref), jax.tree.leaves(p_nat),
                               jax.tree.leaves(params), folded) if f)
  return out


def render(results: dict[str, Any]) -> str:
  """The Markdown report."""
  lines = ["# Native FOAM step (an experiment)", "",
           DESCRIPTION, "",
           f"{results['size']} ({results['num_params'] / 1e6:.1f}M params), float32, "
           f"{results['repeats']} interleaved repeats. Deviation from `foam_jax.foam` "
           "after 3 steps (largest over the folded leaves of max |difference| / max "
           "|step|): "
           + ", ".join(f"{k} {v:.1e}" for k, v in results["check"].items()) + ".", "",
           "| step | median ms | paired ratio to AdamW | temp MiB |",
           "|---|---:|---:|---:|"]
  for row in results["rows"]:
    lines.append(f"| {row['name']} | {row['median_ms']:.2f} | {row['paired_ratio']:.3f} "
                 f"| {row['temp_bytes'] / 2**20:.1f} |")
  lines += ["", *common.provenance_lines(results["machine"], results["notes"])]
  return "\n".join(lines).rstrip("\n") + "\n"


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--size", default="50m", choices=sorted(step_time.SIZES))
  parser.add_argument("--repeats", type=int, default=40)
  parser.add_argument("--out", default=None, help="Markdown report path")
  parser.add_argument("--note", action="append", default=[])
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as workdir:
    build_and_register(workdir)
    cfg = step_time.size_config(args.size)
    params = step_time.random_params(cfg, seed=0)
    grads = step_time.random_params(cfg, seed=1)
    deviation = check(params, grads)
    print("deviation from foam_jax.foam:", deviation, flush=True)
    if max(deviation.values()) > 1e-4:
      raise RuntimeError(f"a native step is not FOAM's: deviation {deviation}")
    runners = [runners_lib.Runner("adamw", optax.adamw(LR, weight_decay=WEIGHT_DECAY),
                                  params, grads),
               runners_lib.Runner("foam", foam_jax.foam(LR, weight_decay=WEIGHT_DECAY),
                                  params, grads),
               *(NativeRunner(kind, params, grads) for kind in TARGETS)]
    times = runners_lib.time_interleaved(runners, warmup=3, repeats=args.repeats, inner=1)
  rows = [{"name": r.name, "median_ms": 1e3 * statistics.median(times[r.name]),
           "paired_ratio": statistics.median(
               a / b for a, b in zip(times[r.name], times["adamw"])),
           "temp_bytes": r.memory.get("temp_bytes", 0)} for r in runners]
  results = {"machine": common.machine_info(), "notes": args.note, "size": args.size,
             "num_params": cfg.num_params(), "repeats": args.repeats,
             "check": deviation, "rows": rows}
  report = render(results)
  print(report)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(report)
  return results


if __name__ == "__main__":
  main()
