"""The student as files other runtimes load: ONNX (jax2onnx) and `jax.export` StableHLO.

Both take the student's evaluation-mode forward pass `logits_fn(parts)`:
images (batch, H, W, C) float32, normalised `(pixels / 255 - mean) / std` per channel, NHWC ->
logits (batch, num_classes) float32. The batch dimension is symbolic in both files ("batch").

* ONNX: `jax2onnx.to_onnx` (opset 23), input "images", output "logits"; run by onnxruntime.
  jax2onnx 0.17.1's "remove_redundant_transpose_pairs" pass mis-orders the layouts of a
  residual addition after BatchNorm (ResNet-18 with norm "batch": onnxruntime refuses the
  graph). A file that onnxruntime refuses, or whose outputs differ, is converted once more
  without that pass, and the file's `converter` entry says so.
* StableHLO: `jax.export.export(jax.jit(fn), platforms=("cpu", "cuda", "tpu"))`, lowered
  without source locations (no path of the exporting machine in the file), serialized
  (`Exported.serialize`); `jax.export.deserialize(data).call(images)` runs it.

Every file is checked before it is kept: its outputs on test inputs (`verification_inputs`)
against jitted JAX, relative to the largest reference logit (`compare`); above `TOLERANCE`
the export fails with one line. onnx, onnxruntime and jax2onnx are imported here only.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.models import core

TOLERANCE = 1e-4  # max |exported - JAX| / max |JAX| over the test inputs
FORMATS = ("onnx", "stablehlo")
SUFFIX = {"onnx": ".onnx", "stablehlo": ".stablehlo"}
ONNX_OPSET = 23
STABLEHLO_PLATFORMS = ("cpu", "cuda", "tpu")
INPUT_NAME, OUTPUT_NAME = "images", "logits"
_FRAGILE_PASS = "remove_redundant_transpose_pairs"
INSTALL_HINT = ("pip install -e '.[export]' && pip install --no-deps jax2onnx==0.17.1 (setup.cfg: "
                "jax2onnx pins an older orbax-checkpoint than dpkd-jax needs, and never imports "
                "it), or use --format=stablehlo")


class ExportError(errors.UserError):
  """An exported file that cannot be written, loaded, or does not match JAX."""


def logits_fn(parts: core.ModelParts) -> Callable[[jax.Array], jax.Array]:
  """images (B, H, W, C) normalised float32 -> logits (B, K), evaluation mode."""

  def fn(images: jax.Array) -> jax.Array:
    out, _ = core.apply(parts.graphdef, parts.params, parts.batch_stats, images, train=False)
    return out.logits

  return fn


def pattern_images(info: data.DatasetInfo, num: int) -> np.ndarray:
  """`num` deterministic (num, H, W, C) normalised images (waves, no random draw), spread
  over a wider range than real images, to exercise the file off the data too."""
  b, i, j, c = np.meshgrid(np.arange(num), *(np.arange(d) for d in info.image_shape),
                           indexing="ij")
  return (2.5 * np.sin(0.37 * (b + 1) * (i + 1) + 0.61 * j + 1.3 * c)).astype(np.float32)


def verification_inputs(info: data.DatasetInfo, *, data_dir: str | None = None,
                        num_test: int = 64, num_pattern: int = 8) -> tuple[np.ndarray, str]:
  """(images, what they are): the first `num_test` images of the public test split
  (normalised) when it can be read, and `num_pattern` deterministic pattern images."""
  pattern = pattern_images(info, num_pattern)
  try:
    test = data.load(info.name, "test", data_dir=data_dir)
  except (data.DataNotFoundError, OSError, ValueError):
    return pattern, f"{num_pattern} deterministic pattern images (test split not found)"
  images = np.asarray(data.normalize(test.images[:num_test], info), np.float32)
  return (np.concatenate([images, pattern]),
          f"{len(images)} {info.name} test images + {num_pattern} deterministic pattern images")


def compare(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
  """Max abs diff, max diff relative to max |reference|, argmax agreement, within TOLERANCE."""
  reference, candidate = np.asarray(reference, np.float64), np.asarray(candidate, np.float64)
  if reference.shape != candidate.shape:
    return {"ok": False, "why": f"shape {candidate.shape} != JAX's {reference.shape}"}
  max_abs = float(np.max(np.abs(reference - candidate)))
  max_rel = max_abs / max(float(np.max(np.abs(reference))), np.finfo(np.float32).tiny)
  agree = float(np.mean(reference.argmax(-1) == candidate.argmax(-1)))
  return {"ok": bool(max_rel <= TOLERANCE), "max_abs_diff": max_abs, "max_rel_diff": max_rel,
          "argmax_agreement": agree, "tolerance_rel": TOLERANCE, "num_inputs": len(reference)}


def _require(module: str) -> Any:
  try:
    return importlib.import_module(module)
  except ImportError as error:
    raise ExportError(f"--format=onnx needs {module}, which is not installed: "
                      f"{INSTALL_HINT}") from error


@contextlib.contextmanager
def _without_pass(name: str | None) -> Iterator[bool]:
  """jax2onnx's graph optimisation without the pass `name` (None: unchanged); yields whether
  that pass was found (a private table of jax2onnx: absent in other versions)."""
  if name is None:
    yield True
    return
  module = importlib.import_module("jax2onnx.converter.ir_optimizations")
  passes = getattr(module, "_OPTIMIZER_PASSES", None)
  kept = tuple(p for p in passes or () if getattr(p, "name", None) != name)
  if passes is None or len(kept) == len(passes):
    yield False
    return
  module._OPTIMIZER_PASSES = kept
  try:
    yield True
  finally:
    module._OPTIMIZER_PASSES = passes


def onnx_session(path: str) -> Any:
  """An onnxruntime CPU session of the file at `path` (warnings silenced)."""
  ort = _require("onnxruntime")
  options = ort.SessionOptions()
  options.log_severity_level = 3  # errors only: shape-merge warnings are not ours to fix
  return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def _convert_onnx(fn: Callable, info: data.DatasetInfo, path: str, skip: str | None) -> bool:
  """Writes the ONNX file of `fn`; False if the pass to skip is not in this jax2onnx."""
  to_onnx = _require("jax2onnx").to_onnx
  _require("onnx")
  quiet = logging.getLogger("onnx_ir")
  level = quiet.level
  quiet.setLevel(logging.ERROR)  # "value type ... not known" for every constant shape
  try:
    with _without_pass(skip) as found:
      if not found:
        return False
      try:
        proto = to_onnx(fn, [("batch", *info.image_shape)], model_name="dpkd_student",
                        opset=ONNX_OPSET, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME])
      except NotImplementedError as error:  # an op jax2onnx cannot lower (e.g. 2-D FFTs)
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ExportError(f"ONNX: jax2onnx cannot convert this student ({first_line}); use "
                          "--format=stablehlo") from None
  finally:
    quiet.setLevel(level)
  with open(path, "wb") as f:
    f.write(proto.SerializeToString())
  return True


def _run_onnx(path: str, images: np.ndarray) -> np.ndarray:
  session = onnx_session(path)
  return session.run([OUTPUT_NAME], {INPUT_NAME: images})[0]


def export_onnx(parts: core.ModelParts, info: data.DatasetInfo, path: str, images: np.ndarray,
                reference: np.ndarray) -> dict[str, Any]:
  """Writes `path` (ONNX) and checks onnxruntime's logits on `images` against `reference`.

  Returns:
    {"format", "file", "converter", "check"}.

  Raises:
    ExportError: jax2onnx missing, or no conversion that onnxruntime runs within TOLERANCE.
  """
  _require("jax2onnx")
  version = importlib.metadata.version("jax2onnx")
  problems = []
  for skip in (None, _FRAGILE_PASS):
    if not _convert_onnx(logits_fn(parts), info, path, skip):
      continue
    try:
      check = compare(reference, _run_onnx(path, images))
    except Exception as error:  # pylint: disable=broad-except
      # onnxruntime reports a malformed graph as its own Fail / InvalidGraph exceptions.
      check = {"ok": False, "why": f"onnxruntime refused it ({type(error).__name__})"}
    if check["ok"]:
      converter = f"jax2onnx {version}, opset {ONNX_OPSET}"
      if skip:
        converter += f", without its {skip!r} pass ({problems[-1]} with it)"
      return {"format": "onnx", "file": os.path.basename(path), "converter": converter,
              "check": check}
    problems.append(check.get("why") or f"relative difference {check['max_rel_diff']:.2e}")
  if os.path.exists(path):
    os.remove(path)  # never leave a file that did not pass its check
  raise ExportError(f"--format=onnx: the ONNX file of this student does not match JAX "
                    f"({'; '.join(problems)}); use --format=stablehlo")


@contextlib.contextmanager
def _no_source_locations() -> Iterator[None]:
  """Lowering without Python source locations: the file then names no path of the machine
  that exported it, and the same student gives the same bytes wherever it is exported."""
  names = {"jax_traceback_in_locations_limit": 0,
           "jax_hlo_source_file_canonicalization_regex": ".*"}  # file names -> ""
  saved = {name: getattr(jax.config, name) for name in names}
  try:
    for name, value in names.items():
      jax.config.update(name, value)
    yield
  finally:
    for name, value in saved.items():
      jax.config.update(name, value)


def export_stablehlo(parts: core.ModelParts, info: data.DatasetInfo, path: str,
                     images: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
  """Writes `path` (serialized `jax.export.Exported`, symbolic batch) and checks its
  deserialized module's logits on `images` against `reference`.

  Returns:
    {"format", "file", "converter", "check"}.
  """
  batch, = jax.export.symbolic_shape("batch")
  spec = jax.ShapeDtypeStruct((batch, *info.image_shape), jnp.float32)
  with _no_source_locations():
    exported = jax.export.export(jax.jit(logits_fn(parts)),
                                 platforms=STABLEHLO_PLATFORMS)(spec)
  with open(path, "wb") as f:
    f.write(exported.serialize())
  check = compare(reference, np.asarray(load_stablehlo(path).call(images)))
  if not check["ok"]:
    os.remove(path)
    raise ExportError(f"--format=stablehlo: the deserialized module differs from JAX "
                      f"({check.get('why') or check['max_rel_diff']})")
  return {"format": "stablehlo", "file": os.path.basename(path),
          "converter": f"jax.export (jax {jax.__version__}), calling convention "
                       f"{exported.calling_convention_version}, platforms "
                       f"{', '.join(exported.platforms)}",
          "check": check}


def load_stablehlo(path: str) -> jax.export.Exported:
  """The `jax.export.Exported` serialized in `path`."""
  with open(path, "rb") as f:
    return jax.export.deserialize(bytearray(f.read()))
