"""A practitioner's whole path in one test: a torchvision resnet18 with random
weights -> teacher import -> DPDFD on (mock) CIFAR-10 for a few steps -> ONNX export ->
onnxruntime gives JAX's outputs. Needs the `import` and `export` extras (CI installs them)."""

import math

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("jax2onnx")

# pylint: disable=wrong-import-position
from dpkd_jax.importers import run as import_run
from dpkd_jax.methods import dpdfd
from dpkd_jax.release import bundle
from dpkd_jax.release import export
from dpkd_jax.release import students
from torch_fixtures import randomise_batch_norms


def test_torchvision_teacher_to_onnx_student(tv_models, tmp_path, mock_tfds):
  source = randomise_batch_norms(tv_models.resnet18(num_classes=10))
  # A runnable program (torch.export), so that the import checks its logits against it.
  checkpoint = str(tmp_path / "resnet18.pt2")
  torch.export.save(torch.export.export(source.eval(), (torch.zeros(1, 3, 32, 32),)), checkpoint)
  teacher_dir, run_dir = str(tmp_path / "teacher"), str(tmp_path / "run")
  with mock_tfds(num_examples=64):  # random images of CIFAR-10's shapes
    card = import_run.import_teacher(framework="torch", arch="resnet18", checkpoint=checkpoint,
                                     dataset="cifar10", workdir=teacher_dir,
                                     input_norm="dataset")
    config = dpdfd.DPDFDConfig(dataset="cifar10", teacher_dirs=(teacher_dir,),
                               student_model="lenet5_half", generator_channels=8,
                               noise_multiplier=10.0, steps=2, batch_size=16, eval_every=2,
                               latent_dim=8, seed=0)
    results = dpdfd.train_dpdfd(config, run_dir, progress=False)
    out = bundle.export_run(run_dir, str(tmp_path / "export"), formats=("onnx",),
                            measure_latency=False)
  assert card["import"]["framework"] == "torch" and card["import"]["arch"] == "resnet18"
  assert 0 < results["epsilon"] < math.inf
  (entry,) = out["exports"]
  assert entry["check"]["ok"], entry["check"]
  # onnxruntime, run here on fresh inputs, against the student's jitted JAX logits.
  student = students.load_student(run_dir)
  images = np.asarray(jax.random.normal(jax.random.key(3), (5, 32, 32, 3)), np.float32)
  reference = np.asarray(jax.jit(export.logits_fn(student.parts))(images))
  session = onnxruntime.InferenceSession(str(tmp_path / "export" / entry["file"]))
  (theirs,) = session.run(None, {session.get_inputs()[0].name: images})
  assert export.compare(reference, theirs)["ok"]
