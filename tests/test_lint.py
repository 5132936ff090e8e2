"""The repository passes its linter (ruff, configured in pyproject.toml)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
  result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)],
                          cwd=ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
