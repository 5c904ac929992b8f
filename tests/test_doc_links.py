"""Every relative link of the tracked Markdown files, and every docs link a CLI hint prints,
resolves: the file exists and, with a #fragment, the target file has a heading of that anchor
(GitHub's rule: lower case, punctuation but `-` and `_` dropped, spaces to hyphens)."""

import pathlib
import re
import subprocess

import pytest

from dpkd_jax.methods.dpdfd import quickstart
from dpkd_jax.methods.srr import summary as srr_summary

_REPO = pathlib.Path(__file__).resolve().parent.parent
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _tracked_markdown() -> list[pathlib.Path]:
  out = subprocess.run(["git", "ls-files", "*.md"], cwd=_REPO, capture_output=True, text=True,
                       check=True).stdout.split()
  return [_REPO / path for path in out if (_REPO / path).exists()]


def _prose(text: str) -> str:
  """`text` without its fenced code blocks (a link-like string in code is not a link)."""
  keep, fenced = [], False
  for line in text.split("\n"):
    if _FENCE.match(line.strip()):
      fenced = not fenced
      continue
    if not fenced:
      keep.append(line)
  return "\n".join(keep)


def anchors(path: pathlib.Path) -> set[str]:
  """The GitHub anchors of the headings of the Markdown file `path` (repeats get -1, -2...)."""
  found, seen = set(), {}
  for heading in re.findall(r"^#+ (.+)$", _prose(path.read_text(encoding="utf-8")), re.M):
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    found.add(slug if count == 0 else f"{slug}-{count}")
  return found


def _problem(source: pathlib.Path, target: str) -> str | None:
  """Why the relative link `target` in `source` does not resolve, or None."""
  if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("mailto:"):
    return None  # an absolute URL: not checked (no network)
  path, _, fragment = target.partition("#")
  file = (source.parent / path).resolve() if path else source
  if not file.exists():
    return f"{source.relative_to(_REPO)}: {target}: no such file"
  if fragment and file.suffix == ".md" and fragment not in anchors(file):
    return f"{source.relative_to(_REPO)}: {target}: no heading with that anchor"
  return None


def test_every_relative_link_of_the_tracked_markdown_resolves():
  problems = []
  for source in _tracked_markdown():
    for target in _LINK.findall(_prose(source.read_text(encoding="utf-8"))):
      problem = _problem(source, target)
      if problem:
        problems.append(problem)
  assert not problems, "\n".join(problems)


_HINTS = [quickstart.ENGINE_ANCHOR, quickstart.DISAGREEMENT_ANCHOR,
          quickstart.PAPER_TABLE_ANCHOR, quickstart.ENSEMBLE_ANCHOR, quickstart.COVERAGE_ANCHOR,
          quickstart.PRIVACY_ANCHOR, srr_summary.RESULTS_ANCHOR, srr_summary.ABLATION_ANCHOR,
          srr_summary.STUDENT_ANCHOR]


@pytest.mark.parametrize("hint", _HINTS)
def test_every_cli_hint_link_resolves(hint):
  assert _problem(_REPO / "README.md", hint) is None  # hints are relative to the repo root


def test_hint_strings_in_the_library_are_all_checked():
  # A docs link with an anchor written anywhere in the library or the CLIs is one of _HINTS
  # or sits in a comment: a new printed link must be added above.
  pattern = re.compile(r"docs/[A-Za-z_]+\.md#[\w\-ε]+")
  printed = set()
  for folder in ("dpkd_jax", "experiments"):
    for path in (_REPO / folder).rglob("*.py"):
      for line in path.read_text(encoding="utf-8").splitlines():
        if not line.lstrip().startswith("#"):
          printed.update(pattern.findall(line))
  assert printed <= set(_HINTS) | {h.split("#")[0] + "#" for h in _HINTS}, printed - set(_HINTS)
