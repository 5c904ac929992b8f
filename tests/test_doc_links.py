"""Every relative link of the tracked Markdown files, and every docs link a CLI hint prints,
resolves: the file exists and, with a #fragment, the target file has a heading of that anchor
(GitHub's rule: lower case, punctuation but `-` and `_` dropped, spaces to hyphens) or an
explicit `<a id="...">`. A link the library, a CLI or a recipe prints names a stable anchor (an
explicit id, which a renamed heading keeps), a record file or a recipe file."""

import pathlib
import re
import subprocess

import pytest

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


_EXPLICIT = re.compile(r"<a (?:id|name)=\"([^\"]+)\"></a>")


def explicit_anchors(path: pathlib.Path) -> set[str]:
  """The explicit anchors (`<a id="x"></a>`) of the Markdown file `path`: stable ones."""
  return set(_EXPLICIT.findall(_prose(path.read_text(encoding="utf-8"))))


def anchors(path: pathlib.Path) -> set[str]:
  """The GitHub anchors of the Markdown file `path`: its headings' (repeats get -1, -2...) and
  its explicit ones."""
  found, seen = explicit_anchors(path), {}
  for heading in re.findall(r"^#+ (.+)$", _prose(path.read_text(encoding="utf-8")), re.M):
    heading = re.sub(r"<[^>]+>", "", heading)  # GitHub slugs the text, not inline HTML
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


# A link written in a string of the library, a CLI or a recipe: a docs anchor, a record, a recipe.
_PRINTED = re.compile(r"(?:docs/[A-Za-z_]+\.md#[\w\-]+|docs/results/[\w.\-]+\.json|"
                      r"configs/[a-z_]+/[\w.]+\.py)")


def _printed_links() -> set[str]:
  """Every link-like string outside comments of dpkd_jax/, experiments/ and configs/."""
  printed = set()
  for folder in ("dpkd_jax", "experiments", "configs"):
    for path in (_REPO / folder).rglob("*.py"):
      for line in path.read_text(encoding="utf-8").splitlines():
        if not line.lstrip().startswith("#"):
          printed.update(_PRINTED.findall(line))
  return printed


def test_the_scan_finds_the_hints():
  printed = _printed_links()
  assert {"docs/RESULTS.md#dpdfd-engine", "docs/privacy.md#one-teacher-at-chance",
          "docs/RESULTS.md#srr-engine", "configs/dpdfd/digits_quickstart.py"} <= printed


@pytest.mark.parametrize("link", sorted(_printed_links()))
def test_every_link_the_library_and_the_clis_print_resolves_to_a_stable_target(link):
  assert _problem(_REPO / "README.md", link) is None  # links are relative to the repo root
  path, _, fragment = link.partition("#")
  if fragment:  # an explicit id: a renamed heading keeps it
    assert fragment in explicit_anchors(_REPO / path), link
