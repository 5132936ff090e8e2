"""prepare_data.py: inputs of every kind, tokenizers, interruption, bad input.

Each test makes its own corpus under ``tmp_path``; none compiles a model.
"""

from __future__ import annotations

import json
import os

import llama_corpora
import numpy as np
import pytest

from examples.llama import datasets
from examples.llama import loader
from examples.llama import prepare_data
from examples.llama import tokenizers
from examples.llama import train


def _all_tokens(directory) -> np.ndarray:
  ds = datasets.PreparedDataset(str(directory))
  return np.concatenate([np.asarray(s) for s in ds.splits["train"] + ds.splits["val"]])


def test_text_folders_and_json_lines_become_uint8_shards(tmp_path):
  docs = llama_corpora.documents(40, 300)
  (tmp_path / "in" / "sub").mkdir(parents=True)
  (tmp_path / "in" / "a.txt").write_text(docs[0], encoding="utf-8")
  (tmp_path / "in" / "sub" / "b.txt").write_text(docs[1], encoding="utf-8")
  (tmp_path / "in" / ".hidden").write_text("never read")
  (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[2:20]))
  llama_corpora.write_jsonl_gz(tmp_path / "d.json.gz", docs[20:30])
  llama_corpora.write_jsonl_gz(tmp_path / "e.jsonl.gz", docs[30:40])
  out = tmp_path / "ds"
  meta = prepare_data.main([str(tmp_path / "in"), str(tmp_path / "c.jsonl"),
                            str(tmp_path / "d.json.gz"), str(tmp_path / "e.jsonl.gz"),
                            "--out", str(out), "--workers", "2", "--unit-mb", "0.002",
                            "--val-fraction", "0.1", "--no-progress"])
  saved = json.load(open(out / "metadata.json"))
  assert saved["version"] == datasets.VERSION and saved["complete"]
  assert saved["tokenizer"] == {"kind": "bytes", "vocab_size": 256}
  assert saved["dtype"] == "uint8" and saved["documents"] == 40 == meta["documents"]
  assert saved["command"].split()[1].endswith("examples/llama/prepare_data.py")
  assert "--val-fraction 0.1" in saved["command"] and saved["val_fraction"] == 0.1
  assert len(saved["units"]) > 5  # c.jsonl (5.4 kB) is cut into 2 kB units.
  for unit in saved["units"]:
    for split in ("train", "val"):
      shard = np.load(out / unit[split]["file"], mmap_mode="r")
      assert isinstance(shard, np.memmap) and shard.dtype == np.uint8
      assert len(shard) == unit[split]["tokens"]
      assert unit[split]["crc32"] == datasets.crc32_file(str(out / unit[split]["file"]))
  # Every byte of every document is there, each document ending in a blank line.
  tokens = _all_tokens(out)
  assert len(tokens) == sum(len(d.encode()) + 2 for d in docs)
  assert saved["tokens"]["train"] + saved["tokens"]["val"] == len(tokens)
  stream = bytes(tokens).decode()  # Units in input order, train before val in each.
  for doc in docs:
    assert doc[:50] in stream


def test_sentencepiece_dataset_defines_the_tokenizer_and_refuses_mixing(tmp_path, capsys):
  model = llama_corpora.train_sentencepiece(tmp_path)
  docs = llama_corpora.documents(60)
  shard = llama_corpora.write_jsonl_gz(tmp_path / "c4-00000.json.gz", docs)
  out = tmp_path / "ds"
  prepare_data.prepare([str(shard)], str(out), tokenizer=model, progress=False)
  meta = json.load(open(out / "metadata.json"))
  assert meta["tokenizer"]["kind"] == "sentencepiece" and meta["tokenizer"]["vocab_size"] == 300
  assert meta["dtype"] == "uint16"  # 300 ids do not fit in uint8.
  assert meta["tokenizer"]["sha256"] == datasets.sha256_file(model)
  sp = tokenizers.load_tokenizer(model)
  eos = sp._sp.eos_id()
  expected = np.concatenate([np.append(sp.encode(d), eos) for d in docs])
  np.testing.assert_array_equal(_all_tokens(out), expected)
  # The dataset brings its tokenizer: same one accepted, another refused.
  data = loader.open_data(dataset=str(out), tokenizer=model, val_fraction=0.05)
  assert data.tokenizer.vocab_size == 300 and data.prepared is not None
  # Another tokenizer into the same folder is refused; nothing is touched.
  before = sorted(os.listdir(out))
  with pytest.raises(ValueError, match="another tokenizer"):
    prepare_data.prepare([str(shard)], str(out), tokenizer=None, progress=False)
  assert sorted(os.listdir(out)) == before
  # train.py: a conflicting --tokenizer or --val-fraction is a parser error.
  (tmp_path / "other").mkdir()
  other = llama_corpora.train_sentencepiece(tmp_path / "other", vocab_size=280)
  for flags, message in ((["--tokenizer", other], "not the tokenizer"),
                         (["--val-fraction", "0.2"], "conflicts with the split"),
                         (["--data", str(shard)], "replaces --data"),
                         (["--vocab-size", "256"], "smaller than the tokenizer's")):
    with pytest.raises(SystemExit) as e:
      train.main(["--dataset", str(out), "--no-progress", *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_an_interrupted_prepare_continues_and_remakes_a_half_written_shard(
    tmp_path, monkeypatch):
  docs = llama_corpora.documents(30, 500)
  path = tmp_path / "corpus.jsonl"
  path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  args = dict(unit_mb=0.002, progress=False)
  reference = prepare_data.prepare([str(path)], str(tmp_path / "whole"), **args)

  real, calls = prepare_data.tokenize_unit, []

  def dies_at_the_fourth_unit(*a):
    calls.append(a[0].index)
    if len(calls) == 4:
      raise KeyboardInterrupt  # Ctrl-C, or the machine going away.
    return real(*a)

  monkeypatch.setattr(prepare_data, "tokenize_unit", dies_at_the_fourth_unit)
  out = tmp_path / "ds"
  with pytest.raises(KeyboardInterrupt):
    prepare_data.prepare([str(path)], str(out), **args)
  meta = json.load(open(out / "metadata.json"))
  assert not meta["complete"] and [u["index"] for u in meta["units"]] == [0, 1, 2]
  with pytest.raises(ValueError, match="not finished preparing"):
    datasets.PreparedDataset(str(out))
  # A shard cut short (the disk filled, a copy died) and a leftover temporary file.
  shard = out / meta["units"][1]["train"]["file"]
  shard.write_bytes(shard.read_bytes()[:-7])
  (out / "train-00003.npy.tmp.npy").write_bytes(b"half")

  monkeypatch.setattr(prepare_data, "tokenize_unit", real)
  calls.clear()
  resumed = prepare_data.prepare([str(path)], str(out), **args)
  assert resumed["complete"] and not any(".tmp" in n for n in os.listdir(out))
  redone = {u["index"] for u in resumed["units"]} - {0, 2}
  assert resumed["bytes_tokenised"] == sum(u["end"] - u["start"] for u in resumed["units"]
                                           if u["index"] in redone)
  assert [u["train"]["crc32"] for u in resumed["units"]] == [
      u["train"]["crc32"] for u in reference["units"]]
  np.testing.assert_array_equal(_all_tokens(out), _all_tokens(tmp_path / "whole"))
  # The training side checks sizes too: a damaged shard is named, never read.
  shard.write_bytes(shard.read_bytes()[:-1])
  with pytest.raises(ValueError, match=f"shard {shard}.*half-written"):
    datasets.PreparedDataset(str(out))


def test_bad_input_gets_a_clear_message_and_keeps_what_is_prepared(tmp_path, capsys):
  good = tmp_path / "good.txt"
  good.write_text("Good text. " * 300)
  out = tmp_path / "ds"
  prepare_data.prepare([str(good)], str(out), progress=False)
  kept = {n: (out / n).read_bytes() for n in os.listdir(out)}

  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "blank.txt").write_text("")
  (tmp_path / "no_text.jsonl").write_text('{"text": "fine"}\n{"body": "where is it"}\n')
  (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
  for case, (inputs, message) in enumerate((
      ([tmp_path / "empty"], "no text in"),
      ([tmp_path / "missing.txt"], "no such file or folder"),
      ([tmp_path / "no_text.jsonl"], "no_text.jsonl (byte 17): the JSON line has no string "
                                     '"text" field'),
      ([tmp_path / "latin1.txt"], "latin1.txt (near byte 3): not UTF-8 text"),
  )):
    with pytest.raises(SystemExit) as e:
      prepare_data.main([*map(str, inputs), "--out", str(tmp_path / f"new{case}"), "--workers", "1",
                         "--no-progress"])
    assert e.value.code == 2
    assert message in capsys.readouterr().err

  # A bad file after a good one: the good unit stays recorded, the run can continue.
  with pytest.raises(ValueError, match="latin1.txt"):
    prepare_data.prepare([str(good), str(tmp_path / "latin1.txt")], str(tmp_path / "mixed"),
                         progress=False)
  partial = json.load(open(tmp_path / "mixed" / "metadata.json"))
  assert [os.path.basename(u["path"]) for u in partial["units"]] == ["good.txt"]

  (out / "metadata.json").write_text('{"format": "foam_jax.llama.tok')  # Cut short.
  with pytest.raises(ValueError, match="metadata.json is corrupt"):
    prepare_data.prepare([str(good)], str(out), progress=False)
  with pytest.raises(ValueError, match="metadata.json is corrupt"):
    datasets.PreparedDataset(str(out))
  assert {n: (out / n).read_bytes() for n in os.listdir(out) if n != "metadata.json"} == {
      n: b for n, b in kept.items() if n != "metadata.json"}
