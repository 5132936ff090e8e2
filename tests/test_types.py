"""``py.typed`` is a promise: the library type-checks (mypy, pinned in pyproject.toml)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mypy_finds_no_errors_in_the_library():
  result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "foam_jax"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
