"""The LLaMA example's corpora, tokenizers and batches (examples.llama.data)."""

import builtins
import socket
import sys

import numpy as np
import pytest

from examples.llama import data
from examples.llama import tokenizers


def test_default_corpus_needs_no_network_and_no_shared(monkeypatch):
  def no_network(*args, **kwargs):
    raise AssertionError("the default corpus must not use the network")

  real_open = builtins.open

  def guarded_open(file, *args, **kwargs):
    assert "shared" not in str(file), f"opened {file}"
    return real_open(file, *args, **kwargs)

  monkeypatch.setattr(socket.socket, "connect", no_network)
  monkeypatch.setattr(builtins, "open", guarded_open)
  text = data.read_corpus()
  assert len(text) > 100_000
  for word in ("assignment", "function", "statement"):
    assert word in text
  tokens = tokenizers.ByteTokenizer().encode(text)
  ds = data.TokenDataset(tokens, seq_len=32)
  assert len(ds.train) + len(ds.val) == len(tokens)
  np.testing.assert_array_equal(ds.val, tokens[len(ds.train):])


def test_batches_are_seeded_windows_of_the_training_split():
  tokens = np.arange(5000) % 251
  ds = data.TokenDataset(tokens, seq_len=16, val_fraction=0.1)
  b = ds.train_batch(4, seed=3, step=7)
  np.testing.assert_array_equal(b["inputs"], ds.train_batch(4, 3, 7)["inputs"])
  assert not np.array_equal(b["inputs"], ds.train_batch(4, 3, 8)["inputs"])
  for row_in, row_t in zip(b["inputs"], b["targets"]):
    start = int(np.flatnonzero(ds.train == row_in[0])[0])
    np.testing.assert_array_equal(row_in, ds.train[start:start + 16])
    np.testing.assert_array_equal(row_t, ds.train[start + 1:start + 17])


def test_sentencepiece_missing_gives_install_hint(tmp_path, monkeypatch):
  path = tmp_path / "tok.model"
  path.write_bytes(b"not a real model")
  monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails
  with pytest.raises(ImportError, match="pip install sentencepiece"):
    tokenizers.load_tokenizer(str(path))
  with pytest.raises(FileNotFoundError, match="--tokenizer"):
    tokenizers.load_tokenizer(str(tmp_path / "missing.model"))




def test_shakespeare_ships_with_the_repository():
  text = data.load_corpus("shakespeare")
  assert len(text.encode("utf-8")) == 1_115_394 and text.startswith("First Citizen:")
  with pytest.raises(ValueError, match="Unknown corpus"):
    data.load_corpus("wikipedia")


def test_from_splits_serves_the_given_splits():
  ds = data.TokenDataset.from_splits(np.arange(100), np.arange(100, 140), seq_len=8)
  b = ds.sample_batch(3, np.random.default_rng(0))
  assert b["inputs"].shape == (3, 8) and int(b["targets"].max()) < 100
  (v,) = list(ds.val_batches(2, 1))
  assert int(v["inputs"].min()) >= 100
