"""Writes the notebooks of this folder from code, so that they are reviewed as code.

  python notebooks/build_notebooks.py          # rewrites notebooks/*.ipynb (outputs cleared)
  python notebooks/build_notebooks.py --check  # exit 1 if a notebook differs from this script

Each notebook starts with the same two cells: install the package when it is not importable
(Colab: from `DPKD_JAX_SOURCE`, a variable at the top of the cell, with the JAX wheels of the
detected runtime: TPU, CUDA 12/13 or CPU), then detect the backend and set `SMALL` (True by default unless a TPU/GPU is
attached; `DPKD_NOTEBOOK_SMALL=0/1` overrides it). CI runs every notebook top to bottom with
the small config (`tests/test_notebooks.py`).
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat
from nbformat import v4

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # the cell modules sit beside this script
  sys.path.insert(0, _HERE)

import nb_dpdfd_quickstart  # noqa: E402  (sibling modules: notebooks/ is on sys.path)
import nb_mechanisms_tour  # noqa: E402
import nb_paper_tables  # noqa: E402


def _cells(stem: str, spec: list[tuple[str, str]]) -> list:
  """[("md" | "code", source), ...] -> nbformat cells with stable ids (nbformat's are random)."""
  makers = {"md": v4.new_markdown_cell, "code": v4.new_code_cell}
  return [makers[kind](source.strip("\n"), id=f"{stem}-{i:02d}")
          for i, (kind, source) in enumerate(spec)]


NOTEBOOKS = {
    "dpdfd_quickstart.ipynb": nb_dpdfd_quickstart.dpdfd_quickstart,
    "mechanisms_tour.ipynb": nb_mechanisms_tour.mechanisms_tour,
    "paper_tables.ipynb": nb_paper_tables.paper_tables,
}


def build(name: str) -> nbformat.NotebookNode:
  """The notebook `name` with cleared outputs and a python3 kernelspec."""
  notebook = v4.new_notebook(cells=_cells(name.split(".")[0].replace("_", "-"),
                                          NOTEBOOKS[name]()))
  notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
  notebook.metadata["language_info"] = {"name": "python"}
  # No accelerator is requested: the notebooks run on a CPU (SMALL) and use one when present.
  return notebook


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--check", action="store_true", help="only compare, write nothing")
  a = p.parse_args(sys.argv[1:] if argv is None else argv)
  stale = []
  for name in NOTEBOOKS:
    path = os.path.join(_HERE, name)
    text = nbformat.writes(build(name)) + "\n"
    current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
    if current != text:
      stale.append(name)
      if not a.check:
        with open(path, "w", encoding="utf-8") as f:
          f.write(text)
  print(("stale: " if a.check else "written: ") + (", ".join(stale) or "none"))
  return 1 if a.check and stale else 0


if __name__ == "__main__":
  sys.exit(main())
