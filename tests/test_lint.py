"""The project's own Python files pass its linter (ruff, pinned in pyproject.toml).

Only the project's packages, tests, example and benchmarks are linted: a
virtual environment created inside the clone (``./venv``, ``./env``, ...)
holds other people's code, which is not ours to lint.
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT_DIRS = ("foam_jax", "tests", "examples", "benchmarks", "docs")


def test_ruff_check_passes():
  paths = [d for d in PROJECT_DIRS if (ROOT / d).is_dir()]
  result = subprocess.run([sys.executable, "-m", "ruff", "check", *paths],
                          cwd=ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
