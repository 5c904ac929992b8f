"""dpkd_jax.importers.graph_torch / graph_keras (`--arch=graph`): any classifier whose operations
are covered imports with logits within 1e-5 (relative) of the source, its teacher workdir
(graph.json beside the checkpoint) loads read-only, and DPDFD steps run from it; an operation
outside the table is refused with one line. All five test models (the custom module, the Keras
model, torchvision's mobilenet_v3_small, efficientnet_b0 and resnet50) import and run DPDFD
steps here, on digits (torchvision's: on mock CIFAR-10); their import and step times are
measured by benchmarks/graph_import.py (docs/results/benchmarks/graph_import__cpu.json)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.importers import common
from dpkd_jax.importers import graph_torch
from dpkd_jax.importers import run
from dpkd_jax.importers import torch_source
from dpkd_jax.importers import verify
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import run as dpdfd_run
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.methods.srr import generator as srr_generator
from dpkd_jax.train import sharding

torch = pytest.importorskip("torch")
from graph_fixtures import graph_custom  # noqa: E402
from torch_fixtures import randomise_batch_norms  # noqa: E402
import graph_fixtures  # noqa: E402

RTOL = 1e-5
DIGITS = data.DATASETS["digits"]


def _dpdfd_steps(workdir: str, steps: int = 2, dataset: str = "digits") -> dict:
  """`steps` DPDFD updates from the teacher in `workdir`, loaded as `experiments.dpdfd` does."""
  # A narrow generator (8 channels, not 128): the teacher's graph program is what is under test.
  config = dpdfd.DPDFDConfig(dataset=dataset, teacher_dirs=(workdir,), noise_multiplier=10.0,
                             student_model="lenet5_half", steps=steps, batch_size=8,
                             eval_every=steps, latent_dim=8, generator_channels=8)
  ensemble, _ = dpdfd_run.load_teachers(config)
  mesh = sharding.data_mesh()  # placed as `dpdfd.train_dpdfd` places them
  state = sharding.replicate(step_lib.init_state(config, jax.random.key(0)), mesh)
  ensemble = sharding.replicate(ensemble, mesh)
  before = jax.tree.leaves(state.student.params)[0].copy()
  train_step = step_lib.make_train_step(dpdfd.make_plan(config), config, ensemble.graphdef)
  for i in range(steps):
    key = sharding.replicate(jax.random.fold_in(jax.random.key(1), i), mesh)
    state, metrics = train_step(state, ensemble.params, ensemble.batch_stats, key)
  metrics = jax.device_get(metrics)
  assert all(np.isfinite(v).all() for v in metrics.values())
  assert not np.array_equal(before, jax.tree.leaves(state.student.params)[0])
  return metrics


def _export(model, path, channels=1, side=28):
  torch.export.save(torch.export.export(model.eval(), (torch.zeros(2, channels, side, side),)),
                    path)
  return str(path)


def _import(tmp_path, framework, checkpoint, norm="half", dataset="digits", **kw):
  workdir = str(tmp_path / "teacher")
  card = run.import_teacher(framework=framework, arch="graph", checkpoint=checkpoint,
                            dataset=dataset, workdir=workdir, input_norm=norm, **kw)
  return workdir, card


@pytest.fixture(scope="module")
def custom_teacher(tmp_path_factory):
  """(the custom PyTorch module, its graph teacher's workdir, card)."""
  tmp_path = tmp_path_factory.mktemp("custom")
  torch.manual_seed(0)
  model = graph_custom()
  return (model, *_import(tmp_path, "torch", _export(model, tmp_path / "custom.pt2")))


def test_custom_module_imports_within_tolerance(custom_teacher):
  _, _, card = custom_teacher
  check = card["import"]["check"]
  assert check["verified"] and check["max_relative_logit_difference"] <= RTOL
  assert check["argmax_agreement"] == 1.0
  assert card["model"] == "graph" and card["graph"]["batch_norms"] == 1
  assert {"conv2d", "group_norm", "layer_norm", "max_pool2d", "avg_pool2d", "hardswish",
          "adaptive_avg_pool2d", "cat", "gelu", "silu"} <= set(card["graph"]["operations"])


def test_custom_teacher_loads_gives_bn_inputs_and_runs_dpdfd(custom_teacher):
  model, workdir, _ = custom_teacher
  loaded = teacher_lib.load_teacher(workdir, dataset="digits")
  # The batch-norm inputs reach the generator losses as for every zoo teacher.
  x = jax.random.normal(jax.random.key(0), (4, *DIGITS.image_shape))
  _, stats = srr_generator.teacher_forward_with_bn_statistics(*loaded.parts, x)
  assert len(stats.batch_means) == 1 and stats.batch_means[0].shape == (16,)
  np.testing.assert_allclose(stats.running_means[0], model.bn.running_mean.numpy(), rtol=1e-6)
  _dpdfd_steps(workdir)


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "efficientnet_b0", "resnet50"])
def test_torchvision_model_imports_and_runs_dpdfd(name, tv_models, tmp_path, mock_tfds):
  """Each torchvision test model (random weights and batch-norm statistics) as a torch.export
  program: imported on (mock) CIFAR-10 with its logits checked against PyTorch (the import
  refuses beyond tolerance), then DPDFD steps from its teacher workdir. Mock data keep the
  card's test evaluation to a few images: at the suite's -O0, resnet50 on digits' 355 test
  images took most of its time."""
  torch.manual_seed(0)
  model = randomise_batch_norms(getattr(tv_models, name)(num_classes=10))
  checkpoint = _export(model, tmp_path / f"{name}.pt2", channels=3, side=32)
  with mock_tfds(num_examples=16):  # random images of CIFAR-10's shapes
    workdir, card = _import(tmp_path, "torch", checkpoint, dataset="cifar10")
    _dpdfd_steps(workdir, dataset="cifar10")
  check = card["import"]["check"]
  assert check["verified"] and check["max_relative_logit_difference"] <= RTOL
  assert check["argmax_agreement"] == 1.0
  assert card["graph"]["batch_norms"] == {"mobilenet_v3_small": 34, "efficientnet_b0": 49,
                                          "resnet50": 53}[name]
  assert {"mobilenet_v3_small": {"hardswish", "hardsigmoid", "adaptive_avg_pool2d"},
          "efficientnet_b0": {"silu", "sigmoid", "mul"},  # squeeze-excitation gates
          "resnet50": {"max_pool2d", "add"}}[name] <= set(card["graph"]["operations"])


def test_keras_model_imports_and_runs_dpdfd(tmp_path):
  os.environ.setdefault("KERAS_BACKEND", "jax")
  path = str(tmp_path / "teacher.keras")
  graph_fixtures.keras_model().save(path)
  workdir, card = _import(tmp_path, "keras", path, norm="unit")
  assert card["import"]["check"]["max_relative_logit_difference"] <= RTOL
  assert any("softmax" in note for note in card["import"]["notes"])
  assert card["graph"]["batch_norms"] == 2
  _dpdfd_steps(workdir)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static_batch", "dynamic_batch"])
def test_any_batch_size_runs_whatever_batch_the_program_was_exported_with(dynamic):
  nn = torch.nn
  model = randomise_batch_norms(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                              nn.Flatten(), nn.Linear(4 * 26 * 26, 10)))
  shapes = ({0: torch.export.Dim("batch", min=1, max=1024)},) if dynamic else None
  program = torch.export.export(model, (torch.zeros(4, 1, 28, 28),), dynamic_shapes=shapes)
  logits = torch_source._torch_logits(model)  # pylint: disable=protected-access
  reference = verify.Reference(logits, "module")
  parts = common.assemble(graph_torch.convert(program, reference), DIGITS)
  pixels = verify.check_pixels(np.zeros((0, *DIGITS.image_shape), np.uint8), DIGITS)[:5]
  measured = verify.compare(reference, parts, pixels, DIGITS, DIGITS.mean, DIGITS.std)
  assert measured["max_relative_logit_difference"] <= RTOL


def test_operation_outside_the_table_is_refused_in_one_line(tmp_path):
  nn = torch.nn
  model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ELU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
  with pytest.raises(errors.UserError) as raised:
    _import(tmp_path, "torch", _export(model, tmp_path / "elu.pt2"))
  message = str(raised.value)
  assert "\n" not in message and "aten.elu.default" in message
  assert "does not cover 1 operation" in message
  assert not os.path.exists(tmp_path / "teacher" / "card.json")


def test_torchscript_and_bare_state_dict_are_refused_for_graph(tmp_path):
  model = graph_custom()
  torch.jit.script(model).save(str(tmp_path / "m.pt"))
  with pytest.raises(errors.UserError, match="reads a torch.export program"):
    _import(tmp_path, "torch", str(tmp_path / "m.pt"))
  torch.save(model.state_dict(), tmp_path / "s.pt")
  with pytest.raises(errors.UserError, match="--torch_module"):
    _import(tmp_path, "torch", str(tmp_path / "s.pt"))


def test_tampered_program_is_refused_on_load(custom_teacher, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(custom_teacher[1], workdir)
  with open(os.path.join(workdir, "graph.json")) as f:
    program = json.load(f)
  program["nodes"] = program["nodes"][:-1]
  with open(os.path.join(workdir, "graph.json"), "w") as f:
    json.dump(program, f)
  with pytest.raises(errors.UserError, match="does not match the SHA-256"):
    teacher_lib.load_teacher(workdir, dataset="digits")
