"""Every PyTorch import is checked against the source model: a network whose arrays have
small_cnn's shapes but which computes something else (SiLU, adaptive average pooling, dropout)
is refused with one line and nothing written; the runnable formats (torch.export program,
TorchScript, a state_dict with the code that builds it) import with the measured difference on
the card (torchvision's ResNet-18 too); a bare state_dict imports only with
--unverified_state_dict. Skipped without PyTorch."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

# pylint: disable=wrong-import-position
from dpkd_jax import data
from dpkd_jax.importers import common
from dpkd_jax.importers import torch as torch_importer
from dpkd_jax.importers import verify
from experiments import teacher as teacher_cli
from torch_fixtures import randomise_batch_norms
from torch_fixtures import small_cnn_lookalike
from torch_fixtures import small_cnn_twin

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def _save(model, folder, kind):
  """`model` saved as `kind` in `folder`, under the file name PyTorch expects for it."""
  path = folder / {"export": "m.pt2", "torchscript": "m.ts.pt", "state_dict": "m.pt"}[kind]
  model = model.eval()
  if kind == "export":
    torch.export.save(torch.export.export(model, (torch.zeros(4, 1, 28, 28),)), path)
  elif kind == "torchscript":
    torch.jit.script(model).save(path)
  else:
    torch.save(model.state_dict(), path)
  return str(path)


def _import(checkpoint, workdir, *flags):
  teacher_cli.main(["import", "--from=torch", "--arch=small_cnn", "--dataset=digits",
                    f"--checkpoint={checkpoint}", "--input_norm=half", f"--workdir={workdir}",
                    *flags])
  with open(os.path.join(workdir, "card.json")) as f:
    return json.load(f)["import"]


def _refusal(capsys, checkpoint, workdir, *flags):
  with pytest.raises(SystemExit) as exit_info:
    _import(checkpoint, workdir, *flags)
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
  assert not os.path.exists(workdir)
  return err


@pytest.mark.parametrize("kind", ["export", "torchscript"])
def test_a_lookalike_is_refused_naming_the_difference(kind, tmp_path, capsys):
  torch.manual_seed(0)
  path = _save(small_cnn_lookalike(), tmp_path, kind)
  err = _refusal(capsys, path, str(tmp_path / "w"))
  assert "does not compute what the" in err and "largest relative logit difference" in err
  assert "no counterpart for: SiLU, AdaptiveAvgPool2d" in err


def test_a_lookalike_state_dict_is_refused_unless_unverified(tmp_path, capsys):
  torch.manual_seed(0)
  path = _save(small_cnn_lookalike(), tmp_path, "state_dict")
  err = _refusal(capsys, path, str(tmp_path / "w"))
  assert "is a bare state_dict" in err and "--unverified_state_dict" in err
  err = _refusal(capsys, path, str(tmp_path / "w"), "--torch_module=torch_fixtures:"
                 "small_cnn_lookalike")  # with its code it can be run, and so refused
  assert "module built by torch_fixtures:small_cnn_lookalike" in err and "SiLU" in err
  check = _import(path, str(tmp_path / "w"), "--unverified_state_dict")["check"]
  assert check["verified"] is False and "not checked" in check["reason"]


@pytest.mark.parametrize("kind, flags", [
    ("export", []), ("torchscript", []),
    ("state_dict", ["--torch_module=torch_fixtures:small_cnn_twin",
                    '--torch_module_kwargs={"batch_norm": true}'])],
    ids=["export", "torchscript", "torch_module"])
def test_a_twin_imports_with_the_difference_on_its_card(kind, flags, tmp_path, capsys):
  torch.manual_seed(1)
  path = _save(randomise_batch_norms(small_cnn_twin(batch_norm=True)), tmp_path, kind)
  check = _import(path, str(tmp_path / "w"), *flags)["check"]
  assert check["verified"] and check["max_relative_logit_difference"] < 1e-5
  assert check["argmax_agreement"] == 1.0 and check["tolerance"] == 1e-4
  assert "logits within" in capsys.readouterr().out


def test_torch_module_errors_are_one_line(tmp_path, capsys):
  path = _save(small_cnn_twin(batch_norm=False), tmp_path, "state_dict")
  err = _refusal(capsys, path, str(tmp_path / "w"), "--torch_module=torch_fixtures:nope")
  assert "--torch_module: cannot build torch_fixtures:nope" in err
  err = _refusal(capsys, path, str(tmp_path / "w"), "--torch_module=torch_fixtures:small_cnn_twin",
                 '--torch_module_kwargs={"batch_norm": true}')
  assert "does not fit torch_fixtures:small_cnn_twin" in err
  err = _refusal(capsys, path, str(tmp_path / "w"), "--torch_module_kwargs=[1]")
  assert "expected a JSON object" in err


def test_a_torchvision_program_imports_and_checks(tv_models, tmp_path):
  """torchvision's ResNet-18 saved as a torch.export program: names mapped, then checked."""
  info = data.DATASETS["cifar10"]
  torch.manual_seed(0)
  model = randomise_batch_norms(tv_models.resnet18(num_classes=10))
  torch.export.save(torch.export.export(model, (torch.zeros(2, 3, 32, 32),)), tmp_path / "r.pt2")
  converted = torch_importer.convert(str(tmp_path / "r.pt2"), "resnet18", info)
  assert converted.reference.kind == "torch.export program"
  assert converted.reference.unrepresented == ()
  parts = common.assemble(converted, info)
  pixels = verify.check_pixels(np.zeros((0, 32, 32, 3), np.uint8), info)[:5]  # batch 2: chunks
  measured = verify.compare(converted.reference, parts, pixels, info, info.mean, info.std)
  assert measured["max_relative_logit_difference"] < 1e-5 and measured["argmax_agreement"] == 1.0
