r"""Is data ever the bottleneck? Loader vs train step, tokenizer speed, memory.

Makes two corpora under ``--work`` (``~3 MB`` and ``~--big-mb`` MB of
CPython's documentation text, repeated with a counter so that no two
documents are equal), prepares both with ``examples/llama/prepare_data.py``
and measures:

* tokenizer throughput of ``prepare_data`` (input MiB/s): bytes on the big
  corpus; a SentencePiece model trained here (``--sp-vocab``) on
  ``--sp-mb`` MB of JSON lines;
* loader tokens/s: the Grain pipeline of ``train.py --dataset`` alone
  (``loader.train_iterator`` + ``loader.global_batch``) on the big corpus,
  at the ``tiny`` and ``20m`` batch shapes;
* train step tokens/s of ``train.py --dataset`` (compile excluded) for
  ``tiny`` and ``20m``, in a child process;
* peak RSS of the same short training run on each corpus (``os.wait4``).

::

  python -m benchmarks.data_throughput --work /tmp/data_bench \
      --out benchmarks/results/data_throughput
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import jax

from benchmarks.common import machine_info
from examples.llama import data as data_lib
from examples.llama import datasets
from examples.llama import loader
from examples.llama import prepare_data
from examples.llama import sharding as sharding_lib

__all__ = ["loader_tokens_per_s", "main", "write_corpus"]

# The clone's root: the example runs from it (``python -m examples.llama.train``).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {"tiny": (16, 128), "20m": (16, 256)}  # (batch, seq_len) of the runs timed.


def write_corpus(path: str, megabytes: float, jsonl: bool = False) -> int:
  """Writes about ``megabytes`` MB of text (JSON lines if ``jsonl``); returns bytes."""
  text = data_lib.default_corpus()
  docs = [text[i:i + 4000] for i in range(0, len(text), 4000)]
  written, n = 0, 0
  with open(path, "w", encoding="utf-8") as f:
    while written < megabytes * 1e6:
      doc = f"Document {n}.\n" + docs[n % len(docs)]
      line = json.dumps({"text": doc}) + "\n" if jsonl else doc + "\n\n"
      f.write(line)
      written += len(line.encode())
      n += 1
  return written


def loader_tokens_per_s(directory: str, batch: int, seq_len: int, steps: int = 200) -> float:
  """Tokens/s of the loader alone: per-step rows through Grain into a global array.

  Examples:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = write_corpus(os.path.join(d, "c.txt"), 0.2)
    >>> _ = prepare_data.prepare([os.path.join(d, "c.txt")], d + "/ds", progress=False)
    >>> loader_tokens_per_s(d + "/ds", 4, 16, steps=5) > 0
    True
  """
  source = loader.WindowBatches(datasets.PreparedDataset(directory), seq_len, batch, seed=0)
  sharding = sharding_lib.batch_sharding(sharding_lib.make_mesh({"fsdp": 1, "tp": 1}))
  it = loader.train_iterator(source, 0, batch)
  jax.block_until_ready(loader.global_batch(sharding, next(it), batch))
  start = time.perf_counter()
  for _ in range(steps):
    jax.block_until_ready(loader.global_batch(sharding, next(it), batch))
  return steps * batch * seq_len / (time.perf_counter() - start)


def _train(dataset: str, preset: str, steps: int, out: str) -> dict[str, Any]:
  """A ``train.py --dataset`` child: its summary line and peak RSS (MiB)."""
  batch, seq_len = SHAPES[preset]
  cmd = [sys.executable, "-m", "examples.llama.train", "--dataset", dataset,
         "--preset", preset, "--steps", str(steps), "--batch-size", str(batch),
         "--seq-len", str(seq_len), "--eval-every", str(steps),
         "--eval-batches", "2", "--checkpoint-every", "0", "--sample", "0", "--no-progress",
         "--log-every", "5", "--out", out]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  log = proc.stdout.read()
  _, status, usage = os.wait4(proc.pid, 0)
  if status:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{log[-3000:]}")
  line = next(l for l in log.splitlines() if l.startswith("initial val_loss"))
  rate = float(line.split(" s, ")[1].split(" tokens/s")[0].replace(",", ""))
  return {"preset": preset, "steps": steps, "batch": batch, "seq_len": seq_len,
          "train_tokens_per_s": rate, "peak_rss_mib": usage.ru_maxrss / 1024,
          "command": " ".join(cmd[1:])}


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--work", default="/tmp/data_bench", help="corpora and datasets go here")
  parser.add_argument("--out", default="benchmarks/results/data_throughput",
                      help="writes OUT.json and OUT.md")
  parser.add_argument("--big-mb", type=float, default=600.0)
  parser.add_argument("--small-mb", type=float, default=3.0)
  parser.add_argument("--sp-mb", type=float, default=30.0)
  parser.add_argument("--sp-vocab", type=int, default=4000)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--note", default="")
  args = parser.parse_args(argv)
  os.makedirs(args.work, exist_ok=True)
  result: dict[str, Any] = {"machine": machine_info(), "note": args.note,
                            "command": " ".join(["python"] + sys.argv)}

  corpora = {}
  for name, mb in (("small", args.small_mb), ("big", args.big_mb)):
    path = os.path.join(args.work, f"{name}.txt")
    if not os.path.isfile(path):
      write_corpus(path, mb)
    out = os.path.join(args.work, f"{name}_bytes")
    start = time.perf_counter()
    meta = prepare_data.prepare([path], out, workers=args.workers, progress=False,
                                command="benchmarks/data_throughput.py")
    seconds = time.perf_counter() - start
    corpora[name] = {"input_bytes": os.path.getsize(path), "tokens": meta["tokens"],
                     "prepare_s": seconds, "dataset": out}
    if meta["bytes_tokenised"]:
      corpora[name]["bytes_tokenizer_mib_s"] = meta["bytes_tokenised"] / 2**20 / seconds
    print(name, corpora[name], flush=True)
  result["corpora"] = corpora

  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  sp_input = os.path.join(args.work, "sp.jsonl")
  if not os.path.isfile(sp_input):
    write_corpus(sp_input, args.sp_mb, jsonl=True)
  spm.SentencePieceTrainer.train(
      input=os.path.join(args.work, "small.txt"), model_prefix=os.path.join(args.work, "sp"),
      vocab_size=args.sp_vocab, model_type="unigram", minloglevel=2,
      input_sentence_size=200_000, shuffle_input_sentence=True)
  start = time.perf_counter()
  meta = prepare_data.prepare([sp_input], os.path.join(args.work, "sp_ds"),
                              tokenizer=os.path.join(args.work, "sp.model"),
                              workers=args.workers, unit_mb=4, progress=False,
                              command="benchmarks/data_throughput.py")
  seconds = time.perf_counter() - start
  result["sentencepiece"] = {
      "vocab_size": args.sp_vocab, "input_bytes": os.path.getsize(sp_input),
      "tokens": meta["tokens"], "prepare_s": seconds,
      "mib_s": meta["bytes_tokenised"] / 2**20 / seconds,
      "tokens_per_s": (meta["tokens"]["train"] + meta["tokens"]["val"]) / seconds}
  print("sentencepiece", result["sentencepiece"], flush=True)

  result["presets"] = {}
  for preset, steps in (("tiny", 40), ("20m", 15)):
    batch, seq_len = SHAPES[preset]
    run = _train(corpora["big"]["dataset"], preset, steps,
                 os.path.join(args.work, f"run_{preset}"))
    run["loader_tokens_per_s"] = loader_tokens_per_s(corpora["big"]["dataset"], batch, seq_len)
    result["presets"][preset] = run
    print(preset, run, flush=True)

  result["memory"] = {name: _train(corpora[name]["dataset"], "tiny", 40,
                                   os.path.join(args.work, f"rss_{name}"))["peak_rss_mib"]
                      for name in ("small", "big")}
  print("memory", result["memory"], flush=True)
  with open(args.out + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(args.out + ".md", "w") as f:
    f.write(render(result))
  return result


def render(r: dict[str, Any]) -> str:
  """The results file as Markdown, from the data alone."""
  m = r["machine"]
  lines = ["# Data pipeline throughput and memory", "",
           "## Loader vs train step (tokens/s, CPU)", "",
           "| preset | batch x seq | loader alone | train step | loader / step |",
           "|---|---|---|---|---|"]
  for name, p in r["presets"].items():
    lines.append(f"| {name} | {p['batch']} x {p['seq_len']} | {p['loader_tokens_per_s']:,.0f} "
                 f"| {p['train_tokens_per_s']:,.0f} | "
                 f"{p['loader_tokens_per_s'] / p['train_tokens_per_s']:,.0f}x |")
  c, sp = r["corpora"], r["sentencepiece"]
  lines += ["", "## Tokenizer throughput of prepare_data.py", "",
            "| tokenizer | input | MiB/s | tokens/s |", "|---|---|---|---|",
            f"| bytes | {c['big']['input_bytes'] / 1e6:,.0f} MB text | "
            f"{c['big'].get('bytes_tokenizer_mib_s', float('nan')):,.1f} | "
            f"{sum(c['big']['tokens'].values()) / c['big']['prepare_s']:,.0f} |",
            f"| SentencePiece unigram, vocab {sp['vocab_size']} | "
            f"{sp['input_bytes'] / 1e6:,.0f} MB JSON lines | {sp['mib_s']:,.2f} | "
            f"{sp['tokens_per_s']:,.0f} |",
            "", "## Peak RSS of `train.py --dataset` (tiny, 40 steps)", "",
            "| corpus | tokens | peak RSS (MiB) |", "|---|---|---|"]
  for name in ("small", "big"):
    tokens = c[name]["tokens"]["train"] + c[name]["tokens"]["val"]
    lines.append(f"| {c[name]['input_bytes'] / 1e6:,.1f} MB | {tokens:,} | "
                 f"{r['memory'][name]:,.1f} |")
  lines.append(f"\nDifference: {r['memory']['big'] - r['memory']['small']:+,.1f} MiB.\n")
  lines += ["## Provenance", "",
            f"Machine: {m.get('cpu')}, {m.get('cores')} cores, load {m.get('load')} at the start, "
            f"{m.get('date')}. {r['note']}", "", f"Command: `{r['command']}`", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
