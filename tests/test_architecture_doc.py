"""docs/ARCHITECTURE.md, "The walk of σ": the files a DPDFD run's noise multiplier crosses from
the CLI flag to the noise draw and to the ledger entry, as a run takes them.

A tiny `python -m experiments.dpdfd` run (digits, two steps) is profiled: at each hand-off of σ
(the flags build the config, the config and the plan hold it, its event, the ledger entry, the
draw) the call stack is read, and every repository frame on it that holds σ (the float, the
flag's text, a config, namespace or plan whose `noise_multiplier` is σ, or a dp_accounting
event) is a step of the walk. Consecutive steps in one file are one crossing. The document's
table must list exactly these crossings, in order.
"""

import os
import pathlib
import re
import sys
import warnings

import dp_accounting
import pytest

from experiments import dpdfd as dpdfd_cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIGMA_TEXT = "7.3125"  # exact in binary: the float σ is recognised by equality
SIGMA = float(SIGMA_TEXT)
# (file, function) where σ, or its event, is handed to the next room. The walk ends at the
# first draw and the first ledger entry (`ENDS`).
HANDOFFS = {
    ("experiments/_flags.py", "build_config"),
    ("dpkd_jax/methods/dpdfd/config.py", "__post_init__"),
    ("dpkd_jax/privacy/plan.py", "__post_init__"),
    ("dpkd_jax/privacy/accounting.py", "dpdfd_event"),
    ("dpkd_jax/privacy/ledger.py", "record"),
    ("dpkd_jax/privacy/mechanisms.py", "multi_teacher_output_gradients"),
}
ENDS = {"record", "multi_teacher_output_gradients"}
_FUNCTIONS = {function for _, function in HANDOFFS}
_ROOT_TEXT = str(ROOT) + os.sep


def _holds_sigma(value, top: bool = True) -> bool:
  if isinstance(value, float):
    return value == SIGMA
  if isinstance(value, str):
    return SIGMA_TEXT in value
  if isinstance(value, dp_accounting.DpEvent):
    return True
  if top and isinstance(value, (list, tuple)):
    return any(_holds_sigma(v, top=False) for v in value[:64])
  if top and isinstance(value, dict):
    return any(_holds_sigma(v, top=False) for v in list(value.values())[:64])
  sigma = None if isinstance(value, type) else getattr(value, "noise_multiplier", None)
  return isinstance(sigma, float) and sigma == SIGMA


def _relative(frame) -> str | None:
  path = frame.f_code.co_filename
  if not path.startswith(_ROOT_TEXT):
    return None  # library code, or a generated function ("<string>": a dataclass __init__)
  name = path[len(_ROOT_TEXT):].replace(os.sep, "/")
  return None if name.startswith("tests/") else name


class _Walk:
  """A `sys.setprofile` hook: at each hand-off, the new frames of the stack that hold σ."""

  def __init__(self):
    self.steps, self._frames, self._ended = [], [], set()

  def __call__(self, frame, event, arg):
    del arg
    if (event != "call" or frame.f_code.co_name not in _FUNCTIONS
        or len(self._ended) == len(ENDS)):
      return  # the cheap tests first: this runs at every call of the run
    name = _relative(frame)
    if name is None or (name, frame.f_code.co_name) not in HANDOFFS:
      return
    self._ended |= {frame.f_code.co_name} & ENDS
    stack, f = [], frame
    while f is not None:
      if (_relative(f) is not None and all(f is not g for g in self._frames)
          and any(_holds_sigma(v) for v in dict(f.f_locals).values())):
        stack.append(f)
      f = f.f_back
    for f in reversed(stack):
      self._frames.append(f)  # kept alive: a freed frame's id could name a later one
      self.steps.append((_relative(f), f.f_code.co_name))

  def crossings(self) -> list[tuple[str, list[str]]]:
    out = []
    for name, function in self.steps:
      if out and out[-1][0] == name:
        if function not in out[-1][1]:
          out[-1][1].append(function)
      else:
        out.append((name, [function]))
    return out


def _documented() -> list[tuple[str, list[str]]]:
  text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
  section = text.split("## The walk of σ", 1)[1]
  block = section.split("```", 2)[1]
  rows = []
  for line in block.splitlines():
    if re.match(r"\s*\d+\s", line):
      _, name, functions, *_ = re.split(r"\s{2,}", line.strip())
      rows.append((name, [f.strip() for f in functions.split(",")]))
  return rows


def test_the_documented_walk_of_sigma_is_the_one_a_run_takes(teacher_dir, tmp_path):
  walk = _Walk()
  sys.setprofile(walk)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      dpdfd_cli.main(["--dataset=digits", f"--teacher_dirs={teacher_dir}",
                      f"--workdir={tmp_path / 'run'}", f"--noise_multiplier={SIGMA_TEXT}",
                      "--steps=2", "--eval_every=2", "--batch_size=16",
                      "--student_model=lenet5_half", "--latent_dim=8", "--generator_channels=8",
                      "--no_progress"])
  finally:
    sys.setprofile(None)
  measured = walk.crossings()
  assert measured == _documented()
  assert measured[-1] == ("dpkd_jax/privacy/mechanisms.py", ["multi_teacher_output_gradients"])
  assert ("dpkd_jax/privacy/ledger.py", ["record"]) in measured


@pytest.mark.parametrize("value, held", [(SIGMA, True), (SIGMA + 1, False),
                                         (f"--noise_multiplier={SIGMA_TEXT}", True),
                                         ([f"--x={SIGMA_TEXT}"], True), ({"a": 1.0}, False)])
def test_what_holds_sigma(value, held):
  assert _holds_sigma(value) is held
