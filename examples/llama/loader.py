"""Each process's slice of the global batch, through a Grain pipeline.

The global batch of step ``s`` is a pure function of ``(seed, s)``; a
process loads only the rows its devices hold (``process_rows``) and JAX
assembles the global array (``jax.make_array_from_process_local_data``).

Two sources, one interface (``rows(step, lo, hi)`` and ``val_rows``):

* ``WindowBatches``: a prepared dataset (``--dataset``): non-overlapping
  windows of memory-mapped shards, globally shuffled by Grain
  (``MapDataset.shuffle(seed)``, reshuffled every epoch by ``repeat``);
  step ``s`` takes rows ``s*B .. s*B+B-1`` of that order.
* ``TextBatches``: small text in memory (``--data``, ``--data-dir``, the
  built-in corpus): ``data.TokenDataset``'s seeded windows, as before.

``train_iterator`` turns a source into a Grain iterator over steps, read
ahead by threads; its state (``get_state()``: the next step) goes into the
checkpoint so ``--resume`` continues the exact stream.
"""

from __future__ import annotations

import zlib
from typing import Any

import grain
import jax
import numpy as np

from examples.llama import data as data_lib
from examples.llama import datasets
from examples.llama import tokenizers

__all__ = ["Data", "TextBatches", "WindowBatches", "global_batch", "open_data", "process_rows",
           "train_iterator"]

Batch = dict[str, np.ndarray]


def _split(windows: np.ndarray) -> Batch:
  return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


class WindowBatches:
  """Batches of windows from a ``datasets.PreparedDataset``.

  Args:
    dataset: the prepared dataset.
    seq_len: tokens per example.
    batch_size: the global batch.
    seed: seeds the shuffle.

  Examples:
    >>> import tempfile, os
    >>> from examples.llama import prepare_data
    >>> d = tempfile.mkdtemp(); path = os.path.join(d, "a.txt")
    >>> _ = open(path, "w").write("abcdefgh" * 200)
    >>> _ = prepare_data.prepare([path], d + "/ds", progress=False)
    >>> src = WindowBatches(datasets.PreparedDataset(d + "/ds"), 8, 4, seed=0)
    >>> src.rows(3, 0, 4)["inputs"].shape
    (4, 8)
    >>> bool((src.rows(3, 2, 4)["inputs"] == src.rows(3, 0, 4)["inputs"][2:]).all())
    True
  """

  def __init__(self, dataset: datasets.PreparedDataset, seq_len: int, batch_size: int,
               seed: int):
    self.batch_size = batch_size
    train = datasets.TokenWindows(dataset.splits["train"], seq_len)
    self.val = datasets.TokenWindows(dataset.splits["val"], seq_len)
    for name, split in (("training", train), ("validation", self.val)):
      if len(split) == 0:
        raise ValueError(f"--dataset {dataset.directory}: the {name} split has no window "
                         f"of {seq_len + 1} tokens; prepare more text or use a shorter "
                         "--seq-len.")
    self.train = grain.MapDataset.source(train).shuffle(seed=seed).repeat()

  def rows(self, step: int, lo: int, hi: int) -> Batch:
    """Rows ``lo .. hi-1`` of the global batch of ``step``."""
    first = step * self.batch_size
    return _split(np.stack([self.train[first + i] for i in range(lo, hi)]))

  def val_rows(self, index: int, num_batches: int, lo: int, hi: int) -> Batch:
    """Rows of validation batch ``index`` of ``num_batches`` fixed, evenly spaced ones."""
    starts = np.linspace(0, len(self.val) - 1, self.batch_size * num_batches).astype(np.int64)
    first = index * self.batch_size
    return _split(np.stack([self.val[int(starts[first + i])] for i in range(lo, hi)]))


class TextBatches:
  """Batches of a ``data.TokenDataset`` (small text held in memory).

  Examples:
    >>> ds = data_lib.TokenDataset(np.arange(1000) % 256, seq_len=8)
    >>> src = TextBatches(ds, batch_size=4, seed=0)
    >>> bool((src.rows(5, 0, 4)["inputs"] == ds.train_batch(4, 0, 5)["inputs"]).all())
    True
  """

  def __init__(self, dataset: data_lib.TokenDataset, batch_size: int, seed: int):
    self.dataset, self.batch_size, self.seed = dataset, batch_size, seed

  def rows(self, step: int, lo: int, hi: int) -> Batch:
    batch = self.dataset.train_batch(self.batch_size, self.seed, step)
    return {k: v[lo:hi] for k, v in batch.items()}

  def val_rows(self, index: int, num_batches: int, lo: int, hi: int) -> Batch:
    batches = self.dataset.val_batches(self.batch_size, num_batches)
    batch = next(b for i, b in enumerate(batches) if i == index)
    return {k: v[lo:hi] for k, v in batch.items()}


def process_rows(sharding: jax.sharding.Sharding, batch_size: int) -> tuple[int, int]:
  """The rows ``[lo, hi)`` of a global batch that this process's devices hold.

  Examples:
    >>> mesh = jax.make_mesh((1,), ("fsdp",))
    >>> process_rows(jax.sharding.NamedSharding(mesh, jax.P("fsdp")), 16)
    (0, 16)
  """
  index = sharding.addressable_devices_indices_map((batch_size,))
  spans = sorted({(s[0].start or 0, batch_size if s[0].stop is None else s[0].stop)
                  for s in index.values()})
  lo, hi = spans[0][0], spans[-1][1]
  if sum(b - a for a, b in spans) != hi - lo and len(spans) > 1:
    raise ValueError(f"This process's devices hold rows {spans} of the batch, not one "
                     "contiguous slice; order the mesh's devices by process.")
  return lo, hi


def global_batch(sharding: jax.sharding.Sharding, local: Batch,
                 batch_size: int) -> dict[str, jax.Array]:
  """The global batch arrays from this process's rows."""
  return {k: jax.make_array_from_process_local_data(sharding, v, (batch_size, *v.shape[1:]))
          for k, v in local.items()}


def train_iterator(source: Any, lo: int, hi: int, start_step: int = 0,
                   state: dict[str, Any] | None = None,
                   threads: int = 2) -> grain.DatasetIterator:
  """A Grain iterator over steps from ``start_step``: each item, this process's rows.

  Args:
    source: ``WindowBatches`` or ``TextBatches``.
    lo, hi: this process's rows (``process_rows``).
    start_step: where a fresh iterator starts.
    state: a saved ``get_state()`` (from a checkpoint), which wins over
      ``start_step``.
    threads: Grain's read-ahead threads.

  Examples:
    >>> ds = data_lib.TokenDataset(np.arange(1000) % 256, seq_len=8)
    >>> it = train_iterator(TextBatches(ds, 4, seed=0), 0, 4, start_step=2)
    >>> first = next(it); it.get_state()
    {'next_index': 3}
    >>> bool((first["inputs"] == ds.train_batch(4, 0, 2)["inputs"]).all())
    True
  """
  steps = grain.MapDataset.range(1 << 62).map(lambda step: source.rows(step, lo, hi))
  options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
  iterator = iter(steps.to_iter_dataset(options))
  iterator.set_state(state if state is not None else {"next_index": start_step})
  return iterator


class Data:
  """The run's text: its tokenizer, size, identity and batch source.

  Attributes:
    tokenizer: bytes or SentencePiece.
    num_tokens: tokens in the corpus (both splits).
    identity: what a checkpoint must share with a run to continue its stream.
    prepared: the ``datasets.PreparedDataset`` (``--dataset``), else ``None``.
  """

  def __init__(self, tokenizer, num_tokens: int, identity: dict[str, Any],
               prepared: datasets.PreparedDataset | None = None, tokens=None,
               val_fraction: float | None = None):
    self.tokenizer, self.num_tokens, self.identity = tokenizer, num_tokens, identity
    self.prepared, self._tokens, self._val_fraction = prepared, tokens, val_fraction

  def batches(self, seq_len: int, batch_size: int, seed: int):
    """``WindowBatches`` over the shards, or ``TextBatches`` over the text."""
    if self.prepared is not None:
      return WindowBatches(self.prepared, seq_len, batch_size, seed)
    dataset = data_lib.TokenDataset(self._tokens, seq_len, self._val_fraction)
    return TextBatches(dataset, batch_size, seed)


def open_data(data: str | None = None, data_dir: str | None = None,
              dataset: str | None = None, tokenizer: str | None = None,
              val_fraction: float | None = None) -> Data:
  """The text of ``--data``/``--data-dir``/the built-in corpus, or ``--dataset``.

  With ``dataset``, its ``metadata.json`` defines the tokenizer and the
  split: a ``tokenizer`` file or a ``val_fraction`` that differs is an error.

  Raises:
    ValueError: conflicting flags, or bad data; the message names the flag.

  Examples:
    >>> d = open_data(data_dir=None)
    >>> d.tokenizer.vocab_size, d.num_tokens > 100_000, d.identity["val_fraction"]
    (256, True, 0.05)
  """
  if dataset is None:
    val_fraction = 0.05 if val_fraction is None else val_fraction
    tok = tokenizers.load_tokenizer(tokenizer)
    tokens = tok.encode(data_lib.read_corpus(data, data_dir))
    identity = {"val_fraction": val_fraction, "corpus_tokens": int(len(tokens)),
                "corpus_crc32": zlib.crc32(np.asarray(tokens).tobytes())}
    return Data(tok, int(len(tokens)), identity, tokens=tokens, val_fraction=val_fraction)
  if data is not None or data_dir is not None:
    raise ValueError("--dataset replaces --data and --data-dir; pass one of them.")
  prepared = datasets.PreparedDataset(dataset)
  meta = prepared.meta
  if tokenizer is not None and datasets.tokenizer_identity(tokenizer) != meta["tokenizer"]:
    raise ValueError(
        f"--tokenizer {tokenizer} is not the tokenizer {dataset} was prepared with "
        f"({meta['tokenizer']}); --dataset brings its own, drop --tokenizer.")
  if val_fraction is not None and val_fraction != meta["val_fraction"]:
    raise ValueError(
        f"--val-fraction {val_fraction} conflicts with the split of --dataset {dataset} "
        f"({meta['val_fraction']}); the dataset defines it, drop --val-fraction.")
  tok = tokenizers.load_tokenizer(prepared.tokenizer_path)
  if tok.vocab_size != meta["tokenizer"]["vocab_size"]:
    raise ValueError(f"--dataset {dataset}: its tokenizer has {tok.vocab_size} tokens, "
                     f"the metadata says {meta['tokenizer']['vocab_size']}.")
  num_tokens = prepared.num_tokens("train") + prepared.num_tokens("val")
  return Data(tok, num_tokens, {"dataset": prepared.identity()}, prepared=prepared)
