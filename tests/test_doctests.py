"""The runnable examples in the docstrings of examples.llama and benchmarks.

(pytest's ``--doctest-modules`` collects only ``foam_jax/``.)
"""

import doctest
import importlib

import pytest

MODULES = [
    *(f"examples.llama.{m}" for m in (
        "checkpoints", "configs", "data", "datasets", "distributed", "generate", "loader",
        "model", "optimizers", "outputs", "prepare_data", "sharding", "state", "steps",
        "switch", "tokenizers", "train_config")),
    *(f"benchmarks.{m}" for m in (
        "adam_mini", "common", "convergence", "convergence_plan", "convergence_report",
        "equal_tuning_plan", "grid", "heldout", "hlo", "horizon",
        "horizon_report", "horizon_trend", "layout_state", "memory", "memory_report", "step_time",
        "step_time_compare", "step_time_report", "step_time_runners", "stdlib_corpus")),
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests_pass(name):
  module = importlib.import_module(name)
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.failed == 0
