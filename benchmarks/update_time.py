"""The compile report's update step, timed on the device it runs on.

The step of ``benchmarks.compile_report`` (``tx.update`` then
``optax.apply_updates``, jitted with the weight and the state donated) on
one ``(4096, 11008)`` weight, timed on the default device for AdamW, FOAM
(float and int8 moments, fold axis -1), Lion and folded Lion, bf16 and
float32: the median over ``--repeats`` timings of ``--inner`` steps each,
after warm-up, interleaved across optimizers, as ratios to ``optax.adamw``.
Beside each ratio, the ratio of the bytes the same compiled program moves
(its compiler's cost analysis), so that bytes can be checked against time.
``benchmarks/gpu.sh`` runs it on a lent GPU::

  python -m benchmarks.update_time --out update_time_gpu.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from benchmarks import compile_report

NAMES = ("optax.adamw", "foam", "foam axis -1", "foam int8", "optax.lion", "foam_lion")
SHAPE = (4096, 11008)


def _program(name: str, dtype):
  tx = compile_report.make_optimizer(name)
  params = {"up_proj": {"kernel": jnp.zeros(SHAPE, dtype)}}

  def step(p, s, g):
    u, s2 = tx.update(g, s, p)
    return optax.apply_updates(p, u), s2

  step = jax.jit(step, donate_argnums=(0, 1))
  grads = {"up_proj": {"kernel": jnp.full(SHAPE, 1e-3, dtype)}}
  state = tx.init(params)
  cost = step.lower(params, state, grads).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return step, [params, state], grads, (cost or {}).get("bytes accessed")


def measure(dtypes, repeats: int, inner: int, warmup: int) -> list[dict]:
  rows = []
  for dtype in dtypes:
    programs = {n: _program(n, dtype) for n in NAMES}
    times = {n: [] for n in NAMES}
    for step, carry, g, _ in programs.values():
      for _ in range(warmup):
        carry[:] = step(*carry, g)
      jax.block_until_ready(carry)
    for _ in range(repeats):
      for n, (step, carry, g, _) in programs.items():
        start = time.perf_counter()
        for _ in range(inner):
          carry[:] = step(*carry, g)
        jax.block_until_ready(carry)
        times[n].append((time.perf_counter() - start) / inner)
    base_t = statistics.median(times["optax.adamw"])
    base_b = programs["optax.adamw"][3]
    for n in NAMES:
      t, b = statistics.median(times[n]), programs[n][3]
      rows.append({"dtype": jnp.dtype(dtype).name, "optimizer": n, "seconds": t,
                   "time_ratio": t / base_t,
                   "bytes_ratio": None if not (b and base_b) else b / base_b})
  return rows


def render(rows: list[dict], repeats: int, inner: int) -> str:
  lines = [f"# The update step on {jax.devices()[0].device_kind}", "",
           f"One {SHAPE} weight; median of {repeats} interleaved timings of {inner} "
           "steps after warm-up; ratios to `optax.adamw` on this device.", "",
           "| dtype | optimizer | ms | time ratio | bytes ratio (its compiler) |",
           "|---|---|---|---|---|"]
  for r in rows:
    b = "" if r["bytes_ratio"] is None else f"{r['bytes_ratio']:.2f}"
    lines.append(f"| {r['dtype']} | {r['optimizer']} | {1e3 * r['seconds']:.3f} | "
                 f"{r['time_ratio']:.2f} | {b} |")
  lines += ["", f"jax {jax.__version__}, devices {jax.devices()}", ""]
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--dtypes", default="bfloat16,float32")
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--inner", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--out", default="update_time.md")
  args = parser.parse_args(argv)
  rows = measure(args.dtypes.split(","), args.repeats, args.inner, args.warmup)
  text = render(rows, args.repeats, args.inner)
  with open(args.out, "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
