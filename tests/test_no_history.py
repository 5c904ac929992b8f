"""No development history in the product: the tracked text files (code, CLI messages, docs,
notebooks, tests, records and their file names) carry no labels of how the work was organised
(numbered work sessions, issue numbers, numbered rounds of the work). That history belongs to git.

Genuine uses are not matched by the patterns (an onnxruntime `InferenceSession`, `tf.Session`,
`round(...)`, "rounded", an algorithm's `--rounds=R` or "T = 2 rounds"); a remaining genuine use
goes on _ALLOWED with its reason. CHANGELOG.md may list versions, never work-session labels.
"""

import fnmatch
import pathlib
import re
import subprocess

_REPO = pathlib.Path(__file__).resolve().parent.parent

_PATTERNS = {
    "a numbered work session": re.compile(r"\bsessions? [0-9]|\bsession-[0-9]", re.I),
    "an issue number": re.compile(r"\bissues? #?[0-9]|#[0-9]+,? item|\(#[0-9]+[),]|\bPR #[0-9]",
                                  re.I),
    "a round of the work": re.compile(r"\bdevelopment[ ]rounds?\b|^#+ Round [0-9]+:", re.I | re.M),
    # a record labelled by the working period that made it (`srr__mnist__s2` "0_eps10")
    "a numbered working period in a record name": re.compile(r"__s[0-9]{2}_"),
}

# Paths left out of the check (none).
_TEMPORARILY_EXCLUDED: tuple[str, ...] = ()

# (path, text) of genuine uses the patterns would flag: none today.
_ALLOWED: tuple[tuple[str, str], ...] = ()

_BINARY_SUFFIXES = {".png", ".jpg", ".npz", ".npy", ".onnx", ".pt", ".bin", ".gz", ".zip"}


def _tracked() -> list[str]:
  return subprocess.run(["git", "ls-files"], cwd=_REPO, capture_output=True, text=True,
                        check=True).stdout.split()


def _excluded(path: str) -> bool:
  return any(fnmatch.fnmatch(path, pattern) for pattern in _TEMPORARILY_EXCLUDED)


def _findings(path: str, text: str) -> list[str]:
  found = []
  for what, pattern in _PATTERNS.items():
    for match in pattern.finditer(text):
      line = text[:match.start()].count("\n") + 1
      snippet = text[max(0, match.start() - 30):match.end() + 30].replace("\n", " ")
      if not any(path == p and t in snippet for p, t in _ALLOWED):
        found.append(f"{path}:{line}: {what}: ...{snippet}...")
  return found


def test_the_patterns_catch_history_and_spare_genuine_uses():
  # (the examples are split so that this file does not match its own patterns)
  assert _findings("x.md", "as measured in sess" "ion 12")
  assert _findings("x.md", "see iss" "ue #" "22, item 4")
  assert _findings("x.md", "## Round 29: new table")
  assert _findings("x.py", "fixed in (" "#17)")
  assert _findings("x.py", "as iss" "ue 17 point 11 asks")
  assert _findings("x.md", "docs/results/srr__mnist__s" "20_eps10.json")
  for genuine in ("sess = onnxruntime.InferenceSession(path)", "x = round(y, 4)",
                  "--rounds=5 --queries_per_round=500", "T = 2 rounds (round 2 relabels)",
                  "the rounded value", "a session of the device",
                  "dpdfd__mnist__collapse_base_paper_eps1_s0.json"):
    assert not _findings("x.py", genuine), genuine


def test_no_tracked_text_file_carries_development_history():
  problems = []
  for path in _tracked():
    problems += _findings(path, path)  # file names shown to users
    if _excluded(path) or pathlib.Path(path).suffix in _BINARY_SUFFIXES:
      continue
    try:
      text = (_REPO / path).read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError):
      continue
    problems += _findings(path, text)
  assert not problems, "\n".join(problems)
