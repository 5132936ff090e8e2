"""Held-out evaluation windows with near-copies of training files removed.

The stdlib corpus validates on every tenth file (:mod:`benchmarks.stdlib_corpus`),
and some of those files are near-copies of training files (the codec tables
under ``encodings/`` differ in a few lines). A validation file is removed
when the Jaccard similarity of its set of byte 8-grams with any training
file's is at least 0.5:

    J(A, B) = |A & B| / |A | B|,   A, B = the distinct 8-byte substrings.

Since ``J(A, B) <= min(|A|, |B|) / max(|A|, |B|)``, pairs whose sizes differ
by more than 2x cannot reach 0.5 and are not compared.

The kept files are joined with one newline (as the corpus joins them), cut
into disjoint windows of ``seq_len + 1`` bytes, and ``count`` windows are
drawn without replacement by a generator with a fixed seed: every run of a
study evaluates on the same windows.

Examples:
  >>> a, b = b"0123456789abcdef", b"0123456789abcdeX"
  >>> round(jaccard(ngrams(a), ngrams(b)), 3)  # 8 shared of 8 + 1 + 1.
  0.8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from typing import Any

import numpy as np

from benchmarks import stdlib_corpus

__all__ = ["REMOVED_LIST", "THRESHOLD", "jaccard", "main", "near_copies", "ngrams",
           "windows"]

# The committed list of the stdlib corpus's removed validation files.
REMOVED_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                            "equal_tuning", "heldout.json")

THRESHOLD = 0.5
NGRAM = 8


def ngrams(data: bytes, n: int = NGRAM) -> np.ndarray:
  """The distinct ``n``-byte substrings of ``data`` (``n <= 8``), sorted, as uint64."""
  if not 1 <= n <= 8:
    raise ValueError(f"n must be in [1, 8], got {n!r}.")
  arr = np.frombuffer(data, np.uint8)
  if len(arr) < n:
    return np.zeros((0,), np.uint64)
  view = np.lib.stride_tricks.sliding_window_view(arr, n)
  padded = np.zeros((len(view), 8), np.uint8)
  padded[:, :n] = view
  return np.unique(padded.view(np.uint64).ravel())


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
  """Jaccard similarity of two sorted arrays of distinct values."""
  if len(a) == 0 and len(b) == 0:
    return 1.0
  shared = len(np.intersect1d(a, b, assume_unique=True))
  return shared / (len(a) + len(b) - shared)


def near_copies(train: dict[str, bytes], val: dict[str, bytes],
                threshold: float = THRESHOLD) -> list[dict[str, Any]]:
  """The validation files whose 8-grams overlap a training file's by ``threshold`` or more.

  Returns:
    One ``{"file", "closest", "jaccard"}`` per removed file, in ``val``'s order.
  """
  train_sets = {name: ngrams(data) for name, data in train.items()}
  sizes = {name: len(s) for name, s in train_sets.items()}
  removed = []
  for name, data in val.items():
    own = ngrams(data)
    best, closest = 0.0, None
    for other, grams in train_sets.items():
      small, large = sorted((len(own), sizes[other]))
      if large == 0 or small < threshold * large or small / large <= best:
        continue
      score = jaccard(own, grams)
      if score > best:
        best, closest = score, other
    if best >= threshold:
      removed.append({"file": name, "closest": closest, "jaccard": round(best, 4)})
  return removed


def windows(val: dict[str, bytes], removed: list[str], seq_len: int, count: int,
            seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
  """``count`` disjoint windows of ``seq_len + 1`` bytes from the kept validation files.

  Returns:
    ``(windows, info)``: an int32 array ``(count, seq_len + 1)`` in the
    order of their offsets, and what they are (files and bytes kept, the
    windows' SHA-256).

  Raises:
    ValueError: if the kept bytes hold fewer than ``count`` windows, or a
      removed file is not a validation file.
  """
  unknown = sorted(set(removed) - set(val))
  if unknown:
    raise ValueError(f"removed names files that are not validation files: {unknown[:3]}")
  kept = [data for name, data in val.items() if name not in set(removed)]
  joined = np.frombuffer(b"\n".join(kept), np.uint8).astype(np.int32)
  available = len(joined) // (seq_len + 1)
  if available < count:
    raise ValueError(f"The kept validation bytes hold {available} windows of "
                     f"{seq_len + 1} bytes; {count} were asked for.")
  starts = np.sort(np.random.default_rng(seed).permutation(available)[:count]) * (seq_len + 1)
  out = joined[starts[:, None] + np.arange(seq_len + 1)[None, :]]
  info = {"files_kept": len(kept), "files_removed": len(removed),
          "bytes_kept": int(len(joined)), "windows": count, "seq_len": seq_len,
          "seed": seed, "sha256": hashlib.sha256(out.tobytes()).hexdigest()}
  return out, info


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """Writes :data:`REMOVED_LIST` for the pinned stdlib corpus."""
  parser = argparse.ArgumentParser(description="Near-copies of training files among "
                                   "the stdlib corpus's validation files.")
  parser.add_argument("--out", default=REMOVED_LIST)
  args = parser.parse_args(argv)
  corpus = stdlib_corpus.load()
  train, val = stdlib_corpus.split_files()
  result = {"corpus": corpus.info["name"], "corpus_sha256": corpus.info["sha256"],
            "ngram": NGRAM, "threshold": THRESHOLD, "validation_files": len(val),
            "removed": near_copies(train, val)}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(f"{len(result['removed'])} of {len(val)} validation files removed: {args.out}")
  return result


if __name__ == "__main__":
  main()
