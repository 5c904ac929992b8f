"""Data files that ship inside the package, so that an installed wheel needs no clone.

  paper_results.json  the papers' tables with this library's rows, each with its command (the
                      paper-tables notebook's data), generated from the records in docs/results/
                      by `python -m experiments.results render`; never edited by hand

`path(name)` is the file on disk, `paper_results()` its content.
"""

from __future__ import annotations

import json
import os
from typing import Any

PAPER_RESULTS = "paper_results.json"


def path(name: str) -> str:
  """The path of the shipped file `name` (inside the installed package)."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def paper_results() -> dict[str, Any]:
  """The content of paper_results.json."""
  with open(path(PAPER_RESULTS), encoding="utf-8") as f:
    return json.load(f)
