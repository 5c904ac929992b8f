"""dpkd_jax.importers.torch: randomly initialised PyTorch models (torchvision's and the twins of
lenet5 / small_cnn) give the same logits once imported, eval-mode BatchNorm included; clear
one-line errors; the CLI end to end, down to a DPDFD run. Skipped without PyTorch."""

import json
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

# pylint: disable=wrong-import-position
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.importers import common
from dpkd_jax.importers import torch as torch_importer
from dpkd_jax.importers import torch_source
from dpkd_jax.importers import verify
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train import evaluate
from torch_fixtures import randomise_batch_norms
from experiments import dpdfd as dpdfd_cli
from experiments import teacher as teacher_cli

RTOL = 1e-4  # max |ours - torch| / max |torch| over the logits
# One network per converter code path (`_resnet`, `_vgg`, `_mobilenet_v2`): resnet34 and vgg16_bn
# run the same converter loops as resnet18 and vgg11_bn with more blocks (resnet34's (3, 4, 6, 3)
# blocks, vgg16_bn's configuration "D"), and their JAX definitions' parameter counts are checked
# against torchvision's in test_tv.py; resnet34's layer names are checked by the "deeper" and
# "shallower" errors below. (vgg16_bn alone took eight seconds: 138M parameters saved and loaded.)
TORCHVISION = ["resnet18", pytest.param("vgg11_bn", marks=pytest.mark.slow), "mobilenet_v2"]


def twin(arch, batch_norm, channels=1, side=28, num_classes=10):
  """PyTorch twins of classifiers.LeNet5 / SmallCNN (as in benchmarks/peers_dpsgd.py)."""
  def conv(cin, cout, k, pad):
    return [nn.Conv2d(cin, cout, k, padding=pad)] + ([nn.BatchNorm2d(cout)] if batch_norm else [])
  if arch == "lenet5":
    pad = max(0, (32 - side) // 2)
    return nn.Sequential(
        *conv(channels, 6, 5, pad), nn.ReLU(), nn.MaxPool2d(2), *conv(6, 16, 5, 0), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
        nn.ReLU(), nn.Linear(84, num_classes))
  return nn.Sequential(
      *conv(channels, 32, 3, 1), nn.ReLU(), nn.MaxPool2d(2), *conv(32, 64, 3, 1), nn.ReLU(),
      nn.MaxPool2d(2), nn.Flatten(), nn.Linear((side // 4) ** 2 * 64, 128), nn.ReLU(),
      nn.Linear(128, num_classes))


def max_relative_error(model, path, arch, info):
  """Saves `model`'s state_dict, imports it, and measures it against `model` as every import
  is checked (`verify.compare`), on random pixels."""
  torch.save(model.state_dict(), path)
  parts = common.assemble(torch_importer.convert(str(path), arch, info), info)
  reference = verify.Reference(torch_source._torch_logits(model.eval()), "module")
  pixels = verify.check_pixels(np.zeros((0, *info.image_shape), np.uint8), info)[:4]
  measured = verify.compare(reference, parts, pixels, info, info.mean, info.std)
  assert measured["argmax_agreement"] == 1.0
  return measured["max_relative_logit_difference"]


@pytest.mark.parametrize("arch", TORCHVISION)
def test_torchvision_logits_equal(arch, tv_models, tmp_path):
  torch.manual_seed(0)
  model = randomise_batch_norms(getattr(tv_models, arch)(num_classes=10))
  assert max_relative_error(model, tmp_path / "m.pt", arch, data.DATASETS["cifar10"]) < RTOL


@pytest.mark.parametrize("batch_norm", [True, False], ids=["batch", "none"])
@pytest.mark.parametrize("arch, dataset", [("lenet5", "digits"), ("small_cnn", "digits"),
                                           ("lenet5", "cifar10")])
def test_twin_logits_equal(arch, dataset, batch_norm, tmp_path):
  info = data.DATASETS[dataset]
  torch.manual_seed(0)
  model = randomise_batch_norms(twin(arch, batch_norm, info.image_shape[2], info.image_shape[0]))
  assert max_relative_error(model, tmp_path / "m.pt", arch, info) < RTOL


def test_wrapped_and_data_parallel_state_dicts_load(tmp_path):
  state = twin("small_cnn", True).state_dict()
  torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}},
             tmp_path / "m.pt")
  loaded = torch_importer.load_state_dict(str(tmp_path / "m.pt"))
  assert list(loaded) == [k for k in state if not k.endswith("num_batches_tracked")]


CIFAR = data.DATASETS["cifar10"]


@pytest.mark.parametrize("build, arch, match", [
    (lambda tv: tv.resnet18(num_classes=100), "resnet18", r"fc.weight has shape \(100, 512\)"),
    (lambda tv: tv.resnet34(num_classes=10), "resnet18", r"unsupported layer\(s\).*layer1.2"),
    (lambda tv: tv.resnet18(num_classes=10), "resnet34", "no layer1.2.conv1.weight"),
    (lambda tv: tv.resnet18(num_classes=10), "resnet50", "--arch: unknown 'resnet50'"),
    (lambda tv: twin("lenet5", True, 3, 32), "small_cnn",
     "small_cnn twin has 2 convolutions and 2 dense layers, the file 2 and 3"),
    (lambda tv: nn.Sequential(nn.Conv2d(3, 6, 5), nn.GroupNorm(2, 6), nn.Flatten(),
                              nn.Linear(6 * 28 * 28, 10)), "lenet5", "unsupported layer '1'"),
], ids=["classes", "deeper", "shallower", "unknown_arch", "other_twin", "group_norm"])
def test_one_line_user_errors(build, arch, match, tv_models, tmp_path):
  torch.save(build(tv_models).state_dict(), tmp_path / "m.pt")
  with pytest.raises(errors.UserError, match=match) as caught:
    common.assemble(torch_importer.convert(str(tmp_path / "m.pt"), arch, CIFAR), CIFAR)
  assert "\n" not in str(caught.value)


def test_not_a_state_dict(tmp_path):
  torch.save(twin("lenet5", False), tmp_path / "module.pt")  # a pickled module: unsafe to load
  (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
  for name in ("module.pt", "junk.pt"):
    with pytest.raises(errors.UserError, match="state_dict"):
      torch_importer.convert(str(tmp_path / name), "lenet5", data.DATASETS["digits"])


def test_cli_end_to_end_then_dpdfd(tmp_path, capsys):
  """`experiments.teacher import` -> a card load_teacher accepts -> an experiments.dpdfd run."""
  torch.manual_seed(1)
  model = randomise_batch_norms(twin("small_cnn", True))
  torch.export.save(torch.export.export(model, (torch.zeros(2, 1, 28, 28),)),
                    tmp_path / "small.pt2")
  workdir = str(tmp_path / "teacher")
  teacher_cli.main(["import", "--from=torch", "--arch=small_cnn", "--dataset=digits",
                    f"--checkpoint={tmp_path / 'small.pt2'}", "--input_norm=half",
                    f"--workdir={workdir}"])
  assert "imported torch small_cnn as small_cnn for digits" in capsys.readouterr().out
  with open(os.path.join(workdir, "card.json")) as f:
    card = json.load(f)
  assert card["import"]["framework"] == "torch"
  assert card["import"]["framework_version"] == torch.__version__
  assert card["import"]["check"]["max_relative_logit_difference"] < 1e-5
  assert card["import"]["input_normalization"]["teacher_mean"] == [0.5]
  loaded = teacher_lib.load_teacher(workdir, dataset="digits")
  pixels = data.load("digits", "test").images[:8]
  with torch.no_grad():  # the source model on what it was trained with: (x / 255 - 0.5) / 0.5
    want = model(torch.from_numpy((pixels / 255.0 - 0.5) / 0.5).float().permute(0, 3, 1, 2))
  got = evaluate.predict_logits(loaded.parts, pixels, data.DATASETS["digits"], batch_size=8)
  assert np.abs(got - want.numpy()).max() < RTOL * np.abs(want.numpy()).max()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    dpdfd_cli.main(["--dataset=digits", f"--teacher_dirs={workdir}", "--noise_multiplier=10",
                    "--steps=2", "--batch_size=8", "--eval_every=2", "--latent_dim=8",
                    "--student_model=lenet5_half", f"--workdir={tmp_path / 'dpdfd'}",
                    "--no_progress"])
  assert os.path.isfile(tmp_path / "dpdfd" / "results.json")


@pytest.mark.parametrize("flags, match", [
    (["--arch=resnet50", "--input_norm=dataset"], "error: --arch: unknown 'resnet50'"),
    (["--arch=lenet5", "--input_norm=imagenet"], "error: --input_norm=imagenet: mean"),
    (["--arch=lenet5", "--input_norm=custom"], "error: --input_norm=custom needs"),
    (["--arch=lenet5"], "error: the following arguments are required: --input_norm"),
])
def test_cli_errors_are_one_line_exit_2(flags, match, tmp_path, capsys):
  torch.save(twin("lenet5", False).state_dict(), tmp_path / "m.pt")
  with pytest.raises(SystemExit) as exit_info:
    teacher_cli.main(["import", "--from=torch", "--dataset=digits",
                      f"--checkpoint={tmp_path / 'm.pt'}", f"--workdir={tmp_path / 'w'}", *flags])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.startswith(match) and err.count("\n") == 1
  assert not os.path.exists(tmp_path / "w" / "card.json")
