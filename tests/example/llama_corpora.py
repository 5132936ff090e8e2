"""Toy corpora for the data tests: JSON-lines shards and a tiny SentencePiece model.

Made in the test's folder from the text that ships with Python; nothing is
downloaded.
"""

from __future__ import annotations

import gzip
import json
import pathlib

from examples.llama import data


def documents(n: int = 400, size: int = 600) -> list[str]:
  """``n`` documents of about ``size`` characters of CPython's documentation text."""
  text = data.default_corpus()
  return [text[i * size:(i + 1) * size] for i in range(n)]


def write_jsonl_gz(path: pathlib.Path, docs: list[str]) -> pathlib.Path:
  """A C4-style shard: one JSON object per line with a ``"text"`` field."""
  with gzip.open(path, "wt", encoding="utf-8") as f:
    for i, doc in enumerate(docs):
      f.write(json.dumps({"text": doc, "url": f"https://example.org/{i}"}) + "\n")
  return path


def train_sentencepiece(folder: pathlib.Path, vocab_size: int = 300) -> str:
  """A unigram SentencePiece model trained on ~200 kB (about a second)."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  corpus = folder / "sp_corpus.txt"
  corpus.write_text(data.default_corpus()[:200_000], encoding="utf-8")
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(folder / "sp"), vocab_size=vocab_size,
      model_type="unigram", minloglevel=2)
  return str(folder / "sp.model")
