"""A PyTorch file -> its state_dict as NumPy arrays and, where the file can run, a
`verify.Reference` that every import is checked against.

Recognised by content:

  torch.export program  (`torch.export.save(torch.export.export(model.eval(), (x,)), path)`)
  TorchScript           (`torch.jit.script(model.eval()).save(path)` or `torch.jit.trace`)
  state_dict            (`torch.save(model.state_dict(), path)`): arrays only, no forward
                        function; runnable when `builder` ("package.module:callable", the user's
                        own code building the model, e.g. "torchvision.models:resnet18" with
                        kwargs {"num_classes": 10}) makes the module the arrays load into.

A state_dict is read with `weights_only=True`: no pickled code runs; a builder runs the code the
user names. torch is imported only here, when a file is read.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import zipfile
from collections.abc import Iterable
from typing import Any

import numpy as np

from dpkd_jax import errors
from dpkd_jax.importers import verify

_WRAPPERS = ("state_dict", "model_state_dict", "model")  # common checkpoint-dict keys
# Leaf layer types each zoo family has a counterpart for (others are named in a refusal).
_TWIN_LAYERS = frozenset({"Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Flatten", "Linear",
                          "Dropout", "Identity"})
_TORCHVISION_LAYERS = _TWIN_LAYERS | {"AdaptiveAvgPool2d", "ReLU6"}
StateDict = "collections.OrderedDict[str, np.ndarray]"


def _first_line(error: Exception, lines: int = 1) -> str:
  text = " ".join(line.strip() for line in str(error).strip().splitlines()[:lines])
  return f"{type(error).__name__}: {text[:240]}"


def _arrays(loaded: dict[str, Any]) -> StateDict:
  """float32 NumPy arrays in the given order, without "module." and BatchNorm step counters."""
  import torch  # pylint: disable=import-outside-toplevel
  state = collections.OrderedDict()
  for key, value in loaded.items():
    key = key[len("module."):] if key.startswith("module.") else key
    if key.endswith("num_batches_tracked") or not isinstance(value, torch.Tensor):
      continue  # BatchNorm's step counter: not used in eval mode
    state[key] = value.detach().to(torch.float32).cpu().numpy()
  return state


def _state_dict_tensors(path: str) -> dict[str, Any]:
  import torch  # pylint: disable=import-outside-toplevel
  try:
    loaded = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as error:  # pylint: disable=broad-except
    raise errors.UserError(
        f"--checkpoint: {path!r} is not a PyTorch state_dict file readable with weights_only="
        f"True, a torch.export program or TorchScript ({_first_line(error)}); save it with "
        "torch.export.save or torch.save(model.state_dict(), path)") from error
  for key in _WRAPPERS:
    if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
      loaded = loaded[key]
      break
  if not isinstance(loaded, dict) or not loaded or not all(
      isinstance(v, torch.Tensor) for v in loaded.values()):
    raise errors.UserError(f"--checkpoint: {path!r} holds no state_dict of tensors; save it "
                           "with torch.save(model.state_dict(), path)")
  return loaded


def load_state_dict(path: str) -> StateDict:
  """The file's state_dict as float32 NumPy arrays, in saved order.

  Accepts `torch.save(model.state_dict())`, a dict holding it under "state_dict",
  "model_state_dict" or "model", and DataParallel's "module." prefixes.
  """
  return _arrays(_state_dict_tensors(path))


def _kind(path: str) -> str:
  try:
    with zipfile.ZipFile(path) as archive:
      names = archive.namelist()
  except (zipfile.BadZipFile, OSError):
    return "state_dict"
  if any(name.endswith("/archive_format") or name == "archive_format" for name in names):
    return "export"
  if any("/code/" in name for name in names):
    return "torchscript"
  return "state_dict"


def _unrepresented(leaf_types: Iterable[str], twin: bool) -> tuple[str, ...]:
  supported = _TWIN_LAYERS if twin else _TORCHVISION_LAYERS
  return tuple(dict.fromkeys(t for t in leaf_types if t not in supported))


def _torch_logits(forward, batch: int | None = None):
  """NHWC NumPy -> logits, in chunks of `batch` (a program exported for a fixed batch size)."""
  import torch  # pylint: disable=import-outside-toplevel

  def logits(x: np.ndarray) -> np.ndarray:
    step = batch or len(x)
    outs = []
    for start in range(0, len(x), step):
      chunk = x[start:start + step]
      pad = step - len(chunk)
      if pad:
        chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), chunk.dtype)])
      with torch.no_grad():
        out = forward(torch.from_numpy(np.ascontiguousarray(chunk.transpose(0, 3, 1, 2))))
      if isinstance(out, (tuple, list)):
        out = out[0]
      outs.append(out.detach().to(torch.float32).cpu().numpy()[:len(chunk) - pad])
    return np.concatenate(outs)
  return logits


def _exported(path: str, twin: bool, chw: tuple[int, ...], program: Any = None):
  import torch  # pylint: disable=import-outside-toplevel
  try:
    program = torch.export.load(path) if program is None else program
  except Exception as error:  # pylint: disable=broad-except
    raise errors.UserError(f"--checkpoint: {path!r} is not a readable torch.export program "
                           f"({_first_line(error)})") from error
  order, leaves, parents = {}, [], set()
  for node in program.graph.nodes:
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if node.op != "call_function" or not stack:
      continue
    order.setdefault(stack[-1][0], len(order))
    leaves.append(stack[-1][1].rsplit(".", 1)[-1])
    parents.update(t.rsplit(".", 1)[-1] for _, t in stack[:-1])
  keys = sorted(program.state_dict, key=lambda k: order.get(k.rpartition(".")[0], len(order)))
  state = _arrays({k: program.state_dict[k] for k in keys})
  batch = None
  for node in program.graph.nodes:
    if node.op == "placeholder" and node.name in program.graph_signature.user_inputs:
      shape = tuple(node.meta["val"].shape)
      if len(shape) != 4 or any(isinstance(d, int) and d != c for d, c in zip(shape[1:], chw)):
        raise errors.UserError(f"--checkpoint: the program takes inputs of shape {shape}, the "
                               f"dataset's are (N, {', '.join(map(str, chw))}) in NCHW")
      batch = shape[0] if isinstance(shape[0], int) else None
      break
  reference = verify.Reference(_torch_logits(program.module(), batch), "torch.export program",
                               _unrepresented([t for t in leaves if t not in parents], twin))
  return state, reference, program


def _torchscript(path: str, twin: bool):
  import torch  # pylint: disable=import-outside-toplevel
  try:
    module = torch.jit.load(path, map_location="cpu").eval()
  except Exception as error:  # pylint: disable=broad-except
    raise errors.UserError(f"--checkpoint: {path!r} is not a readable TorchScript file "
                           f"({_first_line(error)})") from error
  leaves = [m.original_name for _, m in module.named_modules() if not list(m.children())]
  return _arrays(module.state_dict()), verify.Reference(
      _torch_logits(module), "TorchScript model", _unrepresented(leaves, twin))


def _built(path: str, twin: bool, builder: str, kwargs: dict[str, Any]):
  model, tensors = _built_module(path, builder, kwargs)
  leaves = [type(m).__name__ for m in model.modules() if not list(m.children())]
  return _arrays(tensors), verify.Reference(_torch_logits(model), f"module built by {builder}",
                                            _unrepresented(leaves, twin))


def _built_module(path: str, builder: str, kwargs: dict[str, Any]):
  """(the eval-mode module `builder(**kwargs)` with the file's state_dict, the tensors)."""
  module_name, _, attribute = builder.partition(":")
  if not module_name or not attribute:
    raise errors.UserError(f"--torch_module: {builder!r} is not package.module:callable")
  try:
    build = getattr(importlib.import_module(module_name), attribute)
    model = build(**kwargs)
  except Exception as error:  # pylint: disable=broad-except
    hint = ("; torch and torchvision come from different indexes: docs/TEACHERS.md, "
            "Commands" if "torchvision::" in str(error) else "")
    raise errors.UserError(f"--torch_module: cannot build {builder}(**{kwargs}) "
                           f"({_first_line(error)}){hint}") from error
  tensors = {k[len("module."):] if k.startswith("module.") else k: v
             for k, v in _state_dict_tensors(path).items()}
  try:
    missing, unexpected = model.load_state_dict(tensors, strict=False)
  except Exception as error:  # pylint: disable=broad-except
    raise errors.UserError(f"--checkpoint: the state_dict does not fit {builder}(**{kwargs}) "
                           f"({_first_line(error, lines=2)})") from error
  missing = [k for k in missing if not k.endswith("num_batches_tracked")]
  if missing or unexpected:
    raise errors.UserError(f"--checkpoint: the state_dict does not fit {builder}(**{kwargs}): "
                           f"missing {missing[:3]}, unexpected {list(unexpected)[:3]}")
  return model.eval(), tensors


def load(path: str, *, twin: bool, chw: tuple[int, ...], builder: str | None = None,
         builder_kwargs: dict[str, Any] | None = None
         ) -> tuple[StateDict, verify.Reference | None]:
  """(state_dict as float32 NumPy arrays in forward order, the runnable source or None).

  Args:
    path: the file.
    twin: whether the file is imported as a twin of the zoo's own models (not torchvision's).
    chw: the dataset's input (channels, height, width).
    builder, builder_kwargs: for a state_dict file, the user's code that builds the module.
  """
  kind = _kind(path)
  if builder is not None and kind != "state_dict":
    raise errors.UserError(f"--torch_module builds the module a state_dict loads into; "
                           f"{path!r} is a {kind} file, which runs by itself: drop --torch_module")
  if kind == "export":
    return _exported(path, twin, chw)[:2]
  if kind == "torchscript":
    return _torchscript(path, twin)
  if builder is not None:
    return _built(path, twin, builder, dict(builder_kwargs or {}))
  return load_state_dict(path), None



def exported_program(path: str, *, chw: tuple[int, ...], builder: str | None = None,
                     builder_kwargs: dict[str, Any] | None = None):
  """(a `torch.export.ExportedProgram`, the runnable source) for the graph importer.

  A `.pt2` program is used as saved; a state_dict loaded into `builder`'s module is exported
  here on a batch of 2 zero images. TorchScript and a bare state_dict hold no program
  `torch.export` can give: refused with one line.
  """
  import torch  # pylint: disable=import-outside-toplevel
  kind = _kind(path)
  if builder is not None and kind != "state_dict":
    raise errors.UserError(f"--torch_module builds the module a state_dict loads into; "
                           f"{path!r} is a {kind} file, which runs by itself: drop --torch_module")
  if kind == "export":
    _, reference, program = _exported(path, False, chw)
    return program, dataclasses.replace(reference, unrepresented=())
  if builder is None:
    raise errors.UserError(
        f"--checkpoint: --arch=graph reads a torch.export program, and {path!r} is a {kind} "
        "file; save torch.export.save(torch.export.export(model.eval(), (x,)), 'teacher.pt2')"
        + (" or name its code with --torch_module" if kind == "state_dict" else ""))
  model, _ = _built_module(path, builder, dict(builder_kwargs or {}))
  try:
    program = torch.export.export(model, (torch.zeros((2, *chw)),))
  except Exception as error:  # pylint: disable=broad-except
    raise errors.UserError(f"--torch_module: torch.export cannot export {builder} "
                           f"({_first_line(error)})") from error
  return program, verify.Reference(_torch_logits(model), f"module built by {builder}")
