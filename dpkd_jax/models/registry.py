"""Name → constructor tables for the model zoo, so configs and flags can name models.

An explicit dict keeps every model greppable and the set of valid names visible in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

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
  generator = create_generator(config.generator_model, latent_dim=config.latent_dim,
                               image_shape=info.image_shape, rngs=nnx.Rngs(g_key),
                               base_channels=config.generator_channels)
  return core.split(student), core.split(generator)


def generator_identity(config: Any, teacher_dir: str) -> dict[str, Any]:
  """What a generator pretrained against `teacher_dir` was trained for: the data-free methods
  reuse one (SRR's stages, DPDFD's `pretrained_generator_dir`) only when this matches.

  Args:
    config: a method config with `dataset`, `generator_model`, `generator_channels` and
      `latent_dim`.
    teacher_dir: the teacher's workdir (compared as an absolute path).
  """
  return {"dataset": config.dataset, "teacher_dir": os.path.abspath(teacher_dir),
          "generator_model": config.generator_model,
          "generator_channels": config.generator_channels, "latent_dim": config.latent_dim}
