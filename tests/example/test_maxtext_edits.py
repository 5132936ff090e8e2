"""The MaxText guide and the script that makes its edits agree.

``docs/guides/maxtext.md`` shows each edit as MaxText's text around it with
our lines in place; ``examples/maxtext/foam_edits.py`` makes exactly those
edits. Here, without MaxText: each of the script's edits is one of the
guide's code blocks, and the guide's edits section holds no other.
(``tests/clients/test_maxtext.py`` applies them to MaxText and trains.)
"""

import os
import re

import pytest

from examples.maxtext import foam_edits

GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guides", "maxtext.md")


def _edit_blocks():
  text = open(GUIDE, encoding="utf-8").read()
  section = text.split("## The edits", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def test_the_guide_shows_each_edit_the_script_makes():
  blocks = _edit_blocks()
  assert blocks == [edit.edited for edit in foam_edits.EDITS]


def test_the_options_the_guide_runs_with_are_the_ones_the_edits_define():
  text = open(GUIDE, encoding="utf-8").read()
  run = text.split("## Run", 1)[1].split("\n## ", 1)[0]
  used = set(re.findall(r"\b(foam_\w+)\b", run))
  defined = set(re.findall(r"^  (foam_\w+):", foam_edits.FOAM_OPTIONS, flags=re.M))
  assert used and used <= defined, (used, defined)
  assert "opt_type=foam" in run and foam_edits.FOAM_ENUM.strip() == 'FOAM = "foam"'


def test_a_release_without_the_anchors_is_refused(tmp_path):
  for edit in foam_edits.EDITS:
    (tmp_path / edit.path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / edit.path).write_text("# not MaxText\n")
  with pytest.raises(ValueError, match="exactly once"):
    foam_edits.apply(str(tmp_path))
