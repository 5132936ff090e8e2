"""Selects FOAM in an installed MaxText release: the edits of the MaxText guide.

MaxText builds its optimizer in one ``if``/``elif`` on ``config.opt_type``
(``get_optimizer`` in ``maxtext/optimizers/optimizers.py``), and its
configuration is a pydantic model that refuses keys it does not know, so
selecting FOAM takes four insertions in its sources (``docs/guides/maxtext.md``
shows each): the enum value, a block of FOAM's options, that block among the
configuration's bases, and the branch that calls ``foam_jax.foam``.

This script makes them in the installed ``maxtext`` package (or in a
checkout's ``src/maxtext``, ``--root``). Each insertion goes between two
pieces of MaxText's text that must occur together exactly once; only the
guide's lines are inserted; a release whose text moved is refused, and a
second run changes nothing. ``--check`` reports what is applied, changing
nothing.

Usage::

  python -m examples.maxtext.foam_edits            # the installed maxtext
  python -m examples.maxtext.foam_edits --root src/maxtext --check

Tested with ``maxtext[tpu]==0.2.5`` (``tests/clients/test_maxtext.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os

__all__ = ["EDITS", "Edit", "apply", "installed_root", "main", "status"]


@dataclasses.dataclass(frozen=True)
class Edit:
  """``inserted`` goes between ``before`` and ``after`` in ``path``.

  Attributes:
    path: the file, relative to the ``maxtext`` package.
    before: MaxText's text just above the insertion.
    inserted: our lines.
    after: MaxText's text just below it.
  """

  path: str
  before: str
  inserted: str
  after: str

  @property
  def anchor(self) -> str:
    """MaxText's text around the insertion, as the release has it."""
    return self.before + self.after

  @property
  def edited(self) -> str:
    """The same text with our lines in place."""
    return self.before + self.inserted + self.after


FOAM_ENUM = '  FOAM = "foam"\n'

FOAM_OPTIONS = '''\
class Foam(BaseModel):
  """FOAM's options (foam_jax.foam); the Adam fields are shared with AdamW."""

  foam_fold_level: int = Field(2, description="FOAM folds moments into blocks of 2**level entries.")
  foam_alpha: float = Field(1.0, description="FOAM: the scale of folded leaves' updates.")
  foam_nu_dtype: str = Field("", description="FOAM: nu's dtype (int8: 8-bit); empty: the weight's.")


'''

FOAM_BASE = "    Foam,\n"

FOAM_BRANCH = '''\
  elif config.opt_type == "foam":
    import foam_jax  # pylint: disable=import-outside-toplevel

    base_opt = foam_jax.foam(
        learning_rate_schedule,
        b1=config.adam_b1,
        b2=config.adam_b2,
        eps=config.adam_eps,
        eps_root=config.adam_eps_root,
        weight_decay=config.adam_weight_decay,
        mu_dtype=config.mu_dtype,
        mask=get_adamw_mask(config),
        fold_level=config.foam_fold_level,
        alpha=config.foam_alpha,
        nu_dtype=config.foam_nu_dtype or None,
    )
'''

EDITS = (
    Edit("configs/types.py", '  SGD = "sgd"\n  MUON = "muon"\n', FOAM_ENUM, ""),
    Edit("configs/types.py", "", FOAM_OPTIONS, "class AdamW(BaseModel):\n"),
    Edit("configs/types.py", "    Optimizer,\n    AdamW,\n", FOAM_BASE, "    Muon,\n"),
    Edit("optimizers/optimizers.py", "", FOAM_BRANCH, '  elif config.opt_type == "sgd":\n'),
)


def installed_root() -> str:
  """The installed ``maxtext`` package's directory."""
  spec = importlib.util.find_spec("maxtext")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("maxtext is not installed here: pip install 'maxtext[tpu]'.")
  return list(spec.submodule_search_locations)[0]


def _read(root: str, edit: Edit) -> str:
  with open(os.path.join(root, edit.path), encoding="utf-8") as f:
    return f.read()


def status(root: str) -> list[bool]:
  """Per edit, whether it is applied.

  Raises:
    ValueError: MaxText's text around an edit is not there exactly once.
  """
  applied = []
  for edit in EDITS:
    text = _read(root, edit)
    if text.count(edit.edited) == 1:
      applied.append(True)
    elif text.count(edit.anchor) == 1:
      applied.append(False)
    else:
      raise ValueError(
          f"{edit.path}: this MaxText release does not have the text the edit goes into "
          f"exactly once ({text.count(edit.anchor)} times):\n{edit.anchor}")
  return applied


def apply(root: str) -> int:
  """Makes every edit not yet made; returns how many it made."""
  todo = [edit for edit, done in zip(EDITS, status(root)) if not done]
  for edit in todo:
    path = os.path.join(root, edit.path)
    text = _read(root, edit)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text.replace(edit.anchor, edit.edited, 1))
  return len(todo)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--root", help="the maxtext package directory (default: the installed one)")
  parser.add_argument("--check", action="store_true", help="report only")
  args = parser.parse_args(argv)
  root = args.root or installed_root()
  if args.check:
    done = status(root)
    print(f"{sum(done)} of {len(done)} FOAM edits applied in {root}")
    return 0 if all(done) else 1
  print(f"made {apply(root)} of {len(EDITS)} FOAM edits in {root}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
