"""docs/MECHANISMS.md cannot rot: every ```python block runs, and every public name is shown.

Each block is executed in a fresh namespace (blocks are self-contained and carry their own
asserts, including figures quoted from docs/privacy.md), so a changed signature, a changed
default or a moved number fails here.
"""

import inspect
import pathlib
import re

import pytest

from dpkd_jax import privacy

_DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "MECHANISMS.md"
_TEXT = _DOC.read_text(encoding="utf-8")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{2,3} (.*)$", re.MULTILINE)


def _blocks() -> list[tuple[str, str]]:
  """(id, code) of every python block; id = a short form of the heading above it."""
  blocks = []
  for match in _BLOCK.finditer(_TEXT):
    headings = _HEADING.findall(_TEXT[:match.start()])
    title = re.sub(r"[^A-Za-z0-9_]+", "_", headings[-1].split("(")[0]).strip("_") if headings else "top"
    # Leading newlines keep the doc's line numbers, so a traceback points at MECHANISMS.md.
    first_line = _TEXT.count("\n", 0, match.start(1))
    blocks.append((f"{len(blocks):02d}_{title[:40]}", "\n" * first_line + match.group(1)))
  return blocks


_BLOCKS = _blocks()


def _public_names() -> list[str]:
  return sorted(name for name in dir(privacy)
                if not name.startswith("_") and not inspect.ismodule(getattr(privacy, name)))


def test_the_doc_has_examples():
  # Guards the extraction itself: a broken regex would otherwise run zero examples.
  assert len(_BLOCKS) >= 20


@pytest.mark.parametrize("code", [code for _, code in _BLOCKS], ids=[i for i, _ in _BLOCKS])
def test_example_runs(code):
  namespace = {"__name__": "mechanisms_doc_example"}
  exec(compile(code, str(_DOC), "exec"), namespace)  # pylint: disable=exec-used


@pytest.mark.parametrize("name", _public_names())
def test_every_public_name_is_documented_and_used(name):
  assert f"`{name}" in _TEXT, f"dpkd_jax.privacy.{name} has no entry in docs/MECHANISMS.md"
  used = any(re.search(rf"\b{name}\b", code) for _, code in _BLOCKS)
  assert used, f"no example in docs/MECHANISMS.md uses dpkd_jax.privacy.{name}"


def test_summary_table_names_every_mechanism_with_its_event():
  table = _TEXT[_TEXT.index("| function |"):_TEXT.index("## Accounting")]
  for mechanism, event in [("output_gradient_mechanism", "dpdfd_event"),
                           ("multi_teacher_output_gradients", "dpdfd_event"),
                           ("sanitize", "rona_event"),
                           ("selective_randomized_response", "srr_event"),
                           ("laplace_counts", "laplace_counts_event"),
                           ("ldp_flip_bits", "srr_event"),
                           ("collision_report", "srr_event")]:
    row = next(line for line in table.splitlines() if line.startswith(f"| `{mechanism}`"))
    assert event in row, f"{mechanism}'s row does not name {event}"
