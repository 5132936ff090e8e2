"""Text corpora and a token stream served as seeded windows.

* Corpora (``CORPORA``): ``builtin``, the English documentation text inside
  every CPython installation (``pydoc_data.topics``: the help pages behind
  ``help("if")``), so the demo needs no download; ``shakespeare``, Tiny
  Shakespeare, shipped in ``corpora/``. ``--data FILE`` reads any UTF-8 text
  file, ``--data-dir DIR`` every UTF-8 file under a folder (sorted by path;
  files that are not UTF-8 are skipped and counted).
* Split: the last ``val_fraction`` of the token stream is validation; the
  rest is training. Deterministic. ``TokenDataset.from_splits`` takes a split
  made elsewhere.
* Batches: training windows start at offsets drawn from a NumPy generator.
  ``train_batch(batch_size, seed, step)`` draws from
  ``numpy.random.default_rng((seed, step))``, so the batch of a step is a pure
  function of ``(seed, step)``: a resumed run sees exactly the batches an
  uninterrupted one would. Validation uses fixed, evenly spaced windows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Iterator

import numpy as np

__all__ = [
    "CORPORA",
    "TokenDataset",
    "default_corpus",
    "load_corpus",
    "read_corpus",
    "shakespeare",
]

_CORPORA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpora")


def default_corpus() -> str:
  """CPython's own documentation text (``pydoc_data.topics``), in key order.

  About 0.47 MB of English on CPython 3.11; no network, no files outside
  the standard library.

  Examples:
    >>> text = default_corpus()
    >>> len(text) > 100_000 and "assignment" in text
    True
  """
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  return "\n\n".join(topics.topics[key] for key in sorted(topics.topics))


def shakespeare() -> str:
  """Tiny Shakespeare (1.1 MB, public domain), shipped in ``corpora/``.

  Examples:
    >>> shakespeare()[:14]
    'First Citizen:'
  """
  return _read_text_file(os.path.join(_CORPORA_DIR, "tinyshakespeare.txt"))


CORPORA: dict[str, Callable[[], str]] = {
    "builtin": default_corpus,
    "shakespeare": shakespeare,
}


def load_corpus(name: str) -> str:
  """The text of corpus ``name`` (a key of ``CORPORA``).

  Examples:
    >>> len(load_corpus("shakespeare"))
    1115394
  """
  if name not in CORPORA:
    raise ValueError(f"Unknown corpus {name!r}; choose one of {sorted(CORPORA)}.")
  return CORPORA[name]()


def _read_text_file(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def read_corpus(data: str | None = None, data_dir: str | None = None) -> str:
  """The training text: a file, a folder of files, or the default corpus.

  Args:
    data: path of a UTF-8 text file.
    data_dir: a folder; every UTF-8 file under it (recursively, sorted by
      path, hidden files skipped) is read and joined with blank lines.

  Returns:
    The text.

  Raises:
    ValueError: both arguments given, a missing path, or no text found.
  """
  if data is not None and data_dir is not None:
    raise ValueError("Pass either --data FILE or --data-dir DIR, not both.")
  if data is not None:
    if not os.path.isfile(data):
      raise ValueError(f"--data: no such file {data!r}.")
    try:
      text = _read_text_file(data)
    except UnicodeDecodeError as e:
      raise ValueError(f"--data: {data!r} is not UTF-8 text ({e}).") from None
  elif data_dir is not None:
    if not os.path.isdir(data_dir):
      raise ValueError(f"--data-dir: no such folder {data_dir!r}.")
    texts, skipped = [], 0
    for root, dirs, files in os.walk(data_dir):
      dirs[:] = sorted(d for d in dirs if not d.startswith("."))
      for name in sorted(files):
        if name.startswith("."):
          continue
        try:
          texts.append(_read_text_file(os.path.join(root, name)))
        except UnicodeDecodeError:
          skipped += 1
    if skipped:
      print(f"--data-dir: skipped {skipped} file(s) that are not UTF-8 text.")
    text = "\n\n".join(texts)
  else:
    text = default_corpus()
  if not text.strip():
    raise ValueError(
        f"The corpus is empty ({data or data_dir or 'default corpus'})."
    )
  return text


class TokenDataset:
  """A token stream split into train/validation, served as windows.

  Args:
    tokens: 1-D integer token ids.
    seq_len: tokens per training example (targets are the next tokens).
    val_fraction: fraction of the stream (its tail) kept for validation.

  Examples:
    >>> ds = TokenDataset(np.arange(1000) % 256, seq_len=8)
    >>> b = ds.train_batch(batch_size=4, seed=0, step=3)
    >>> b["inputs"].shape, bool((b["targets"][:, :-1] == b["inputs"][:, 1:]).all())
    ((4, 8), True)
    >>> bool((ds.train_batch(4, 0, 3)["inputs"] == b["inputs"]).all())
    True
  """

  def __init__(self, tokens, seq_len: int, val_fraction: float = 0.05):
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
      raise TypeError("tokens must be a 1-D array of integer token ids.")
    if not 0.0 < val_fraction < 1.0:
      raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}.")
    n_val = int(len(tokens) * val_fraction)
    self._set(tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :], seq_len)

  @classmethod
  def from_splits(cls, train, val, seq_len: int) -> TokenDataset:
    """A dataset over a train/validation split made by the caller.

    Examples:
      >>> ds = TokenDataset.from_splits(np.arange(100), np.arange(20), seq_len=4)
      >>> len(ds.train), len(ds.val)
      (100, 20)
    """
    dataset = cls.__new__(cls)
    dataset._set(np.asarray(train), np.asarray(val), seq_len)
    return dataset

  def _set(self, train: np.ndarray, val: np.ndarray, seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
      raise ValueError(f"seq_len must be a positive int, got {seq_len!r}.")
    self.seq_len = seq_len
    self.train = train.astype(np.int32)
    self.val = val.astype(np.int32)
    for name, split in (("training", self.train), ("validation", self.val)):
      if len(split) < seq_len + 2:
        raise ValueError(
            f"The {name} split has {len(split)} tokens, too few for seq_len="
            f"{seq_len}; use more text (--data/--data-dir) or a shorter "
            "--seq-len."
        )

  def _windows(self, split: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
    idx = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
    window = split[idx]
    return {"inputs": window[:, :-1], "targets": window[:, 1:]}

  def sample_batch(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``batch_size`` training windows at offsets drawn from ``rng``."""
    starts = rng.integers(0, len(self.train) - self.seq_len, size=batch_size)
    return self._windows(self.train, starts)

  def train_batch(self, batch_size: int, seed: int, step: int) -> dict[str, np.ndarray]:
    """The training batch of ``step``: a pure function of ``(seed, step)``."""
    return self.sample_batch(batch_size, np.random.default_rng((seed, step)))

  def val_batches(self, batch_size: int, num_batches: int) -> Iterator[dict[str, np.ndarray]]:
    """``num_batches`` fixed batches of evenly spaced validation windows."""
    starts = np.linspace(
        0, len(self.val) - self.seq_len - 1, batch_size * num_batches
    ).astype(np.int64)
    for i in range(num_batches):
      yield self._windows(self.val, starts[i * batch_size : (i + 1) * batch_size])
