"""The compile report: one optimizer update as the H100 and TPU compilers see it.

For each chip (``benchmarks.deviceless``: H100 SXM5 through the CUDA plugin,
TPU v5e, v5p and v6e through libtpu; no device needed), each weight dtype
(bfloat16, float32), each leaf shape of LLaMA-7B (plus one with a tail
block, and a whole 2-layer 7B-width tree) and each optimizer, it compiles

.. code-block:: python

  def step(p, s, g):                      # jitted, donate_argnums=(0, 1)
    u, s2 = tx.update(g, s, p)
    return optax.apply_updates(p, u), s2

and records what the compiler counts: bytes accessed, temporaries and
kernels, each divided by the weight's bytes, and the ratio of the bytes to
``optax.adamw(1e-3)``'s on the same compiler and leaf. The optimizers are
Optax's baselines and FOAM's aliases at their defaults (the rows the
targets are stated for), and every optimizer of the example's registry at
its defaults (``benchmarks.grid`` names, GaLore included).

Results go to ``benchmarks/results/compile/updates.json`` after every chip
(resumable: rows already there are skipped) and
``benchmarks/results/compile/updates.md``. Run in the background::

  python -m benchmarks.compile_report --chips h100 v5e v5p v6e
  python -m benchmarks.compile_report --render   # the report from the JSON

Counts from a compiler are not timings: an update is bandwidth-bound, so
its bytes predict its time on the device; they are not a measurement of it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

from benchmarks import deviceless

# Before JAX reads its platforms: the CUDA plugin must not look for a GPU.
deviceless.configure_environment()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import foam_jax  # noqa: E402
from examples.llama import optimizers  # noqa: E402
from examples.llama import outputs  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compile")

# LLaMA-7B's leaf shapes (Flax (in, out) kernels), named by the example's
# paths so that FOAM's default policy treats each as it treats the model's.
LEAVES: dict[str, tuple[str, tuple[int, ...]]] = {
    "attention (4096, 4096)": ("q_proj", (4096, 4096)),
    "mlp up (4096, 11008)": ("up_proj", (4096, 11008)),
    "mlp down (11008, 4096)": ("down_proj", (11008, 4096)),
    "embedding (32000, 4096)": ("embed_tokens", (32000, 4096)),
    "head (4096, 32000)": ("lm_head", (4096, 32000)),
    "norm (4096,)": ("norm", (4096,)),
    "tail block (4098, 11000)": ("up_proj", (4098, 11000)),
}
WHOLE_TREE = "2-layer 7B-width tree"
DTYPES = ("bfloat16", "float32")

# Optax's baselines and FOAM's aliases at their defaults: the ratios of the
# compile issue are stated for these.
BASELINES = {
    "optax.adamw": lambda: optax.adamw(1e-3),
    "optax.lion": lambda: optax.lion(1e-3),
    "optax.contrib.muon": lambda: optax.contrib.muon(1e-3),
    "foam": lambda: foam_jax.foam(1e-3),
    "foam axis -1": lambda: foam_jax.foam(1e-3, fold_spec=optimizers.fold_along(-1, None)),
    "foam int8": lambda: foam_jax.foam(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "foam l1": lambda: foam_jax.foam(1e-3, fold_level=1),
    "foam l3": lambda: foam_jax.foam(1e-3, fold_level=3),
    "foam l4": lambda: foam_jax.foam(1e-3, fold_level=4),
    "foam_mini": lambda: foam_jax.foam_mini(1e-3),
    "foam_lion": lambda: foam_jax.foam_lion(1e-3),
    "foam_muon": lambda: foam_jax.foam_muon(1e-3),
}
# The example's registry (grid names), each at its defaults.
REGISTRY = ("adamw", "adafactor", "lion", "muon", "galore", "foam", "foam_l1", "foam_l3",
            "foam_l4", "foam_l2_ax1", "foam_mini", "foam_int8", "foam_muon", "foam_lion")
# What each FOAM row is compared with, besides optax.adamw.
COMPARATORS = {"foam_lion": "optax.lion", "foam_muon": "optax.contrib.muon"}


def make_optimizer(name: str) -> optax.GradientTransformation:
  """A baseline (``optax.adamw``, ``foam``, ...) or ``registry:<grid name>``."""
  if name.startswith("registry:"):
    from benchmarks import grid  # noqa: PLC0415

    return grid.make_optimizer(name.split(":", 1)[1], 1e-3, hidden_size=4096)
  return BASELINES[name]()


def optimizer_names() -> list[str]:
  return [*BASELINES, *(f"registry:{n}" for n in REGISTRY)]


def leaf_tree(leaf: str, dtype: str) -> dict[str, Any]:
  """The abstract weights of one row: one named leaf, or the 2-layer tree."""
  if leaf == WHOLE_TREE:
    from benchmarks import memory  # noqa: PLC0415

    return memory.abstract_params(memory.llama_config("7b", num_layers=2), dtype)
  name, shape = LEAVES[leaf]
  return {name: {"kernel" if len(shape) > 1 else "scale": jax.ShapeDtypeStruct(shape, dtype)}}


def _placed(tree: Any, sharding) -> Any:
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def measure_update(tx: optax.GradientTransformation, params: Any, chip: str) -> dict[str, Any]:
  """Compiles the donated update step of ``tx`` on ``params`` for one ``chip``."""
  mesh = jax.sharding.Mesh(deviceless.devices(chip, 1), ("x",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  params = _placed(params, replicated)
  state = _placed(jax.eval_shape(tx.init, params), replicated)

  def step(p, s, g):
    u, s2 = tx.update(g, s, p)
    return optax.apply_updates(p, u), s2

  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
  out = deviceless.counts(compiled)
  out["compile_s"] = round(time.perf_counter() - start, 2)
  weight = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))
  out["weight_bytes"] = weight
  out["bytes_per_weight"] = out["bytes_accessed"] / weight
  out["temp_per_weight"] = out["temp_bytes"] / weight
  return out


def row_key(row: dict[str, Any]) -> str:
  return f"{row['chip']}|{row['dtype']}|{row['leaf']}|{row['optimizer']}"


def versions() -> dict[str, str]:
  from importlib import metadata  # noqa: PLC0415

  out = {"python": platform.python_version(), "machine": platform.machine(),
         "processor": platform.processor() or platform.machine()}
  for dist in ("jax", "jaxlib", "jax-cuda13-plugin", "libtpu", "optax", "flax"):
    try:
      out[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
      pass
  return out


def load(path: str) -> dict[str, Any]:
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  return {"rows": [], "info": {}}


def save(data: dict[str, Any], path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


# Rows left out, with why: (chip platform, optimizer) -> reason.
OMITTED = {
    ("tpu", "registry:galore"): (
        "GaLore's update (an SVD every 200 steps, compiled into every step) had not "
        "finished compiling for v5e after 7 minutes and 7 GB on this 2-core machine; "
        "left out on TPU"),
}


def omitted(chip: str, name: str) -> str | None:
  return OMITTED.get((deviceless.CHIPS[chip]["platform"], name))


def run(chips, leaves, dtypes, names, path, log=print) -> dict[str, Any]:
  """Measures every missing row and saves after each (resumable)."""
  data = load(path)
  data["info"] = {**versions(), "command": " ".join(sys.argv)}
  data["omitted"] = [f"{name} on {chip}: {omitted(chip, name)}"
                     for chip in chips for name in names if omitted(chip, name)]
  done = {row_key(r) for r in data["rows"]}
  commit = outputs.git_commit()  # Each row records the code it compiled.
  for chip in chips:
    for dtype in dtypes:
      for leaf in leaves:
        params = leaf_tree(leaf, dtype)
        for name in names:
          row = {"chip": chip, "dtype": dtype, "leaf": leaf, "optimizer": name}
          if row_key(row) in done or omitted(chip, name):
            continue
          row["commit"] = commit
          try:
            row.update(measure_update(make_optimizer(name), params, chip))
          except Exception as e:  # a failed compile is a result to report
            row["error"] = f"{type(e).__name__}: {e}"[:300]
          data["rows"].append(row)
          save(data, path)
          log(f"{chip} {dtype} {leaf} {name}: "
              + (row.get("error") or f"{row['bytes_per_weight']:.3f} bytes/weight, "
                 f"temp {row['temp_per_weight']:.3f}, {row['kernels']} kernels, "
                 f"{row['compile_s']} s"))
  return data


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--chips", nargs="+", default=list(deviceless.CHIPS),
                      choices=list(deviceless.CHIPS))
  parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
  parser.add_argument("--leaves", nargs="+", default=[*LEAVES, WHOLE_TREE])
  parser.add_argument("--optimizers", nargs="+", default=optimizer_names())
  parser.add_argument("--out", default=os.path.join(RESULTS, "updates.json"))
  parser.add_argument("--render", action="store_true", help="only write the report")
  args = parser.parse_args(argv)
  if not args.render:
    run(args.chips, args.leaves, args.dtypes, args.optimizers, args.out)
  from benchmarks import compile_render  # noqa: PLC0415

  data = load(args.out)
  md = compile_render.render_updates(data)
  with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
    f.write(md)


if __name__ == "__main__":
  main()
