"""The horizon study's trend, stated in words from the measured numbers alone.

Each optimizer is compared with tuned AdamW at every horizon it finished
(mean final validation loss over seeds, and the per-seed fraction of the
horizon's tokens it needs to reach AdamW's final loss), and the sequence of
differences is named: a lead that shrinks, grows, changes direction,
reverses or never was.
"""

from __future__ import annotations

from typing import Any

__all__ = ["describe_differences", "trend_paragraph"]


def _join(items: list[str]) -> str:
  return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def describe_differences(diffs: list[tuple[int, float]]) -> str:
  """Names the trend of ``(horizon, loss minus AdamW's)`` pairs, shortest first.

  Examples:
    >>> describe_differences([(200, -0.5), (1000, -0.1), (4000, -0.02)])
    'its lead shrinks as training gets longer'
    >>> describe_differences([(200, -0.5), (1000, -0.1), (4000, 0.03)])
    'its lead reverses: it ends behind AdamW at 4000 steps'
    >>> describe_differences([(200, -0.1), (1000, -0.3)])
    'its lead grows as training gets longer'
    >>> describe_differences([(200, 0.1), (1000, 0.2)])
    'it ends behind AdamW at every horizon'
    >>> describe_differences([(4000, -0.2)])
    'one horizon only'
  """
  values = [d for _, d in diffs]
  if len(values) < 2:
    return "one horizon only"
  behind = [h for h, d in diffs if d > 0]
  if len(behind) == len(values):
    return "it ends behind AdamW at every horizon"
  if behind:
    steps = _join([str(h) for h in behind])
    if values[-1] > 0 and all(d <= 0 for d in values[:len(values) - len(behind)]):
      return f"its lead reverses: it ends behind AdamW at {steps} steps"
    return f"it ends behind AdamW at {steps} steps and ahead at the others"
  sizes = [-d for d in values]
  if all(a > b for a, b in zip(sizes, sizes[1:])):
    return "its lead shrinks as training gets longer"
  if all(a < b for a, b in zip(sizes, sizes[1:])):
    return "its lead grows as training gets longer"
  return "its lead changes with horizon, but not in one direction"


def _ratio_text(reach: list[float | None]) -> str:
  if any(x is None for x in reach):
    hit = [x for x in reach if x is not None]
    return f"AdamW's final loss reached by {len(hit)} of {len(reach)} seeds"
  return f"{min(reach):.2f}-{max(reach):.2f}x"


def trend_paragraph(suites: list[dict[str, Any]], model: str, complete) -> str:
  """The measured trend on ``model`` as one paragraph ("" if nothing finished).

  Args:
    suites: ``horizon_report.summarize``'s entries.
    model: the model size.
    complete: ``complete(row)``: the row is tuned and has every seed.
  """
  size = sorted((s for s in suites if s["model"] == model), key=lambda s: s["steps"])
  per_opt: dict[str, list[tuple[int, float, list]]] = {}
  finished: dict[int, dict[str, float]] = {}
  for s in size:
    adam = next((r for r in s["rows"] if r["optimizer"] == "adamw"), None)
    if adam is None or not complete(adam):
      continue
    finished[s["steps"]] = {"adamw": adam["mean"]}
    for r in s["rows"]:
      if r["optimizer"] != "adamw" and complete(r):
        per_opt.setdefault(r["optimizer"], []).append(
            (s["steps"], r["mean"] - adam["mean"], r["reach"]))
        finished[s["steps"]][r["optimizer"]] = r["mean"]
  sentences = []
  for opt, points in per_opt.items():
    diffs = [(h, d) for h, d, _ in points]
    text = (f"`{opt}` minus tuned AdamW is "
            + _join([f"{d:+.3f}" for _, d in diffs]) + " nats/byte at "
            + _join([str(h) for h, _ in diffs]) + " steps")
    if len(diffs) > 1:
      text += f": {describe_differences(diffs)}"
    ratios = [f"{_ratio_text(reach)} at {h}" for h, _, reach in points if reach]
    if ratios:
      text += ("; the tokens it needs to reach AdamW's final loss, as a fraction of "
               "the horizon, are " + _join(ratios) + " steps")
    sentences.append(text + ".")
  if not sentences:
    return ""
  longest = max(h for h, scores in finished.items() if len(scores) > 1)
  order = sorted(finished[longest], key=finished[longest].get)
  sentences.append(f"At {longest} steps, the longest horizon with finished rows, the "
                   "order from lowest loss is " + ", ".join(f"`{o}`" for o in order) + ".")
  return " ".join(sentences)
