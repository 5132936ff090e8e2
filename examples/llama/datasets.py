"""Prepared token datasets: ``metadata.json`` and memory-mapped ``.npy`` shards.

``prepare_data.py`` writes a folder::

  DIR/metadata.json        what the dataset is (this module reads and checks it)
  DIR/train-00000.npy ...  training tokens, one shard per work unit
  DIR/val-00000.npy ...    validation tokens (the tail of each unit's stream)
  DIR/tokenizer.model      the SentencePiece model, when there is one

Shards are NumPy ``.npy`` files of the smallest unsigned dtype that holds
the vocabulary (memory-mappable: ``np.load(path, mmap_mode="r")``);
training reads only the windows it uses, with positional reads
(``ShardReader``), so memory does not grow with the corpus. ``metadata.json``
is versioned and names the tokenizer (kind, vocabulary size, SHA-256 of the
model file), the token and document counts, every shard's size and CRC-32,
the validation split and the command that made it.

``TokenWindows`` serves a split as windows of ``seq_len + 1`` tokens (never
across shards): a random-access source for Grain (``loader.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from typing import Any

import numpy as np

from examples.llama import tokenizers

__all__ = [
    "FORMAT",
    "VERSION",
    "PreparedDataset",
    "ShardReader",
    "TokenWindows",
    "crc32_file",
    "read_metadata",
    "token_dtype",
    "tokenizer_identity",
    "write_json_atomic",
]

FORMAT = "foam_jax.llama.tokens"
VERSION = 1
TOKENIZER_FILE = "tokenizer.model"


def token_dtype(vocab_size: int) -> np.dtype:
  """The smallest unsigned integer dtype that holds ids ``0 .. vocab_size-1``.

  Examples:
    >>> token_dtype(256), token_dtype(32000), token_dtype(100_000)
    (dtype('uint8'), dtype('uint16'), dtype('uint32'))
  """
  for dtype in (np.uint8, np.uint16, np.uint32):
    if vocab_size <= np.iinfo(dtype).max + 1:
      return np.dtype(dtype)
  raise ValueError(f"vocab_size {vocab_size} does not fit in uint32.")


def sha256_file(path: str) -> str:
  """Hex SHA-256 of a file's bytes."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def crc32_file(path: str) -> int:
  """CRC-32 of a file, read in 1 MiB blocks (nothing is memory-mapped).

  Examples:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x")
    >>> _ = open(path, "wb").write(b"abc")
    >>> crc32_file(path) == zlib.crc32(b"abc")
    True
  """
  crc = 0
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      crc = zlib.crc32(block, crc)
  return crc


def tokenizer_identity(path: str | None) -> dict[str, Any]:
  """What identifies a tokenizer: kind, vocabulary size, model file hash.

  Examples:
    >>> tokenizer_identity(None)
    {'kind': 'bytes', 'vocab_size': 256}
  """
  if path is None:
    return {"kind": "bytes", "vocab_size": tokenizers.ByteTokenizer.vocab_size}
  tok = tokenizers.SentencePieceTokenizer(path)
  return {"kind": "sentencepiece", "vocab_size": tok.vocab_size, "sha256": sha256_file(path)}


def write_json_atomic(path: str, obj: Any) -> None:
  """Writes JSON to ``path`` through a temporary file and a rename."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_metadata(directory: str) -> dict[str, Any]:
  """``DIR/metadata.json``, checked for format and version.

  Raises:
    ValueError: no such file, not JSON, or another format or version; the
      message names the file.
  """
  path = os.path.join(directory, "metadata.json")
  if not os.path.isfile(path):
    raise ValueError(f"--dataset: {path} does not exist; make the dataset with "
                     "examples/llama/prepare_data.py.")
  try:
    with open(path) as f:
      meta = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"--dataset: {path} is corrupt ({e}); the shards beside it are kept. "
                     "Re-run prepare_data.py with a new --out, or restore the file.") from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise ValueError(f"--dataset: {path} is not a {FORMAT} metadata file.")
  if meta.get("version") != VERSION:
    raise ValueError(f"--dataset: {path} has version {meta.get('version')!r}; this code "
                     f"reads version {VERSION}.")
  for key in ("tokenizer", "units", "val_fraction", "dtype"):
    if key not in meta:
      raise ValueError(f"--dataset: {path} is corrupt (no {key!r}).")
  return meta


class ShardReader:
  """A token shard read with positional reads (``os.pread``), sliced like an array.

  The ``.npy`` file is memory-mappable (``np.load(path, mmap_mode="r")``),
  and its header is read that way; windows are then read with ``pread``, not
  through the mapping: on kernels that map large page-cache folios per fault,
  every random window read through a mapping adds up to a folio to the
  process's RSS (measured: +300 MiB after 40 steps on a 600 MB corpus),
  whereas read pages stay in the shared page cache. Memory stays flat
  whatever the corpus size.

  Examples:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "s.npy")
    >>> np.save(path, np.arange(10, dtype=np.uint16))
    >>> shard = ShardReader(path)
    >>> len(shard), shard[3:6].tolist()
    (10, [3, 4, 5])
  """

  def __init__(self, path: str):
    header = np.load(path, mmap_mode="r")  # Reads the header; maps, touches nothing.
    self.path, self.dtype, self.length = path, header.dtype, len(header)
    self._offset = header.offset
    del header
    self._fd = os.open(path, os.O_RDONLY)

  def __len__(self) -> int:
    return self.length

  def __getitem__(self, index: slice) -> np.ndarray:
    start, stop, _ = index.indices(self.length)
    size = self.dtype.itemsize
    raw = os.pread(self._fd, (stop - start) * size, self._offset + start * size)
    return np.frombuffer(raw, self.dtype)

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    """The whole shard (reads it all: for tests and small shards)."""
    del copy
    whole = self[:]
    return whole if dtype is None else whole.astype(dtype)

  def __del__(self):
    if getattr(self, "_fd", None) is not None:
      os.close(self._fd)
      self._fd = None


class TokenWindows:
  """Windows of ``seq_len + 1`` tokens over memory-mapped shards.

  Window ``i`` lies inside one shard (windows never cross shards); windows
  of a shard start every ``seq_len`` tokens, so the targets of one are the
  inputs of the next shifted by one. ``len`` and ``[i]``: a Grain
  random-access source.

  Examples:
    >>> w = TokenWindows([np.arange(10), np.arange(100, 107)], seq_len=3)
    >>> len(w), w[0].tolist(), w[3].tolist()
    (5, [0, 1, 2, 3], [100, 101, 102, 103])
  """

  def __init__(self, shards: list[np.ndarray], seq_len: int):
    self.shards, self.seq_len = shards, seq_len
    counts = np.array([max(0, (len(s) - 1) // seq_len) for s in shards], np.int64)
    self._ends = np.cumsum(counts)

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def __getitem__(self, index: int) -> np.ndarray:
    index = int(index)
    shard = int(np.searchsorted(self._ends, index, side="right"))
    start = (index - (int(self._ends[shard - 1]) if shard else 0)) * self.seq_len
    return np.asarray(self.shards[shard][start:start + self.seq_len + 1], np.int32)


class PreparedDataset:
  """A folder written by ``prepare_data.py``, opened for training.

  Args:
    directory: the folder (``--dataset``).

  Raises:
    ValueError: missing or corrupt metadata, an unfinished preparation, or a
      shard whose size differs from the metadata's (half-written or
      truncated); each message names the file.
  """

  def __init__(self, directory: str):
    self.directory = directory
    self.meta = read_metadata(directory)
    if not self.meta.get("complete"):
      raise ValueError(f"--dataset: {directory} is not finished preparing; re-run the "
                       f"command in its metadata.json to continue: {self.meta.get('command')}")
    self.dtype = np.dtype(self.meta["dtype"])
    self.splits: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    for unit in self.meta["units"]:
      for split in ("train", "val"):
        record = unit[split]
        path = os.path.join(directory, record["file"])
        size = os.path.getsize(path) if os.path.isfile(path) else None
        if size != record["bytes"]:
          raise ValueError(
              f"--dataset: shard {path} has {size} bytes, the metadata says "
              f"{record['bytes']} (half-written or damaged); re-run prepare_data.py.")
        if record["tokens"]:
          self.splits[split].append(ShardReader(path))

  @property
  def tokenizer_path(self) -> str | None:
    """The SentencePiece model inside the folder, or ``None`` for bytes."""
    if self.meta["tokenizer"]["kind"] == "bytes":
      return None
    return os.path.join(self.directory, TOKENIZER_FILE)

  def num_tokens(self, split: str) -> int:
    return int(sum(len(s) for s in self.splits[split]))

  def identity(self) -> dict[str, Any]:
    """What a checkpoint must share with a run to continue its stream."""
    return {"tokenizer": self.meta["tokenizer"], "val_fraction": self.meta["val_fraction"],
            "tokens": self.meta["tokens"],
            "crc32": [[u["train"]["crc32"], u["val"]["crc32"]] for u in self.meta["units"]]}
