"""The training state: a model and its ``nnx.Optimizer``, placed on a mesh.

``state = nnx.state((model, optimizer))`` is what the steps take, what the
checkpoints hold and what the shardings describe; ``nnx.merge(graphdef,
state)`` gives ``(model, optimizer)`` back.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import nnx

from examples.llama import configs as configs_lib
from examples.llama import model as model_lib
from examples.llama import sharding as sharding_lib

__all__ = ["abstract_state", "create_state"]


def _model_and_optimizer(cfg: configs_lib.LlamaConfig, tx: optax.GradientTransformation,
                         seed: int):
  model = model_lib.Llama(cfg, rngs=nnx.Rngs(seed))
  return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def create_state(
    cfg: configs_lib.LlamaConfig,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    seed: int = 0,
) -> tuple[nnx.GraphDef, nnx.State, Any]:
  """Builds the model and optimizer on ``mesh``: ``(graphdef, state, shardings)``.

  On several devices the weights are created inside ``jit``, already sharded
  (no device holds them all); on one, eagerly (no initialiser compiles). The
  optimizer state is then initialised from the placed weights, so FOAM's
  default policy sees each weight's sharding and keeps its blocks inside
  shards. ``shardings`` are the state's ``NamedSharding``s, from the
  weights' annotations (``model.SHARDING``).

  Examples:
    >>> mesh = sharding_lib.make_mesh({"fsdp": 1, "tp": 1})
    >>> cfg = configs_lib.get_config("tiny", num_layers=1)
    >>> graphdef, state, _ = create_state(cfg, optax.sgd(0.1), mesh)
    >>> model, optimizer = nnx.merge(graphdef, state)
    >>> type(model).__name__, type(optimizer).__name__
    ('Llama', 'Optimizer')
  """

  def sharded_model():
    model = model_lib.Llama(cfg, rngs=nnx.Rngs(seed))
    params = nnx.state(model)
    nnx.update(model, jax.lax.with_sharding_constraint(
        params, sharding_lib.variable_shardings(params, mesh)))
    return model

  # The arrays are placed by us (annotations fitted to each shape), not by
  # NNX's eager sharding, which would fail on e.g. a folded state of 2 rows.
  with jax.set_mesh(mesh), nnx.use_eager_sharding(False):
    if mesh.devices.size > 1:
      model = nnx.jit(sharded_model)()
    else:
      model = model_lib.Llama(cfg, rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  shardings = sharding_lib.variable_shardings(state, mesh)
  return graphdef, jax.device_put(state, shardings), shardings


def abstract_state(
    cfg: configs_lib.LlamaConfig, tx: optax.GradientTransformation
) -> tuple[nnx.GraphDef, nnx.State]:
  """``(graphdef, state)`` with ``jax.ShapeDtypeStruct`` leaves: nothing allocated.

  Examples:
    >>> _, state = abstract_state(configs_lib.get_config("7b"), optax.adam(1e-3))
    >>> state[0]["lm_head"]["kernel"].shape
    (4096, 32000)
  """
  with nnx.use_eager_sharding(False):
    model, optimizer = nnx.eval_shape(lambda: _model_and_optimizer(cfg, tx, 0))
  return nnx.split((model, optimizer))
