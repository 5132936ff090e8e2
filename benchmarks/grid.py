"""The benchmarks' grid: one name per measured setting of the example's optimizers.

The example offers optimizer families with settings
(``examples.llama.optimizers.make_optimizer("foam", fold_level=3,
fold_axis=-1)``); the benchmarks measure many settings side by side and
report each under a short name:

* ``foam_l{N}``: FOAM at fold level ``N``; ``foam_l{N}_ax1`` along the last
  axis; ``foam_int8``, ``foam_mini_int8``: int8 moments;
* ``foam_muon_l4``, ``foam_lion_l4``: folded Muon and Lion at level 4;
* every family name is also a grid name (its defaults).

Results files written before the names changed (``foam-l2``, ``foam_l2``,
``foam-mini``, ``foam-l3-ax-1``, ...) are read through
:func:`canonical_name`.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import optax

from examples.llama import optimizers

__all__ = ["DEFAULT_LR", "GRID", "NAMES", "canonical_name", "make_optimizer",
           "scale_by_lr_arg"]

_INT8 = {"mu_dtype": "int8", "nu_dtype": "int8"}

# Grid name -> (family, settings); the families themselves are added below.
GRID: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"foam_l{n}": ("foam", {"fold_level": n}) for n in (1, 3, 4)},
    **{f"foam_l{n}_ax1": ("foam", {"fold_level": n, "fold_axis": -1})
       for n in (1, 2, 3, 4)},
    "foam_int8": ("foam", _INT8),
    "foam_mini_int8": ("foam_mini", _INT8),
    "foam_lion_l4": ("foam_lion", {"fold_level": 4}),
    "foam_muon_l4": ("foam_muon", {"fold_level": 4}),
    **{name: (name, {}) for name in optimizers.OPTIMIZERS},
}
NAMES = tuple(GRID)
DEFAULT_LR = {name: optimizers.DEFAULT_LR[family] for name, (family, _) in GRID.items()}


def _lookup(name: str) -> tuple[str, dict[str, Any]]:
  if name not in GRID:
    raise ValueError(f"Unknown optimizer {name!r}; choose one of {NAMES}.")
  return GRID[name]


def make_optimizer(name: str, learning_rate: float | None = None,
                   total_steps: int | None = None, **kwargs: Any
                   ) -> optax.GradientTransformation:
  """The example's ``make_optimizer`` for grid name ``name``.

  ``learning_rate=None`` takes the family's default; ``kwargs`` are the
  example's ``make_optimizer`` keywords and override the grid's settings.

  Examples:
    >>> import jax.numpy as jnp
    >>> tx = make_optimizer("foam_l3_ax1", 1e-3)
    >>> tx.init({"w": jnp.zeros((8, 16))})[0].mu["w"].shape
    (8, 2)
  """
  family, settings = _lookup(name)
  return optimizers.make_optimizer(family, learning_rate, total_steps,
                                   **{**settings, **kwargs})


def canonical_name(name: str) -> str:
  """Today's grid name for a name in older results files.

  Examples:
    >>> [canonical_name(n) for n in ("foam_l2", "foam-l2", "foam-mini",
    ...                              "foam-l3-ax-1", "adamw")]
    ['foam', 'foam', 'foam_mini', 'foam_l3_ax1', 'adamw']
  """
  name = re.sub(r"[-_]ax-1$", "_ax1", name).replace("-", "_")
  return "foam" if name == "foam_l2" else name


def scale_by_lr_arg() -> optax.GradientTransformationExtraArgs:
  """Multiplies the updates by the ``lr`` passed to ``update`` (a traced scalar).

  Chained after an optimizer built with peak lr 1, it makes the peak lr an
  argument of the compiled step: one compilation serves a whole lr grid.

  Examples:
    >>> import jax.numpy as jnp
    >>> tx = optax.chain(optax.sgd(1.0), scale_by_lr_arg())
    >>> u, _ = tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}), lr=0.5)
    >>> u["w"].tolist()
    [-0.5, -0.5]
  """

  def update(updates, state, params=None, *, lr, **extra_args):
    del params, extra_args
    return jax.tree.map(lambda u: (lr * u).astype(u.dtype), updates), state

  return optax.GradientTransformationExtraArgs(
      lambda params: optax.EmptyState(), update)
