"""A corpus anyone can rebuild: the CPython standard library's own ``.py`` files.

The horizon study trains on the pure-Python sources of the standard library
of the interpreter that runs it. Which files count is exact:

* every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``,
* except those under a folder named ``site-packages``, ``test`` or ``tests``
  and those under ``idlelib/idle_test``,
* in sorted order of their paths relative to the stdlib folder.

Every tenth file of that order (index ``i % 10 == 9``) is validation, the
rest training, so both splits span the whole library. A file's bytes are
used as they are (the model is byte-level); files are joined with one
newline. The checksum is the SHA-256 of the training split, a zero byte, and
the validation split.

The corpus depends on the patch version of CPython: results are made with
:data:`PINNED_VERSION`, and :func:`load` refuses another one unless told to
take it (``any_version=True``) or given a corpus file (``python -m
benchmarks.stdlib_corpus --write DIR`` writes the running Python's), which is
then recorded as a different corpus.

Examples:
  >>> corpus = load(any_version=True)
  >>> corpus.info["files"] > 500 and corpus.info["name"].startswith("cpython-")
  True
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import sysconfig
from typing import Any

import numpy as np

__all__ = ["PINNED_VERSION", "Corpus", "build", "load", "split_files", "stdlib_files"]

PINNED_VERSION = "3.11.7"
_EXCLUDED_DIRS = ("site-packages", "test", "tests")
_EXCLUDED_PREFIXES = ("idlelib/idle_test/",)
_VAL_EVERY = 10


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Training and validation bytes, and what they are (``info``)."""

  train: np.ndarray
  val: np.ndarray
  info: dict[str, Any]


def stdlib_files(root: str | None = None) -> list[str]:
  """The corpus's files: sorted paths relative to the stdlib folder ``root``."""
  root = root or sysconfig.get_paths()["stdlib"]
  found = []
  for folder, dirs, names in os.walk(root):
    dirs[:] = [d for d in dirs if d not in _EXCLUDED_DIRS]
    for name in names:
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
        if not rel.startswith(_EXCLUDED_PREFIXES):
          found.append(rel)
  return sorted(found)


def _checksum(train: bytes, val: bytes) -> str:
  return hashlib.sha256(train + b"\0" + val).hexdigest()


def split_files(root: str | None = None) -> tuple[dict[str, bytes], dict[str, bytes]]:
  """The corpus's files by split: ``({path: bytes} for training, for validation)``.

  Paths are relative to the stdlib folder, in the corpus's order.
  """
  root = root or sysconfig.get_paths()["stdlib"]
  files = stdlib_files(root)
  if not files:
    raise ValueError(f"No .py files under the stdlib folder {root!r}.")
  splits: tuple[dict[str, bytes], dict[str, bytes]] = ({}, {})
  for i, rel in enumerate(files):
    with open(os.path.join(root, rel), "rb") as f:
      splits[i % _VAL_EVERY == _VAL_EVERY - 1][rel] = f.read()
  return splits


def build(root: str | None = None) -> tuple[bytes, bytes, dict[str, Any]]:
  """The running Python's corpus: ``(train, val, info)``."""
  splits = split_files(root)
  files = [*splits[0], *splits[1]]
  train, val = (b"\n".join(s.values()) for s in splits)
  version = platform.python_version()
  info = {"name": f"cpython-{version}-stdlib", "python": version,
          "implementation": platform.python_implementation(), "files": len(files),
          "train_bytes": len(train), "val_bytes": len(val),
          "sha256": _checksum(train, val)}
  return train, val, info


def _as_corpus(train: bytes, val: bytes, info: dict[str, Any]) -> Corpus:
  return Corpus(np.frombuffer(train, np.uint8).astype(np.int32),
                np.frombuffer(val, np.uint8).astype(np.int32), info)


def load(path: str | None = None, *, any_version: bool = False) -> Corpus:
  """The corpus: this Python's stdlib, or the one written to folder ``path``.

  Args:
    path: a folder written by ``--write`` (``train.bin``, ``val.bin``,
      ``info.json``); its checksum is verified and it is named after the
      Python that wrote it, prefixed ``file:``.
    any_version: take this Python's stdlib even if it is not
      :data:`PINNED_VERSION` (its version is in the corpus's name).

  Raises:
    ValueError: on another Python without ``any_version`` or ``path``, or if
      the files at ``path`` do not match their recorded checksum.
  """
  if path is not None:
    with open(os.path.join(path, "info.json")) as f:
      info = json.load(f)
    with open(os.path.join(path, "train.bin"), "rb") as f:
      train = f.read()
    with open(os.path.join(path, "val.bin"), "rb") as f:
      val = f.read()
    if _checksum(train, val) != info.get("sha256"):
      raise ValueError(f"The corpus at {path!r} does not match the checksum in its "
                       "info.json; write it again with --write.")
    return _as_corpus(train, val, {**info, "name": f"file:{info['name']}"})
  version = platform.python_version()
  if version != PINNED_VERSION and not any_version:
    raise ValueError(
        f"The horizon study's corpus is CPython {PINNED_VERSION}'s standard "
        f"library; this is Python {version}. Run it with Python "
        f"{PINNED_VERSION}, or pass --corpus DIR (a corpus written by `python -m "
        "benchmarks.stdlib_corpus --write DIR`) or --any-python, which record "
        "it as a different corpus.")
  return _as_corpus(*build())


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--write", metavar="DIR",
                      help="write this Python's corpus (train.bin, val.bin, info.json)")
  args = parser.parse_args(argv)
  train, val, info = build()
  if args.write:
    os.makedirs(args.write, exist_ok=True)
    for name, blob in (("train.bin", train), ("val.bin", val)):
      with open(os.path.join(args.write, name), "wb") as f:
        f.write(blob)
    with open(os.path.join(args.write, "info.json"), "w") as f:
      json.dump(info, f, indent=1)
  print(json.dumps(info, indent=1))


if __name__ == "__main__":
  main()
