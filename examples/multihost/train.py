"""FOAM on one global mesh spanning every process: the multi-host recipe.

The same code runs on a TPU pod, a multi-node GPU cluster, or several CPU
processes on one machine. Every process runs this script; JAX joins them
(``jax.distributed.initialize``) into one set of global devices, the mesh
covers all of them, and each process only touches its own shards. FOAM's
update is block-local, so the optimizer adds no communication: the only
collectives of a step are the model's own (the gradient reduction over the
data axis).

Simulated here, 2 processes x 4 CPU devices (run both; they wait for each
other)::

  export XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu
  python examples/multihost/train.py --coordinator localhost:12355 \\
      --num-processes 2 --process-id 0 &
  python examples/multihost/train.py --coordinator localhost:12355 \\
      --num-processes 2 --process-id 1

On a TPU pod (or SLURM / Open MPI GPU clusters, which JAX detects), run the
same script on every host with no flags but ``--distributed``:
``jax.distributed.initialize()`` finds the coordinator by itself.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import foam_jax

MODEL_AXIS = 4  # Tensor-parallel width; the rest of the devices do data parallel.

# Every weight's PartitionSpec: FSDP x TP on a ("data", "model") mesh.
PARAM_SPECS = {
    "w_in": P("data", "model"),  # (d_in, hidden)
    "b_in": P("model"),  # (hidden,)
    "w_out": P("model", "data"),  # (hidden, d_out)
}
D_IN, HIDDEN, D_OUT, BATCH = 32, 64, 16, 16


def make_mesh() -> jax.sharding.Mesh:
  """A ``(data, model)`` mesh over all global devices (every process's)."""
  model = min(MODEL_AXIS, jax.device_count())
  return jax.make_mesh(
      (jax.device_count() // model, model), ("data", "model"),
      axis_types=(AxisType.Auto, AxisType.Auto),
  )


def _global_array(values: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array of which each process materialises only its own shards."""
  return jax.make_array_from_callback(
      values.shape, sharding, lambda index: values[index]
  )


def init_params(mesh, seed: int = 0) -> dict[str, jax.Array]:
  rng = np.random.default_rng(seed)  # Same numbers on every process.
  values = {
      "w_in": rng.standard_normal((D_IN, HIDDEN), np.float32) / D_IN**0.5,
      "b_in": np.zeros((HIDDEN,), np.float32),
      "w_out": rng.standard_normal((HIDDEN, D_OUT), np.float32) / HIDDEN**0.5,
  }
  return {
      k: _global_array(v, NamedSharding(mesh, PARAM_SPECS[k]))
      for k, v in values.items()
  }


def batch(mesh, step: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
  """The global batch of ``step``, sharded over ``data`` (one slice per host).

  A real loader would give each process its own slice; this toy regression
  cycles over 2 fixed batches that every process can build.
  """
  rng = np.random.default_rng([seed, step % 2])
  x = rng.standard_normal((BATCH, D_IN), np.float32)
  y = np.sin(x[:, :D_OUT])
  data = NamedSharding(mesh, P("data", None))
  return _global_array(x, data), _global_array(y, data)


def loss_fn(params, x, y):
  h = jax.nn.gelu(x @ params["w_in"] + params["b_in"])
  return jnp.mean((h @ params["w_out"] - y) ** 2)


def run(steps: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
  """Trains a few FOAM steps; returns the final params and moments (numpy).

  Every process calls this; the returned arrays are the full global values,
  identical on every process.
  """
  mesh = make_mesh()
  params = init_params(mesh, seed)
  tx = foam_jax.foam(1e-2, weight_decay=0.0)
  # Eager init on the sharded params: states are allocated sharded like them.
  state = tx.init(params)

  @jax.jit
  def train_step(params, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  for step in range(steps):
    params, state, loss = train_step(params, state, *batch(mesh, step, seed))
    if jax.process_index() == 0:
      print(f"step {step}: loss {float(loss):.6f}", flush=True)
  result = {f"params/{k}": v for k, v in params.items()}
  result.update({f"mu/{k}": v for k, v in state[0].mu.items()})
  result.update({f"nu/{k}": v for k, v in state[0].nu.items()})
  # Gather every shard to every process (only for this demo's comparison).
  return {
      k: np.asarray(v)
      for k, v in multihost_utils.process_allgather(result, tiled=True).items()
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coordinator", help="host:port of process 0")
  parser.add_argument("--num-processes", type=int, default=1)
  parser.add_argument("--process-id", type=int, default=0)
  parser.add_argument(
      "--distributed", action="store_true",
      help="call jax.distributed.initialize() with cluster auto-detection",
  )
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--out", help="process 0 saves the result here (.npz)")
  args = parser.parse_args()
  if args.num_processes > 1:
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )
  elif args.distributed:
    jax.distributed.initialize()
  print(
      f"process {jax.process_index()}/{jax.process_count()}: "
      f"{jax.local_device_count()} local of {jax.device_count()} devices",
      flush=True,
  )
  result = run(args.steps)
  if args.out and jax.process_index() == 0:
    np.savez(args.out, **result)
  if jax.process_count() > 1:
    jax.distributed.shutdown()


if __name__ == "__main__":
  main()
