"""Tokenizers: UTF-8 bytes (vocabulary 256) or a SentencePiece model file."""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

__all__ = ["ByteTokenizer", "SentencePieceTokenizer", "Tokenizer", "load_tokenizer"]


class Tokenizer(Protocol):
  vocab_size: int

  def encode(self, text: str) -> np.ndarray: ...

  def decode(self, ids) -> str: ...


class ByteTokenizer:
  """UTF-8 bytes as tokens: vocabulary 256, lossless, nothing to download.

  Examples:
    >>> tok = ByteTokenizer()
    >>> ids = tok.encode("héllo")
    >>> ids.tolist(), tok.decode(ids)
    ([104, 195, 169, 108, 108, 111], 'héllo')
  """

  vocab_size = 256

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    return bytes(int(i) for i in np.asarray(ids).ravel()).decode(
        "utf-8", errors="replace"
    )


class SentencePieceTokenizer:
  """A SentencePiece model file (``.model``), e.g. LLaMA's or T5's.

  Needs the optional ``sentencepiece`` package.

  Raises:
    ImportError: ``sentencepiece`` is not installed (the message says how to
      install it).
    FileNotFoundError: ``path`` does not exist.
  """

  def __init__(self, path: str):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"--tokenizer: no SentencePiece model at {path!r}.")
    try:
      import sentencepiece  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise ImportError(
          "--tokenizer needs the optional 'sentencepiece' package: "
          "`pip install sentencepiece` (or drop --tokenizer to use the "
          "built-in byte tokenizer)."
      ) from None
    self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
    self.vocab_size = int(self._sp.get_piece_size())

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), dtype=np.int32)

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in np.asarray(ids).ravel()])


def load_tokenizer(path: str | None = None) -> Tokenizer:
  """The byte tokenizer, or the SentencePiece model at ``path``."""
  return ByteTokenizer() if path is None else SentencePieceTokenizer(path)
