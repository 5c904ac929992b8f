"""The release bundle of a finished run: exported student, checks, latency and model card.

`export_run(workdir, out_dir, formats=("onnx", "stablehlo"))` loads the run's student
(`students.load_student`: refuses, in one line, a run without a classifier student), writes
`<out_dir>/student.onnx` and/or `<out_dir>/student.stablehlo`, checks each against jitted JAX on
the public test images (`export.verification_inputs`), optionally measures CPU latency
(`latency.measure`), and writes model_card.md / model_card.json into `out_dir` with each
file's sha256. Releasing the student is post-processing of the run's noisy releases: the files
carry the (ε, δ) of the releases charged up to the exported checkpoint, never less than its
ledger holds (`students.covered_epsilon`; a checkpoint newer than the run's results is refused),
and nothing more (the card says what that does not cover).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Sequence

import jax
import numpy as np

from dpkd_jax import errors, kernels
from dpkd_jax.release import export
from dpkd_jax.release import latency
from dpkd_jax.release import model_card
from dpkd_jax.release import students
from dpkd_jax.train import checkpoint

STEM = "student"


def check_formats(formats: Sequence[str]) -> tuple[str, ...]:
  """The formats asked for, in order, without repeats; one line for an unknown one."""
  unknown = [f for f in formats if f not in export.FORMATS]
  if unknown or not formats:
    raise errors.UserError(f"--format: unknown format {', '.join(unknown) or '(none)'}; give "
                           f"one or more of {', '.join(export.FORMATS)} (comma-separated)")
  return tuple(dict.fromkeys(formats))


def _data_dir(workdir: str) -> str | None:
  """The run's --data_dir (for its test images), if its results.json names one."""
  _, results = students.check_run(workdir)
  config = results.get("config")
  value = config.get("data_dir") if isinstance(config, dict) else None
  return value if isinstance(value, str) else None


@contextlib.contextmanager
def _removed_on_failure(paths: list[str]) -> Iterator[None]:
  """Deletes `paths` (the files this export writes) if the block fails: an export that did not
  finish leaves no file that could pass for a checked one."""
  try:
    yield
  except BaseException:
    for path in paths:
      if os.path.exists(path):
        os.remove(path)
    raise


def export_run(workdir: str, out_dir: str, formats: Sequence[str] = export.FORMATS, *,
               measure_latency: bool = True, repeats: int = 5) -> dict[str, Any]:
  """Exports the student of the finished run in `workdir` into `out_dir` (module docstring).

  Returns:
    {"exports": [...], "measured": ... or None, "card": (md path, json path),
    "inputs": what the checks ran on}.

  Raises:
    UserError: an unknown format, a run without a student, or an export that fails its check
      (`export.ExportError`); `checkpoint.CheckpointMismatchError` for a student that does not
      fit its config.
  """
  formats = check_formats(formats)
  student = students.load_student(workdir)
  epsilon = students.covered_epsilon(workdir, student.meta, student.step)
  info = student.spec.info
  images, described = export.verification_inputs(info, data_dir=_data_dir(workdir))
  os.makedirs(out_dir, exist_ok=True)
  paths = {fmt: os.path.join(out_dir, STEM + export.SUFFIX[fmt]) for fmt in formats}
  # The reference ops (plain jax.lax/Flax) whatever kernels this process chose: the files are
  # for other machines and runtimes, and only those ops trace with a symbolic batch.
  with kernels.using(kernels.REFERENCE), _removed_on_failure(list(paths.values())):
    reference = np.asarray(jax.jit(export.logits_fn(student.parts))(images))
    writers = {"onnx": export.export_onnx, "stablehlo": export.export_stablehlo}
    exports = []
    for fmt in formats:
      entry = writers[fmt](student.parts, info, paths[fmt], images, reference)
      entry["check"]["inputs"] = described
      entry.update(sha256=checkpoint.sha256_file(paths[fmt]),
                   bytes=os.path.getsize(paths[fmt]), checkpoint_step=student.step)
      exports.append(entry)
    measured = None
    if measure_latency:
      measured = latency.measure(student.parts, info, onnx_path=paths.get("onnx"),
                                 stablehlo_path=paths.get("stablehlo"), repeats=repeats)
  card = model_card.write_model_card(workdir, out_dir=out_dir, exports=exports,
                                     measured=measured,
                                     checkpoint={"step": student.step, "epsilon": epsilon})
  return {"exports": exports, "measured": measured, "card": card, "inputs": described}
