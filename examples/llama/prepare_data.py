r"""Tokenise a corpus once into memory-mappable shards for ``train.py --dataset``.

::

  python -m examples.llama.prepare_data c4/en/c4-train.*.json.gz \
      --out data/c4-t5 --tokenizer spiece.model --workers 16
  python -m examples.llama.prepare_data book.txt notes/ --out data/mine   # bytes

Inputs are UTF-8 text files, folders (every file under them, sorted, hidden
files skipped) and JSON-lines files (``.jsonl``, ``.json.gz``,
``.jsonl.gz``: one document per line with a ``"text"`` field, as C4 and
FineWeb ship). The work is cut into units (a compressed file, or up to
``--unit-mb`` of an uncompressed one, cut at line ends), tokenised in
``--workers`` processes; each unit becomes ``train-NNNNN.npy`` and
``val-NNNNN.npy`` (the last ``--val-fraction`` of its tokens), written to a
temporary name and renamed. ``metadata.json`` (see ``datasets.py``) records
every finished unit as it lands, so an interrupted run, started again with
the same command, continues where it stopped; a shard that does not match
its record (half-written, damaged) is made again. A folder prepared with
another tokenizer, split or inputs is refused, never mixed.

Documents are separated by the tokenizer's end-of-sequence id (bytes: a
blank line). Text files are one document each, encoded line by line with
SentencePiece (whole with bytes).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import multiprocessing
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import numpy as np
import tqdm

from examples.llama import datasets
from examples.llama import tokenizers

__all__ = ["Unit", "find_inputs", "main", "plan_units", "prepare", "tokenize_unit"]

_JSONL_SUFFIXES = (".jsonl", ".json.gz", ".jsonl.gz")


@dataclasses.dataclass(frozen=True)
class Unit:
  """One piece of work: bytes ``[start, end)`` of ``path`` (a whole ``.gz`` file)."""

  index: int
  path: str
  start: int
  end: int

  @property
  def is_jsonl(self) -> bool:
    return self.path.endswith(_JSONL_SUFFIXES)

  @property
  def is_gzip(self) -> bool:
    return self.path.endswith(".gz")


def find_inputs(paths: Sequence[str]) -> list[str]:
  """The files named by ``paths`` (folders walked, sorted, hidden entries skipped).

  Raises:
    ValueError: a path that does not exist.

  Examples:
    >>> import tempfile
    >>> d = tempfile.mkdtemp(); _ = open(os.path.join(d, "a.txt"), "w").write("hi")
    >>> [os.path.basename(p) for p in find_inputs([d])]
    ['a.txt']
  """
  files = []
  for path in paths:
    if os.path.isfile(path):
      files.append(os.path.abspath(path))
    elif os.path.isdir(path):
      for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [os.path.abspath(os.path.join(root, n)) for n in sorted(names)
                  if not n.startswith(".")]
    else:
      raise ValueError(f"INPUT: no such file or folder {path!r}.")
  return files


def plan_units(files: Sequence[str], unit_bytes: int) -> list[Unit]:
  """Cuts ``files`` into units of at most ``unit_bytes`` (``.gz``: whole files).

  Examples:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> _ = open(path, "w").write("x" * 250)
    >>> [(u.start, u.end) for u in plan_units([path], 100)]
    [(0, 100), (100, 200), (200, 250)]
  """
  units = []
  for path in files:
    size = os.path.getsize(path)
    if size == 0:
      continue
    if path.endswith(".gz"):
      units.append(Unit(len(units), path, 0, size))
      continue
    for start in range(0, size, unit_bytes):
      units.append(Unit(len(units), path, start, min(size, start + unit_bytes)))
  return units


def _lines(unit: Unit) -> Iterator[tuple[bytes, str]]:
  """The lines of ``unit`` (those that start inside it) and where each is."""
  if unit.is_gzip:
    with gzip.open(unit.path, "rb") as f:
      for number, line in enumerate(f, 1):
        yield line, f"line {number}"
    return
  with open(unit.path, "rb") as f:
    if unit.start:
      f.seek(unit.start - 1)
      f.readline()  # Finish the line that started in the previous unit.
    position = f.tell()
    while position < unit.end:
      line = f.readline()
      if not line:
        break
      yield line, f"byte {position}"
      position += len(line)


def _whole_lines(unit: Unit) -> bytes:
  """The bytes of the lines that start in ``unit`` (what ``_lines`` yields), in one read."""
  with open(unit.path, "rb") as f:
    f.seek(unit.start - 1 if unit.start else 0)
    chunk = f.read(unit.end - unit.start + (1 if unit.start else 0))
    raw = chunk
    if unit.start:
      cut = chunk.find(b"\n")
      if cut < 0:  # No line starts here: the previous unit's last line covers it.
        return b""
      raw = chunk[cut + 1:]
    if chunk and not chunk.endswith(b"\n"):
      raw += f.readline()  # The last line, to its end.
  return raw


def _decode(line: bytes, unit: Unit, where: str) -> str:
  try:
    return line.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{unit.path} ({where}): not UTF-8 text ({e.reason} at byte "
                     f"{e.start} of the line); fix or remove the file.") from None


def _documents(unit: Unit) -> Iterator[str]:
  """The documents (JSON lines' ``"text"``) or text lines of ``unit``."""
  for line, where in _lines(unit):
    text = _decode(line, unit, where)
    if not unit.is_jsonl:
      yield text
      continue
    if not text.strip():
      continue
    try:
      record = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{unit.path} ({where}): not a JSON line ({e.msg}).") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
      raise ValueError(f"{unit.path} ({where}): the JSON line has no string \"text\" "
                       "field (expected one document per line, as C4 and FineWeb ship).")
    yield record["text"]


def _encode_unit(unit: Unit, tokenizer: tokenizers.Tokenizer) -> tuple[np.ndarray, int]:
  """``(tokens, documents)`` of one unit, documents separated."""
  sp = getattr(tokenizer, "_sp", None)
  eos = [sp.eos_id()] if sp is not None and sp.eos_id() >= 0 else list(b"\n\n")
  if not unit.is_jsonl and sp is None:  # Bytes of a text file, as they are.
    raw = _whole_lines(unit)  # No character split between units.
    try:
      raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"{unit.path} (near byte {unit.start + e.start}): not UTF-8 text "
                       f"({e.reason}); fix or remove the file.") from None
    ends_file = unit.end == os.path.getsize(unit.path)
    return np.frombuffer(raw + bytes(eos) * ends_file, np.uint8), int(ends_file)
  docs = list(_documents(unit))
  if unit.is_jsonl:
    pieces = [np.concatenate([tokenizer.encode(d), eos]) for d in docs]
    count = len(docs)
  else:
    ids = sp.encode(docs)  # One batch call: SentencePiece's own threads.
    pieces = [np.asarray(i, np.int64) for i in ids]
    count = int(unit.end == os.path.getsize(unit.path))
    if count:
      pieces.append(np.asarray(eos, np.int64))
  tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
  return tokens, count


def _write_shard(directory: str, name: str, tokens: np.ndarray) -> dict[str, Any]:
  path = os.path.join(directory, name)
  tmp = path + ".tmp.npy"
  np.save(tmp, tokens)
  with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return {"file": name, "tokens": int(len(tokens)), "bytes": os.path.getsize(path),
          "crc32": datasets.crc32_file(path)}


def tokenize_unit(unit: Unit, out: str, tokenizer_path: str | None, val_fraction: float,
                  dtype: str) -> dict[str, Any]:
  """Tokenises ``unit`` and writes its train and validation shards.

  Returns:
    The unit's record for ``metadata.json``.

  Raises:
    ValueError: text that is not UTF-8, a JSON line without ``"text"``;
      the message names the file and the place.
  """
  tokenizer = tokenizers.load_tokenizer(tokenizer_path)
  tokens, documents = _encode_unit(unit, tokenizer)
  tokens = tokens.astype(dtype, copy=False)
  n_val = int(len(tokens) * val_fraction)
  cut = len(tokens) - n_val
  return {
      "index": unit.index, "path": unit.path, "start": unit.start, "end": unit.end,
      "documents": documents,
      "train": _write_shard(out, f"train-{unit.index:05d}.npy", tokens[:cut]),
      "val": _write_shard(out, f"val-{unit.index:05d}.npy", tokens[cut:]),
  }


def _work(args: tuple) -> dict[str, Any]:
  return tokenize_unit(*args)


def _shard_ok(out: str, record: dict[str, Any]) -> bool:
  path = os.path.join(out, record["file"])
  return (os.path.isfile(path) and os.path.getsize(path) == record["bytes"]
          and datasets.crc32_file(path) == record["crc32"])


def _load_previous(out: str, plan: dict[str, Any]) -> list[dict[str, Any]]:
  """The finished units of an earlier run into ``out`` (checked), or ``[]``."""
  if not os.path.exists(os.path.join(out, "metadata.json")):
    return []
  try:
    meta = datasets.read_metadata(out)
  except ValueError as e:
    raise ValueError(str(e).replace("--dataset", "--out")) from None
  if meta["tokenizer"] != plan["tokenizer"]:
    raise ValueError(
        f"--out {out} holds tokens of another tokenizer ({meta['tokenizer']}, this run: "
        f"{plan['tokenizer']}); one dataset never mixes tokenizers. Use another --out.")
  if meta["val_fraction"] != plan["val_fraction"]:
    raise ValueError(f"--val-fraction {plan['val_fraction']} differs from the "
                     f"{meta['val_fraction']} of the dataset in {out}; use another --out.")
  if meta.get("inputs") != plan["inputs"]:
    raise ValueError(f"--out {out} holds a dataset of other inputs (or the inputs changed "
                     "since); use another --out.")
  kept = []
  for record in meta["units"]:
    if _shard_ok(out, record["train"]) and _shard_ok(out, record["val"]):
      kept.append(record)
    else:
      print(f"unit {record['index']}: a shard is half-written or damaged; making it again.")
  return kept


def prepare(inputs: Sequence[str], out: str, tokenizer: str | None = None,
            val_fraction: float = 0.05, workers: int = 1, unit_mb: float = 64.0,
            progress: bool = True, command: str | None = None) -> dict[str, Any]:
  """Tokenises ``inputs`` into ``out``; continues an interrupted run there.

  Args:
    inputs: files and folders (text or JSON lines).
    out: the dataset folder.
    tokenizer: a SentencePiece ``.model``; ``None``: bytes.
    val_fraction: the tail of each unit's tokens held out for validation.
    workers: tokenising processes (1: in this process).
    unit_mb: the largest piece of an uncompressed file one worker takes.
    progress: show a tqdm bar over the input bytes.
    command: recorded in the metadata (default: this process's command line).

  Returns:
    The metadata written to ``out/metadata.json``, plus ``seconds``.

  Raises:
    ValueError: no inputs or only empty ones, a bad argument, bad input text,
      or ``out`` holding another dataset; what is already prepared is kept.

  Examples:
    >>> import tempfile
    >>> d = tempfile.mkdtemp(); path = os.path.join(d, "a.txt")
    >>> _ = open(path, "w").write("hello world " * 100)
    >>> meta = prepare([path], os.path.join(d, "ds"), val_fraction=0.1, progress=False)
    >>> meta["tokens"], meta["dtype"], meta["complete"]
    ({'train': 1082, 'val': 120}, 'uint8', True)
  """
  if not 0.0 < val_fraction < 1.0:
    raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction!r}.")
  if workers < 1 or not unit_mb > 0:
    raise ValueError(f"--workers must be >= 1 and --unit-mb > 0, got {workers}, {unit_mb}.")
  identity = datasets.tokenizer_identity(tokenizer)
  files = find_inputs(inputs)
  units = plan_units(files, max(1, int(unit_mb * 2**20)))
  if not units:
    raise ValueError(f"INPUT: no text in {list(inputs)} (no files, or only empty ones).")
  os.makedirs(out, exist_ok=True)
  plan = {"tokenizer": identity, "val_fraction": val_fraction,
          "inputs": [[p, os.path.getsize(p)] for p in files]}
  done = {r["index"]: r for r in _load_previous(out, plan)}
  for name in os.listdir(out):  # Leftovers of an interrupted write.
    if ".tmp" in name:
      os.remove(os.path.join(out, name))
  if tokenizer is not None:
    model = os.path.join(out, datasets.TOKENIZER_FILE)
    if not os.path.isfile(model) or datasets.sha256_file(model) != identity["sha256"]:
      shutil.copyfile(tokenizer, model + ".tmp")
      os.replace(model + ".tmp", model)
  meta = {"format": datasets.FORMAT, "version": datasets.VERSION, **plan,
          "dtype": datasets.token_dtype(identity["vocab_size"]).name,
          "command": command or shlex.join([sys.executable] + sys.argv),
          "split": "the last val_fraction of each unit's tokens is validation",
          "complete": False, "units": sorted(done.values(), key=lambda r: r["index"])}
  path = os.path.join(out, "metadata.json")
  datasets.write_json_atomic(path, meta)

  todo = [u for u in units if u.index not in done]
  jobs = [(u, out, tokenizer, val_fraction, meta["dtype"]) for u in todo]
  bar = tqdm.tqdm(total=sum(u.end - u.start for u in units), unit="B", unit_scale=True,
                  initial=sum(u.end - u.start for u in units if u.index in done),
                  desc="tokenising", disable=not progress, dynamic_ncols=True)
  start = time.perf_counter()
  pool = (multiprocessing.get_context("spawn").Pool(min(workers, len(jobs)))
          if workers > 1 and len(jobs) > 1 else None)
  try:
    results = pool.imap_unordered(_work, jobs) if pool else map(_work, jobs)
    for record in results:
      done[record["index"]] = record
      meta["units"] = sorted(done.values(), key=lambda r: r["index"])
      datasets.write_json_atomic(path, meta)
      bar.update(record["end"] - record["start"])
  finally:
    bar.close()
    if pool:
      pool.terminate()
  seconds = time.perf_counter() - start
  meta["tokens"] = {s: sum(r[s]["tokens"] for r in meta["units"]) for s in ("train", "val")}
  meta["documents"] = sum(r["documents"] for r in meta["units"])
  meta["complete"] = True
  datasets.write_json_atomic(path, meta)
  return {**meta, "seconds": seconds,
          "bytes_tokenised": sum(u.end - u.start for u in todo)}


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("inputs", nargs="+", metavar="INPUT",
                      help="text files, folders, .jsonl / .json.gz / .jsonl.gz files")
  parser.add_argument("--out", required=True, help="the dataset folder")
  parser.add_argument("--tokenizer", help="a SentencePiece .model (default: bytes)")
  parser.add_argument("--val-fraction", type=float, default=0.05,
                      help="tail of each unit's tokens held out for validation")
  parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                      help="tokenising processes")
  parser.add_argument("--unit-mb", type=float, default=64.0,
                      help="largest piece of an uncompressed file one worker takes")
  parser.add_argument("--no-progress", dest="progress", action="store_false",
                      help="hide the progress bar")
  return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Command-line entry point; returns the metadata (with ``seconds``)."""
  parser = make_parser()
  args = parser.parse_args(argv)
  try:
    argv = sys.argv[1:] if argv is None else list(argv)  # The command, even from Python.
    meta = prepare(args.inputs, args.out, args.tokenizer, args.val_fraction, args.workers,
                   args.unit_mb, args.progress,
                   command=shlex.join([sys.executable, os.path.abspath(__file__), *argv]))
  except (ValueError, FileNotFoundError, ImportError) as e:
    parser.error(str(e))
  tokens = meta["tokens"]["train"] + meta["tokens"]["val"]
  rate = meta["bytes_tokenised"] / meta["seconds"] if meta["seconds"] else float("nan")
  print(f"{args.out}: {tokens:,} tokens ({meta['tokens']['val']:,} validation) of "
        f"{meta['documents']:,} documents in {len(meta['units'])} units, {meta['dtype']}; "
        f"tokenised {meta['bytes_tokenised'] / 2**20:,.1f} MiB in {meta['seconds']:.1f} s "
        f"({rate / 2**20:,.2f} MiB/s)")
  return meta


if __name__ == "__main__":
  main()
