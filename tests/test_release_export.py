"""Tests of release.export / release.bundle / experiments.export: the student as ONNX and
StableHLO files equal to JAX, the release bundle of a real (tiny DP-SGD) run, and the CLI's
one-line refusals. ONNX tests skip without jax2onnx, onnx and onnxruntime."""

import importlib.metadata
import importlib.util
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

import dpsgd_fixtures
from dpkd_jax import data
from dpkd_jax.methods import dpsgd
from dpkd_jax.models import core
from dpkd_jax.models import resnet
from dpkd_jax.release import export
from dpkd_jax.release import students
from dpkd_jax.train import checkpoint
from dpkd_jax.train import ledger_file
from dpkd_jax.train import records
from experiments import dpsgd as dpsgd_cli
from experiments import export as export_cli

HAVE_ONNX = all(importlib.util.find_spec(m) for m in ("jax2onnx", "onnx", "onnxruntime"))
DIGITS = data.DATASETS["digits"]


def _student(name: str, norm: str) -> core.ModelParts:
  """A zoo student with deterministic weights and non-trivial BatchNorm statistics (fresh
  ones, mean 0 and var 1, would hide a running-statistics mistake of a converter); built
  abstractly, so that no initialiser compiles."""
  if name == "tiny_resnet":  # ResNet's residual blocks (two in a stage) at a test's cost
    build = lambda: resnet.ResNet(num_classes=10, input_shape=DIGITS.image_shape, norm=norm,
                                  rngs=nnx.Rngs(0), stage_sizes=(2, 1, 1, 1), base_width=4)
  else:
    build = lambda: students.ARCHITECTURES[name](num_classes=10, input_shape=DIGITS.image_shape,
                                                 norm=norm, rngs=nnx.Rngs(0))
  parts = core.split(nnx.eval_shape(build))

  def fill(tree, positive):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    values = [np.sin(np.arange(x.size) + i).reshape(x.shape) for i, x in enumerate(leaves)]
    values = [np.abs(v) + 0.5 if positive else 0.2 * v for v in values]  # variances > 0
    return jax.tree_util.tree_unflatten(treedef, [v.astype(np.float32) for v in values])

  return parts._replace(params=fill(parts.params, False),
                        batch_stats=fill(parts.batch_stats, True))


def _inputs_and_reference(parts):
  images, _ = export.verification_inputs(DIGITS, num_test=16, num_pattern=4)
  return images, np.asarray(jax.jit(export.logits_fn(parts))(images))


# One per family of students (the norms the methods default to, and "none"); tiny_resnet
# takes jax2onnx's second conversion (see release.export).
FAMILIES = [("lenet5", "batch"), ("small_cnn", "group"), ("datalens_cnn", "batch"),
            ("compact_5k", "none"), ("tiny_resnet", "batch")]


@pytest.mark.skipif(not HAVE_ONNX, reason="needs jax2onnx, onnx and onnxruntime")
@pytest.mark.parametrize("name,norm", FAMILIES)
def test_onnx_equals_jax_for_every_student_family(name, norm, tmp_path):
  parts = _student(name, norm)
  images, reference = _inputs_and_reference(parts)
  path = str(tmp_path / "s.onnx")
  entry = export.export_onnx(parts, DIGITS, path, images, reference)
  assert entry["check"]["ok"] and entry["check"]["max_rel_diff"] <= export.TOLERANCE
  if name == "tiny_resnet" and importlib.metadata.version("jax2onnx") == "0.17.1":
    # The identity shortcut after BatchNorm is what 0.17.1's transpose-pair pass mis-orders.
    assert "without its 'remove_redundant_transpose_pairs' pass" in entry["converter"]
  # Independently of the function's own check: onnxruntime at two batch sizes (symbolic batch).
  session = export.onnx_session(path)
  for batch in (1, len(images)):
    out = session.run(["logits"], {"images": images[:batch]})[0]
    scale = np.abs(reference[:batch]).max()
    np.testing.assert_allclose(out, reference[:batch], rtol=0, atol=export.TOLERANCE * scale)


@pytest.mark.parametrize("name,norm", [("lenet5", "batch"), ("compact_5k", "group")])
def test_stablehlo_round_trip_is_exact_with_a_symbolic_batch(name, norm, tmp_path):
  parts = _student(name, norm)
  images, reference = _inputs_and_reference(parts)
  path = str(tmp_path / "s.stablehlo")
  entry = export.export_stablehlo(parts, DIGITS, path, images, reference)
  assert entry["check"]["max_abs_diff"] == 0.0
  loaded = export.load_stablehlo(path)
  assert str(loaded.in_avals[0].shape[0]) == "batch"
  with open(path, "rb") as f:
    assert b".py" not in f.read()  # no source path of this machine in a released file
  assert jax.config.jax_traceback_in_locations_limit != 0  # the lowering setting was restored
  # Another batch size through the symbolic dimension (XLA may vectorise it differently).
  np.testing.assert_allclose(np.asarray(loaded.call(images[:3])), reference[:3], rtol=1e-5,
                             atol=1e-6)


def test_compare_is_relative_to_the_largest_logit():
  reference = np.array([[10.0, -20.0], [0.0, 1.0]])
  ok = export.compare(reference, reference + 1e-4 * 20 * 0.9)
  assert ok["ok"] and ok["max_rel_diff"] == pytest.approx(0.9e-4)
  bad = export.compare(reference, reference + 1e-4 * 20 * 1.1)
  assert not bad["ok"] and bad["argmax_agreement"] == 1.0
  assert not export.compare(reference, reference[:1])["ok"]  # a shape mismatch never passes


@pytest.fixture(scope="module")
def dpsgd_run(tmp_path_factory):
  """A finished tiny DP-SGD run (the DP-SGD tests' config, so its step compiles once)."""
  workdir = str(tmp_path_factory.mktemp("dpsgd_run"))
  dpsgd.train_dpsgd(dpsgd_fixtures.make_config(), workdir, progress=False)
  return workdir


def test_a_finished_run_writes_its_model_card(dpsgd_run):
  with open(os.path.join(dpsgd_run, "model_card.json")) as f:
    card = json.load(f)
  with open(os.path.join(dpsgd_run, "results.json")) as f:
    results = json.load(f)
  assert card["privacy"]["sound_epsilon"] == results["epsilon"]
  assert card["student"] == {"model": "lenet5_half", "norm": "group", "num_classes": 10}
  assert card["exports"] == [] and card["measured"] is None
  assert os.path.exists(os.path.join(dpsgd_run, "model_card.md"))


def test_cli_bundle_of_a_dpsgd_run(dpsgd_run, tmp_path, capsys):
  out = str(tmp_path / "release")
  formats = "onnx,stablehlo" if HAVE_ONNX else "stablehlo"
  export_cli.main([f"--run={dpsgd_run}", f"--out={out}", f"--format={formats}", "--repeats=1"])
  with open(os.path.join(out, "model_card.json")) as f:
    card = json.load(f)
  assert [e["format"] for e in card["exports"]] == formats.split(",")
  student = students.load_student(dpsgd_run)
  images, _ = export.verification_inputs(DIGITS)
  reference = np.asarray(jax.jit(export.logits_fn(student.parts))(images))
  for entry in card["exports"]:
    path = os.path.join(out, entry["file"])
    assert entry["sha256"] == checkpoint.sha256_file(path) and entry["check"]["ok"]
    assert entry["check"]["inputs"].startswith("64 digits test images")
    if entry["format"] == "onnx":
      got = export.onnx_session(path).run(["logits"], {"images": images})[0]
    else:
      got = np.asarray(export.load_stablehlo(path).call(images))
    assert np.abs(got - reference).max() <= export.TOLERANCE * np.abs(reference).max()
  measured = card["measured"]
  assert len(measured["load_average_1min"]) == 2 and "jax_jit" in measured["results"]
  assert [r["batch"] for r in measured["results"]["jax_jit"]] == [1, 256]
  assert ("onnxruntime" in measured["results"]) == HAVE_ONNX
  printed = capsys.readouterr().out
  assert "model card:" in printed and card["exports"][0]["sha256"] in printed


def _fails(argv, capsys) -> str:
  with pytest.raises(SystemExit) as exit_info:
    export_cli.main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
  return err


def _run_without_student(path, method: str) -> str:
  os.makedirs(path)
  records.write_record(os.path.join(path, "record.json"), records.make_record(
      method=method, dataset="digits", test_accuracy=0.5, sound_epsilon="inf", delta=1e-5,
      neighbouring="replace-one", accounting="sound", cpu_seconds=1.0, wall_seconds=1.0))
  with open(os.path.join(path, "results.json"), "w") as f:
    json.dump({"method": method}, f)
  return str(path)


def test_cli_refuses_in_one_line(dpsgd_run, tmp_path, capsys):
  out = str(tmp_path / "out")
  assert "does not exist" in _fails([f"--run={tmp_path / 'typo'}", f"--out={out}"], capsys)
  direct = _run_without_student(tmp_path / "direct", "dpdfd_direct")
  assert "releases no classifier student" in _fails([f"--run={direct}", f"--out={out}"], capsys)
  no_ckpt = _run_without_student(tmp_path / "no_ckpt", "dpsgd")
  assert "holds no checkpoint" in _fails([f"--run={no_ckpt}", f"--out={out}"], capsys)
  teacher = tmp_path / "teacher"
  teacher.mkdir()
  (teacher / "card.json").write_text("{}")
  assert "teacher" in _fails([f"--run={teacher}", f"--out={out}"], capsys)
  unfinished = tmp_path / "unfinished"
  unfinished.mkdir()
  assert "not a finished run" in _fails([f"--run={unfinished}", f"--out={out}"], capsys)
  err = _fails([f"--run={dpsgd_run}", f"--out={out}", "--format=tflite"], capsys)
  assert "unknown format tflite" in err and "onnx, stablehlo" in err
  assert not os.path.exists(out)  # nothing was written by any refusal


@pytest.mark.skipif(HAVE_ONNX, reason="checks the message when jax2onnx is missing")
def test_onnx_without_jax2onnx_is_one_line(dpsgd_run, tmp_path, capsys):
  err = _fails([f"--run={dpsgd_run}", f"--out={tmp_path / 'o'}", "--format=onnx"], capsys)
  assert "pip install --no-deps jax2onnx" in err


# The flags of `dpsgd_fixtures.make_config(seed=7)`: the plan of the run above, one compiled step.
DPSGD_FLAGS = ["--dataset=digits", "--model=lenet5_half", "--expected_batch_size=16",
               "--l2_clip_norm=2", "--noise_multiplier=1", "--steps=4", "--learning_rate=0.5",
               "--momentum=0.9", "--seed=7", "--no-download", "--no_progress"]


def test_export_of_weights_beyond_the_results_is_refused_then_covered(dpsgd_run, tmp_path,
                                                                      capsys):
  # Before: `--stop_at_step`, then `--resume` killed once a later checkpoint existed, then an
  # export: the card stated the first segment's epsilon for the later checkpoint's weights.
  del dpsgd_run  # compiles the step first
  run, out = tmp_path / "run", str(tmp_path / "release")
  dpsgd_cli.main([*DPSGD_FLAGS, f"--workdir={run}", "--stop_at_step=2"])
  first = {name: (run / name).read_bytes() for name in ("results.json", "record.json")}
  dpsgd_cli.main([*DPSGD_FLAGS, f"--workdir={run}", "--resume"])
  for name, text in first.items():  # killed once checkpoints/4 existed: no results of it
    (run / name).write_bytes(text)
  ckpt_dir = str(run / "checkpoints")
  assert checkpoint.all_steps(ckpt_dir) == [2, 4]
  spent = {step: ledger_file.ledger_of(checkpoint.restore_metadata(ckpt_dir, step=step))
           .spent_epsilon() for step in (2, 4)}
  recorded = records.read_record(str(run / "record.json"))["sound_epsilon"]
  assert recorded == pytest.approx(spent[2]) and spent[2] < spent[4]
  capsys.readouterr()
  err = _fails([f"--run={run}", f"--out={out}", "--format=stablehlo", "--no_latency"], capsys)
  assert "checkpoint step 4" in err and "with --resume" in err
  assert not os.path.exists(out)  # refused before anything was written
  dpsgd_cli.main([*DPSGD_FLAGS, f"--workdir={run}", "--resume"])  # finishes: results of step 4
  export_cli.main([f"--run={run}", f"--out={out}", "--format=stablehlo", "--no_latency"])
  with open(os.path.join(out, "model_card.json")) as f:
    card = json.load(f)
  privacy = card["privacy"]
  assert privacy["checkpoint_step"] == 4 and card["exports"][0]["checkpoint_step"] == 4
  assert privacy["sound_epsilon"] >= spent[4] * (1 - 1e-12)  # never below what was charged
  with open(run / ledger_file.FILE_NAME) as f:
    assert privacy["sound_epsilon"] <= json.load(f)["spent_epsilon"] * (1 + 1e-12)
