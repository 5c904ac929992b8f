"""`import_teacher`: a PyTorch or Keras file -> a teacher workdir that `teacher.load_teacher`
reads like a trained one (checkpoints/ + card.json).

Sections: checks -> convert -> input normalisation -> assemble -> check against the source
model (`verify.py`) -> evaluate and save. The
teacher is not private (one record may change it arbitrarily) and neither is its test
accuracy, a diagnostic as for trained teachers. Where the teacher's training data came from is
unknown, so its card records no partition: several imported teachers count as all reachable
by one record (`teacher_partition.teachers_per_record`'s worst case).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.importers import common
from dpkd_jax.importers import graph_keras
from dpkd_jax.importers import graph_torch
from dpkd_jax.importers import torch_source
from dpkd_jax.importers import verify
from dpkd_jax.models import adapter as adapter_lib
from dpkd_jax.models import graph as graph_lib
from dpkd_jax.train import checkpoint as checkpoint_lib
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState

FRAMEWORKS = {"torch": "PyTorch", "keras": "Keras 3"}
UNVERIFIED_STATE_DICT = ("a bare state_dict holds no forward function: the activations, pooling, "
                         "padding and dropout of the source were assumed to be the zoo model's, "
                         "not checked")


def _converter(framework: str):
  """The converter module of `framework`, with its framework importable (else one line)."""
  if framework not in FRAMEWORKS:
    raise errors.UserError(f"--from: unknown {framework!r}; choose one of {sorted(FRAMEWORKS)}")
  if framework == "keras":  # Keras 3 on JAX: no TensorFlow needed (an explicit choice stays)
    os.environ.setdefault("KERAS_BACKEND", "jax")
  try:
    importlib.import_module(framework)
  except ImportError as error:
    raise errors.UserError(f"--from={framework} needs {FRAMEWORKS[framework]}, which is not "
                           f"installed ({error}); pip install 'dpkd-jax[import]'") from error
  return importlib.import_module(f"dpkd_jax.importers.{framework}")


def _convert(module: Any, framework: str, checkpoint: str, arch: str, info: data.DatasetInfo,
             builder: str | None, builder_kwargs: dict[str, Any] | None) -> common.Converted:
  """The converter's result: a twin of the zoo (`module`), or with `arch` "graph" the
  source's graph of operations (`graph_torch`, `graph_keras`)."""
  if arch != graph_lib.MODEL:
    return (module.convert(checkpoint, arch, info) if builder is None else
            module.convert(checkpoint, arch, info, builder=builder,
                           builder_kwargs=builder_kwargs))
  if framework == "keras":
    return graph_keras.convert(checkpoint, info)
  height, width, channels = info.image_shape
  program, reference = torch_source.exported_program(
      checkpoint, chw=(channels, height, width), builder=builder, builder_kwargs=builder_kwargs)
  return graph_torch.convert(program, reference)


def _check_paths(checkpoint: str, workdir: str) -> None:
  if not os.path.isfile(checkpoint):
    raise errors.UserError(f"--checkpoint: {checkpoint!r} does not exist or is not a file")
  if os.path.exists(os.path.join(workdir, "card.json")):
    raise errors.UserError(f"--workdir: {workdir!r} already holds a teacher (card.json); give "
                           "a fresh directory")


def input_affine(info: data.DatasetInfo, mean: Sequence[float], std: Sequence[float],
                 rescale: tuple[np.ndarray, np.ndarray] | None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
  """(scale, shift) taking dataset-normalised inputs to what the teacher's first layer sees,
  or None when that is the identity (no adapter: the teacher is then a plain zoo model).

  `rescale` = (a, b): a source layer `a · x + b` on the teacher's input (Keras `Rescaling`),
  composed after the teacher's own normalisation.
  """
  scale, shift = adapter_lib.affine_for(info.mean, info.std, mean, std)
  if rescale is not None:
    a, b = (np.broadcast_to(np.asarray(v, np.float32), scale.shape) for v in rescale)
    scale, shift = a * scale, a * shift + b
  if np.all(scale == 1.0) and np.all(shift == 0.0):
    return None
  return scale, shift


def _provenance(framework: str, arch: str, checkpoint: str, converted: common.Converted,
                info: data.DatasetInfo, norm: tuple[str, Sequence[float], Sequence[float]],
                version: str, check: dict[str, Any]) -> dict[str, Any]:
  preset, mean, std = norm
  return {
      "framework": framework,
      "framework_version": version,
      "arch": arch,
      "model": converted.model,
      "source_file": os.path.abspath(checkpoint),
      "source_sha256": checkpoint_lib.sha256_file(checkpoint),
      "input_normalization": {"preset": preset, "teacher_mean": list(mean),
                              "teacher_std": list(std), "dataset_mean": list(info.mean),
                              "dataset_std": list(info.std)},
      "notes": list(converted.notes),
      "check": check,
      "dpkd_jax_version": dpkd_jax.__version__,
  }


def _unknown_split() -> dict[str, Any]:
  """The card's `split`: nothing is known of the data an imported teacher saw."""
  return {"num_shards": 1, "shard": 0, "shard_seed": None, "num_train_examples": None,
          "source_split": None, "num_source_examples": None, "source_sha256": None}


@workdir_lib.run_scope
def import_teacher(*, framework: str, arch: str, checkpoint: str, dataset: str, workdir: str,
                   input_norm: str, input_mean: Sequence[float] | None = None,
                   input_std: Sequence[float] | None = None, data_dir: str | None = None,
                   download: bool = False, torch_module: str | None = None,
                   torch_module_kwargs: dict[str, Any] | None = None,
                   unverified_state_dict: bool = False,
                   tolerance: float = verify.TOLERANCE) -> dict[str, Any]:
  """Converts `checkpoint` into the zoo and writes a teacher workdir (checkpoint + card).

  Args:
    framework: "torch" (a torch.export program, TorchScript or state_dict file) or "keras"
      (a Keras 3 `.keras` file).
    arch: the source architecture (`importers.torch.ARCHS`, `importers.keras.ARCHS`), or
      "graph": any classifier whose operations `models.graph` covers, run as its graph.
    checkpoint: the source file.
    dataset: a name in `data.DATASETS`: the classes and input shape the teacher must have, and
      the test split of its accuracy.
    workdir: the new teacher directory.
    input_norm: what the teacher expects as input, a preset of `common.INPUT_NORMS`
      ("dataset", "imagenet", "unit", "half", "raw") or "custom" with `input_mean` and
      `input_std`; the teacher gets an `InputAdapter` unless it is the dataset's own.
    data_dir, download: where the test split comes from (as for `TeacherConfig`).
    torch_module, torch_module_kwargs: for a state_dict, "package.module:callable" and its
      keyword arguments building the module it loads into, so that the import can be checked.
    unverified_state_dict: import a bare state_dict unchecked (the card says so).
    tolerance: the largest relative logit difference to the source model accepted.

  Returns:
    The card (also `<workdir>/card.json`), with `import` (provenance) and `input_adapter`.

  Raises:
    errors.UserError: one line for every expected mistake (unknown arch or dataset, missing
      framework, unreadable file, unsupported layer, shapes that do not fit the dataset, logits
      that differ from the source model's, a bare state_dict without `unverified_state_dict`).
  """
  # 1. Checks, before any compute.
  if dataset not in data.DATASETS:
    raise errors.UserError(f"--dataset: unknown {dataset!r}; choose one of {sorted(data.DATASETS)}")
  info = data.DATASETS[dataset]
  _check_paths(checkpoint, workdir)
  if not tolerance > 0:
    raise errors.UserError(f"--tolerance must be positive, got {tolerance}")
  norm = common.input_norm(input_norm, info, input_mean, input_std)
  module = _converter(framework)
  if torch_module is not None and framework != "torch":
    raise errors.UserError("--torch_module is for --from=torch state_dict files")
  # 2. Convert, 3. normalisation, 4. assemble (every shape checked).
  converted = _convert(module, framework, checkpoint, arch, info, torch_module,
                       torch_module_kwargs)
  if converted.reference is None and not unverified_state_dict:
    raise errors.UserError(
        f"--checkpoint: {checkpoint!r} is a bare state_dict: it holds arrays but no forward "
        "function, so whether the imported model computes what yours does (activations, "
        "pooling, padding, dropout) cannot be verified; save a runnable model (torch.export."
        "save or TorchScript), or name its code with --torch_module=package.module:callable, or "
        "import it unchecked with --unverified_state_dict")
  affine = input_affine(info, *norm, converted.rescale)
  parts = common.assemble(converted, info, affine)
  test = data.load(dataset, "test", data_dir=data_dir, download=download)
  # 4b. The source model and the imported one agree on the same inputs, or nothing is written.
  check = verify.check(converted.reference, parts, test.images, info, norm, model=converted.model,
                       tolerance=tolerance, unverified=UNVERIFIED_STATE_DICT)
  # 5. Evaluate and save, in the layout of `teacher.train_teacher` (SGD: the smallest
  # optimizer state that `load_teacher`'s template restores; it is never used).
  config = teacher_lib.TeacherConfig(dataset=dataset, model=converted.model,
                                     norm=converted.norm, optimizer="sgd", data_dir=data_dir,
                                     download=download)
  config_json = dataclasses.asdict(config)
  run = workdir_lib.open_run(workdir, kind="teacher import", config=config_json, resume=False,
                             resumable=False)
  state = TrainState.create(parts, teacher_lib.make_optimizer(config, 1))
  provenance = _provenance(framework, arch, checkpoint, converted, info,
                           (input_norm, *norm), module.framework_version(), check)
  run.save(0, state.arrays(), {"epoch": 0, "config": config_json, "import": provenance})
  card = teacher_lib.make_card(config, state, test, split=_unknown_split(), seconds=(0.0, 0.0))
  card.update({"import": provenance, "input_adapter": affine is not None})
  if converted.program is not None:  # read back, read-only, by `teacher.load_teacher`
    card["graph"] = graph_lib.write_program(workdir, converted.program)
  teacher_lib.write_card(workdir, card)
  return card
