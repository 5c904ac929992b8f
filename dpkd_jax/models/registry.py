"""Name → constructor tables for the model zoo, so configs and flags can name models.

An explicit dict keeps every model greppable and the set of valid names visible in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from dpkd_jax import errors
from dpkd_jax.models import classifiers, core, generators, mobilenet, resnet, scatter_heads, tv

CLASSIFIERS: dict[str, Callable[..., nnx.Module]] = {
    "lenet5": classifiers.LeNet5,
    "lenet5_half": classifiers.LeNet5Half,
    "datalens_cnn": classifiers.DataLensCNN,
    "small_cnn": classifiers.SmallCNN,
    "vgg": classifiers.VGG,
    "mobilenet": mobilenet.MobileNet,
    "resnet18": resnet.ResNet18,
    "resnet34": resnet.ResNet34,
    "wide_resnet": resnet.WideResNet,
    # Heads for ScatterNet features (`representations.scatternet`; DP-SGD's --features).
    "scatter_linear": scatter_heads.ScatterLinear,
    "scatter_cnn": scatter_heads.ScatterCNN,
    # Exact torchvision twins, for imported teachers (`dpkd_jax.importers`, docs/TEACHERS.md).
    "tv_resnet18": tv.TVResNet18,
    "tv_resnet34": tv.TVResNet34,
    "tv_vgg11_bn": tv.TVVGG11BN,
    "tv_vgg16_bn": tv.TVVGG16BN,
    "tv_mobilenet_v2": tv.TVMobileNetV2,
}

GENERATORS: dict[str, Callable[..., nnx.Module]] = {
    "dafl": generators.DAFLGenerator,
}


def _lookup(table: Mapping[str, Callable[..., nnx.Module]], kind: str,
            name: str) -> Callable[..., nnx.Module]:
  if name not in table:
    raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(table)}")
  return table[name]


def create_classifier(name: str, *, num_classes: int, input_shape: Sequence[int],
                      norm: str = "batch", seed: int | None = None,
                      rngs: nnx.Rngs | None = None) -> nnx.Module:
  """Builds the classifier registered as `name`.

  Args:
    name: a key of `CLASSIFIERS`.
    num_classes: number of output classes.
    input_shape: (H, W, C) of one input image.
    norm: "batch", "group" or "none" (see `classifiers`).
    seed: integer seed of the parameter initialisation; give exactly one of `seed` and `rngs`.
    rngs: random streams for the initialisation, for callers that manage their own keys.

  Returns:
    The initialised `nnx.Module`; split it with `core.split` for jitted code.
  """
  constructor = _lookup(CLASSIFIERS, "classifier", name)
  if (seed is None) == (rngs is None):
    raise ValueError(f"give exactly one of seed and rngs, got seed={seed!r} and rngs={rngs!r}")
  if rngs is None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
      raise ValueError(f"seed must be an integer, got {seed!r}")
    rngs = nnx.Rngs(jax.random.key(int(seed)))
  return constructor(num_classes=num_classes, input_shape=input_shape, norm=norm, rngs=rngs)


def create_generator(name: str, *, latent_dim: int, image_shape: Sequence[int],
                     rngs: nnx.Rngs, **kwargs) -> nnx.Module:
  """Builds the generator registered as `name`.

  Args:
    name: a key of `GENERATORS`.
    latent_dim: size of the latent vector.
    image_shape: (H, W, C) of the generated images.
    rngs: random streams for the initialisation.
    **kwargs: architecture options of that generator (e.g. `base_channels` for "dafl").

  Returns:
    The initialised `nnx.Module`.
  """
  constructor = _lookup(GENERATORS, "generator", name)
  return constructor(latent_dim=latent_dim, image_shape=image_shape, rngs=rngs, **kwargs)


def create_student_and_generator(config: Any,
                                 key: jax.Array) -> tuple[core.ModelParts, core.ModelParts]:
  """The (student, generator) pair of the data-free methods (DPDFD, SRR), split into parts.

  Args:
    config: a method config with `info` (the dataset's `DatasetInfo`), `student_model`,
      `student_norm`, `generator_model`, `latent_dim` and `generator_channels`.
    key: split in two: fold 0 initialises the student, fold 1 the generator (the order every
      saved data-free run was initialised with).
  """
  s_key, g_key = jax.random.split(key)
  info = config.info
  student = create_classifier(config.student_model, num_classes=info.num_classes,
                              input_shape=info.image_shape, norm=config.student_norm,
                              rngs=nnx.Rngs(s_key))
  return core.split(student), create_data_free_generator(config, g_key)


def create_data_free_generator(config: Any, key: jax.Array) -> core.ModelParts:
  """The generator of `create_student_and_generator` alone, initialised from `key` (that
  function's fold 1)."""
  info = config.info
  return core.split(create_generator(config.generator_model, latent_dim=config.latent_dim,
                                     image_shape=info.image_shape, rngs=nnx.Rngs(key),
                                     base_channels=config.generator_channels))


def generator_identity(config: Any, teacher_sha256: str) -> dict[str, Any]:
  """What a generator pretrained against a teacher was trained for: the data-free methods
  reuse one (SRR's stages, DPDFD's `pretrained_generator_dir`) only when this matches.

  The teacher is named by the content of its weights, not by its directory: the same teacher
  copied or moved elsewhere is the same teacher, and a directory retrained in place is
  another one. The hash is all the identity keeps of the teacher (nothing private, e.g. no
  accuracy).

  Args:
    config: a method config with `dataset`, `generator_model`, `generator_channels` and
      `latent_dim`.
    teacher_sha256: `teacher.weights_sha256` of the loaded teacher (SHA-256 of its params and
      BatchNorm statistics).
  """
  return {"dataset": config.dataset, "teacher_sha256": teacher_sha256,
          "generator_model": config.generator_model,
          "generator_channels": config.generator_channels, "latent_dim": config.latent_dim}


def check_generator_identity(saved: Any, wanted: dict[str, Any], *, where: str,
                             teacher_dir: str) -> None:
  """Refuses a pretrained generator saved with identity `saved` for a run needing `wanted`.

  Args:
    saved: the identity in the generator's checkpoint metadata (anything: read from disk).
    wanted: `generator_identity` of this run.
    where: the generator's directory as the message should name it (e.g. with its flag).
    teacher_dir: this run's teacher directory, named when the weights differ.

  Raises:
    errors.UserError: one line saying why, and to pretrain again where that is the fix.
  """
  if saved == wanted:
    return
  again = "pretrain the generator again (`python -m experiments.srr pretrain`)"
  if not isinstance(saved, dict) or "teacher_sha256" not in saved:
    named = saved.get("teacher_dir") if isinstance(saved, dict) else None
    raise errors.UserError(
        f"{where} was pretrained before generators recorded their teacher's weights (it names "
        f"only the teacher directory {named!r}, which may have been retrained since); {again}")
  if saved["teacher_sha256"] != wanted["teacher_sha256"]:
    raise errors.UserError(
        f"{where} was pretrained against other teacher weights than {teacher_dir!r} holds "
        f"(another teacher, or this one retrained since); {again} against it")
  differ = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
  was = ", ".join(f"{k}={saved.get(k)!r}" for k in differ)
  now = ", ".join(f"{k}={wanted.get(k)!r}" for k in differ)
  raise errors.UserError(f"{where} was pretrained for {was}, this run needs {now}; use a "
                         "generator pretrained for this run or pretrain one")
