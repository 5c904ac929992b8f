"""Fixtures of the PyTorch tests (registered in conftest.py): torchvision's model definitions
and non-trivial eval-mode BatchNorm. Imports torch lazily, so collecting them needs no torch."""

import importlib
import importlib.util
import sys
import types

import pytest


@pytest.fixture(scope="module")
def tv_models():
  """torchvision.models; if torchvision fails to import, its pure-Python model definitions.

  PyPI's torchvision is built against CUDA PyTorch: beside the CPU PyTorch wheel its compiled
  ops fail to register (`operator torchvision::nms does not exist`) when `torchvision` is
  imported. The model definitions need none of them, so they are loaded under a bare package
  (no `torchvision/__init__.py`); sys.modules is restored afterwards.
  """
  saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "torchvision"}
  try:
    yield importlib.import_module("torchvision").models
    return
  except (ImportError, RuntimeError):
    pass
  for name in [k for k in sys.modules if k.split(".")[0] == "torchvision"]:
    del sys.modules[name]
  spec = importlib.util.find_spec("torchvision")
  if spec is None:
    pytest.skip("torchvision is not installed")
  package = types.ModuleType("torchvision")
  package.__path__ = list(spec.submodule_search_locations)
  sys.modules["torchvision"] = package
  try:
    yield importlib.import_module("torchvision.models")
  finally:
    for name in [k for k in sys.modules if k.split(".")[0] == "torchvision"]:
      del sys.modules[name]
    sys.modules.update(saved)


def randomise_batch_norms(model, seed=0):
  """Non-trivial eval-mode BatchNorm: random running stats and affine parameters."""
  import torch  # pylint: disable=g-import-not-at-top
  nn = torch.nn
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for module in model.modules():
      if isinstance(module, nn.BatchNorm2d):
        n = module.num_features
        module.running_mean.copy_(torch.rand(n, generator=generator) - 0.5)
        module.running_var.copy_(torch.rand(n, generator=generator) * 1.5 + 0.5)
        module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
        module.bias.copy_(torch.rand(n, generator=generator) * 0.6 - 0.3)
  return model.eval()


def small_cnn_twin(batch_norm=False, channels=1, side=28, num_classes=10):
  """The PyTorch twin of classifiers.SmallCNN (importable: --torch_module=torch_fixtures:...)."""
  import torch  # pylint: disable=g-import-not-at-top
  nn = torch.nn
  norm = (lambda c: [nn.BatchNorm2d(c)]) if batch_norm else (lambda c: [])
  return nn.Sequential(
      nn.Conv2d(channels, 32, 3, padding=1), *norm(32), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(32, 64, 3, padding=1), *norm(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
      nn.Linear((side // 4) ** 2 * 64, 128), nn.ReLU(), nn.Linear(128, num_classes)).eval()


def small_cnn_lookalike():
  """A digits network whose arrays have small_cnn's shapes but which computes something else:
  SiLU instead of ReLU, adaptive average pooling to 7x7 instead of two max-pools, dropout."""
  import torch  # pylint: disable=g-import-not-at-top
  nn = torch.nn
  return nn.Sequential(
      nn.Conv2d(1, 32, 3, padding=1), nn.SiLU(), nn.Conv2d(32, 64, 3, padding=1), nn.SiLU(),
      nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Dropout(0.5), nn.Linear(7 * 7 * 64, 128),
      nn.SiLU(), nn.Linear(128, 10)).eval()
