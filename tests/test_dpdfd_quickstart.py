"""dpkd_jax.methods.dpdfd.quickstart and the Quickstart command `experiments.dpdfd --dataset=digits`:
the teacher trained then reused, the closing summary, the chance line in every case, the
per-dataset recipe files (configs/dpdfd/) and given flags winning."""

import contextlib
import dataclasses
import glob
import io
import json
import math
import os
import re
import shlex
import warnings

import pytest
from dp_accounting import dp_event
from dpdfd_fixtures import dpdfd_config

from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import quickstart
from dpkd_jax.privacy import accounting
from dpkd_jax.train import outputs
from dpkd_jax.train import summary
from configs import dpdfd as dpdfd_recipes
from experiments import dpdfd as dpdfd_cli

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The CLI's digits defaults scaled down to seconds (8 fake devices: B divisible by 8).
TINY = ["--dataset=digits", "--teacher_model=lenet5", "--teacher_epochs=1", "--steps=4",
        "--eval_every=2", "--batch_size=16", "--generator_channels=16", "--latent_dim=8",
        "--student_model=lenet5_half", "--seed=0", "--no_progress"]


def _exit_2(argv, capsys) -> str:
  with pytest.raises(SystemExit) as exit_info:
    dpdfd_cli.main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ")
  return err


def test_digits_defaults_fit_the_quickstart_and_other_datasets_keep_theirs():
  config, a = dpdfd_cli.parse_config(["--dataset=digits"])
  assert (config.steps, config.batch_size, config.generator_channels, config.student_model,
          config.student_norm, config.teacher_loss, config.eval_every) == (
              600, 64, 64, "datalens_cnn", "group", "logit", 100)
  assert config.target_epsilon == 10.0 and config.accounting == "sound"
  assert config.noise_multiplier is None
  assert config.teacher_dirs == (os.path.join("runs", "teacher", "digits_small_cnn"),)
  assert a.teacher_config == teacher_lib.TeacherConfig(dataset="digits", model="small_cnn",
                                                       epochs=10)
  # Given flags win; σ without a target stays a run without a target (σ = 0: not private).
  config, _ = dpdfd_cli.parse_config(["--dataset=digits", "--steps=7", "--noise_multiplier=0"])
  assert config.steps == 7 and config.target_epsilon is None and config.batch_size == 64
  config, a = dpdfd_cli.parse_config(["--dataset=cifar10", "--teacher_dirs=t",
                                      "--target_epsilon=1"])
  default = dpdfd.DPDFDConfig(dataset="cifar10", teacher_dirs=("t",), target_epsilon=1.0)
  assert config == default and a.teacher_config is None


@pytest.mark.parametrize("dataset", ["digits", "mnist", "fashion_mnist"])
def test_a_dataset_without_config_runs_its_recipe_file(dataset):
  # The file configs/dpdfd/__init__.py names, nothing merged: the same config as --config.
  path = dpdfd_recipes.BY_DATASET[dataset]
  by_dataset, a = dpdfd_cli.parse_config([f"--dataset={dataset}"])
  by_file, b = dpdfd_cli.parse_config([f"--config={path}"])
  assert by_dataset == by_file and a.teacher_config == b.teacher_config
  assert by_dataset.accounting == "sound" and by_dataset.target_epsilon == 10.0


def test_the_paper_and_ensemble_recipes():
  # The paper's accounting: C far below the rows' scale, κ·γ = 1, the class code.
  paper, _ = dpdfd_cli.parse_config(["--config=configs/dpdfd/mnist_paper_eps10.py"])
  assert paper.accounting == "paper" and paper.l2_clip_norm == 1e-10
  assert paper.teacher_loss_scale * paper.gamma == pytest.approx(1.0)
  assert paper.engine.class_conditional_weight == 1.0 and paper.class_codes == 10
  fashion, _ = dpdfd_cli.parse_config(["--config=configs/dpdfd/fashion_mnist_paper_eps10.py"])
  assert fashion.engine.class_conditional_weight == 3.0 and fashion.student_model == "small_cnn"
  # Sound, many disjoint teachers: the paper generator, C = 1, 2,000 steps, no teacher dirs.
  config, a = dpdfd_cli.parse_config(["--config=configs/dpdfd/mnist_ensemble_eps10.py"])
  assert (config.steps, config.l2_clip_norm, config.engine.generator_objective) == (
      2000, 1.0, "paper")
  assert config.teacher_dirs == () and a.teacher_config is None


def test_given_flags_always_win():
  # Given at the config's own default (2,000 steps, C = 1, paper generator): still given.
  config, _ = dpdfd_cli.parse_config([
      "--dataset=mnist", "--teacher_dirs=t", "--target_epsilon=10", "--steps=2000",
      "--l2_norm_bound=1", "--student_norm=group", "--batch_size=256"])
  assert (config.steps, config.l2_clip_norm, config.student_norm, config.batch_size) == (
      2000, 1.0, "group", 256)
  assert config.engine.generator_objective == "disagreement" and config.eval_every == 1000
  config, _ = dpdfd_cli.parse_config([
      "--config=configs/dpdfd/mnist_ensemble_eps10.py", "--generator_objective=disagreement",
      "--steps=100", "--eval_every=50"])
  assert (config.engine.generator_objective, config.steps, config.eval_every,
          config.l2_clip_norm) == ("disagreement", 100, 50, 1.0)
  config, _ = dpdfd_cli.parse_config([
      "--config=configs/dpdfd/mnist_paper_eps10.py", "--l2_clip_norm=1e-4"])
  assert (config.l2_clip_norm, config.gamma) == (1e-4, 1e12)
  # A given teacher is the run's own: nothing is trained.
  config, a = dpdfd_cli.parse_config(["--dataset=digits", "--teacher_dirs=t"])
  assert config.teacher_dirs == ("t",) and a.teacher_config is None


def test_bad_input_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for name in ("cifar10", "mnist"):  # the data is there: the flags are checked next
    (tmp_path / f"{name}.npz").write_bytes(b"")
  assert "give noise_multiplier, target_epsilon" in _exit_2(
      ["--dataset=cifar10", "--teacher_dirs=t", f"--data_dir={tmp_path}"], capsys)
  # A flag against the recipe's engine: the config's one line says which to give.
  assert "use bound_method='clip'" in _exit_2(
      ["--dataset=mnist", "--bound_method=normalize", f"--data_dir={tmp_path}"], capsys)
  assert "unknown model 'gpt'" in _exit_2(["--dataset=digits", "--teacher_model=gpt"], capsys)
  assert "epochs must be >= 1" in _exit_2(["--dataset=digits", "--teacher_epochs=0"], capsys)
  assert "--steps" in _exit_2(["--dataset=digits", "--steps=x"], capsys)
  assert not os.path.exists("runs")  # nothing written


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  """The Quickstart command (tiny) in a fresh directory: (directory, printed lines)."""
  where, before = tmp_path_factory.mktemp("quickstart"), os.getcwd()
  out = io.StringIO()
  os.chdir(where)
  try:
    with contextlib.redirect_stdout(out):
      dpdfd_cli.main(TINY)
  finally:
    os.chdir(before)
  return where, out.getvalue().splitlines()


def test_quickstart_trains_the_teacher_and_sums_up(first_run, monkeypatch):
  where, out = first_run
  monkeypatch.chdir(where)
  teacher_dir = os.path.join("runs", "teacher", "digits_lenet5")
  assert out[0] == (f"teacher: training lenet5 on digits for 1 epoch in {teacher_dir} (not "
                    "private: it is the model to convert)")
  workdir = os.path.join("runs", "dpdfd", "digits")
  lines = out[out.index(next(l for l in out if l.startswith("student test accuracy"))):]
  results = json.load(open(os.path.join(workdir, "results.json")))
  card = json.load(open(os.path.join(teacher_dir, "card.json")))
  assert lines[:3] == [
      f"student test accuracy: {results['test_accuracy']:.4f} (digits test split)",
      f"privacy: sound epsilon {results['epsilon']:.4g} at delta 1e-05, replace-one "
      "neighbouring (dp_accounting)",
      f"student checkpoint: {os.path.join(workdir, 'checkpoints', '4')}"]
  assert f"run report: {os.path.join(workdir, 'report.md')}" in lines
  # The teacher's accuracy: in results.json's private block, never in the printed summary.
  assert card["test_accuracy"] in results[outputs.PRIVATE_KEY]["teacher_test_accuracy"]
  assert not any(line.startswith("teacher test accuracy") or "PRIVATE diagnostic" in line
                 for line in lines)
  assert any(line.startswith("private diagnostics (not covered by epsilon) in ") for line in lines)
  assert not any("paper-formula" in line for line in lines)  # sound accounting
  assert results["epsilon"] <= 10.0 and results["steps"] == 4
  assert os.path.isfile(os.path.join(workdir, "report.md"))
  assert summary.at_chance(results["test_accuracy"], 10) == lines[-1].startswith(
      "why at chance: sound epsilon budget too small for one teacher")


def test_the_quickstart_student_exports_by_default(first_run, monkeypatch, capsys):
  # The Quickstart trains through the CLI's default (the CPU kernels on this CPU backend); the
  # export CLI, also with its defaults, writes both formats, each checked against JAX. The
  # command's kernel choice ends with the command (this process is back on the reference ops).
  from dpkd_jax import kernels  # pylint: disable=g-import-not-at-top
  from experiments import export as export_cli  # pylint: disable=g-import-not-at-top
  assert kernels.active() is kernels.REFERENCE
  monkeypatch.chdir(first_run[0])
  export_cli.main(["--run=runs/dpdfd/digits", "--out=release", "--no_latency"])
  files = sorted(os.listdir("release"))
  assert {"student.onnx", "student.stablehlo", "model_card.md"} <= set(files), files
  assert "error" not in capsys.readouterr().err


def test_a_default_teacher_of_another_model_is_refused(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  other = os.path.join("runs", "teacher", "digits_small_cnn")
  os.makedirs(other)
  with open(os.path.join(other, "card.json"), "w") as f:  # a finished lenet5 teacher's card
    json.dump({"dataset": "digits", "model": "lenet5", "steps": 1, "config": dataclasses.asdict(
        teacher_lib.TeacherConfig(dataset="digits", model="lenet5"))}, f)
  err = _exit_2(["--dataset=digits", "--workdir=runs/third"], capsys)
  assert "is a lenet5 teacher, not small_cnn" in err and "--teacher_dirs" in err
  assert not os.path.exists(os.path.join("runs", "third"))


def test_prepare_teachers_reuses_the_teacher_whose_card_matches(first_run, tmp_path):
  teacher_dir = os.path.join(first_run[0], "runs", "teacher", "digits_lenet5")
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=(teacher_dir,), steps=2,
                             eval_every=2, batch_size=16, generator_channels=16, latent_dim=8,
                             student_model="lenet5_half", noise_multiplier=0.0, seed=0)
  logged = []
  tcfg = teacher_lib.TeacherConfig(dataset="digits", model="lenet5", epochs=1)
  quickstart.prepare_teachers(config, teacher_config=tcfg, progress=False, log=logged.append)
  results = dpdfd.train_dpdfd(config, str(tmp_path), progress=False)
  reused = os.path.join(first_run[0], "runs", "teacher", "digits_lenet5")
  assert logged == [f"teacher: reusing {reused} (lenet5 on digits, its card.json matches; "
                    "remove the directory to retrain)"]
  lines = quickstart.summary_lines(results, str(tmp_path))
  assert "privacy: sound epsilon inf" in lines[1]  # after the student's accuracy
  assert "WARNING: epsilon = inf (NOT private)" in lines
  (tmp_path / "model_card.md").write_text("card")
  assert f"model card: {tmp_path}/model_card.md" in summary.file_lines(str(tmp_path))


def _run_config(**kw):
  """A run's saved config (`DPDFDConfig.to_json`), as `chance_reason` reads it from results."""
  base = dict(dataset="digits", teacher_dirs=("t",), noise_multiplier=1.0)
  return dpdfd_config(**{**base, **kw}).to_json()


def test_chance_reason_one_teacher_sound():
  private = {"noise_multiplier": 80.0, "steps": 200, "epsilon": 9.999,
             "teachers_per_record": 1, "config": _run_config(batch_size=32)}
  line = quickstart.chance_reason(private)
  assert line.startswith("why at chance: sound epsilon budget too small for one teacher: ")
  assert "sigma/(2m*sqrt(B)) = 7.07 per step over 200 steps" in line
  assert quickstart.PRIVACY_ANCHOR in line and "--noise_multiplier=0" in line
  assert "python -m experiments.teacher_ensemble, then --teacher_ensemble_dir" in line
  assert "experiments.dfpate" in line
  # The disagreement generator's probes are rows of the same release: R = B·(1 + m).
  probing = quickstart.chance_reason({**private, "config": _run_config(
      batch_size=32, generator_objective="disagreement", bound_method="clip",
      probe_directions=1)})
  assert "sigma/(2m*sqrt(B)) = 5 per step" in probing
  three = quickstart.chance_reason({**private, "config": _run_config(
      batch_size=32, generator_objective="disagreement", bound_method="clip",
      probe_directions=3)})  # R = 32 * 4: sigma / (2 sqrt(128))
  assert "sigma/(2m*sqrt(B)) = 3.54 per step" in three
  assert summary.at_chance(0.14, 10) and not summary.at_chance(0.16, 10)
  assert summary.at_chance(math.nan, 10)


def test_chance_reason_many_teachers_sound():
  # 100 disjoint teachers: noise std σC/n per coordinate of the mean row.
  ensemble = {"noise_multiplier": 360.0, "steps": 2000, "epsilon": 9.999, "num_teachers": 100,
              "teachers_per_record": 1,
              "config": _run_config(batch_size=64, l2_clip_norm=1.0)}
  line = quickstart.chance_reason(ensemble)
  assert line.startswith("why at chance: too much noise for 100 teachers: sound epsilon 9.999")
  assert "noise std 3.6*C per coordinate of the mean row" in line
  assert "more teachers, a larger --target_epsilon" in line
  assert quickstart.ENSEMBLE_ANCHOR in line and "experiments.dfpate" in line
  assert "disjoint shards" not in line
  shared = quickstart.chance_reason({**ensemble, "num_teachers": 10, "teachers_per_record": 10})
  assert "one record reaches 10 of them: train them on disjoint shards" in shared


def test_chance_reason_paper_accounting_and_negligible_noise():
  paper = {"noise_multiplier": 50_000.0, "steps": 8000, "epsilon": 4e9, "num_teachers": 1,
           "accounting_used_for_budget": "paper",
           "config": _run_config(l2_clip_norm=1000.0, noise_multiplier=None,
                                 target_epsilon=10.0)}
  line = quickstart.chance_reason(paper)
  assert line.startswith("why at chance: the paper's formula chose the noise")
  given_sigma = quickstart.chance_reason({**paper, "config": _run_config(l2_clip_norm=1000.0)})
  assert given_sigma.startswith("why at chance: the paper's epsilon grows with C^2/sigma^2")
  assert "at C = 1000 the noise std per coordinate 5e+07 drowns rows of norm <= C" in line
  assert "sound epsilon 4e+09" in line and quickstart.PAPER_TABLE_ANCHOR in line
  assert "--l2_clip_norm=1e-10 --teacher_loss_scale=1e-12 --gamma=1e12" in line
  # The paper's tiny C: σ = C·sqrt(T/2ρ) leaves noise far below the rows: the engine failed.
  tiny = quickstart.chance_reason({**paper, "noise_multiplier": 5e-9, "config": _run_config(
      l2_clip_norm=1e-10, generator_objective="disagreement", bound_method="clip",
      noise_multiplier=None, target_epsilon=10.0)})
  assert tiny.startswith("why at chance: noise std 5e-09*C is negligible beside the rows, so "
                         "the engine itself did not learn in 8000 steps")
  assert quickstart.DISAGREEMENT_ANCHOR in tiny and "another --seed" in tiny


def test_chance_reason_noiseless_engine():
  noiseless = quickstart.chance_reason({"noise_multiplier": 0.0, "steps": 4,
                                       "config": _run_config(noise_multiplier=0.0)})
  assert noiseless.startswith("why at chance: no noise, so the engine itself did not learn in "
                              "4 steps")
  assert quickstart.ENGINE_ANCHOR in noiseless
  assert "--generator_objective=disagreement" in noiseless
  engine = quickstart.chance_reason({"noise_multiplier": 0.0, "steps": 4, "config": _run_config(
      noise_multiplier=0.0, generator_objective="disagreement", bound_method="clip")})
  assert "more --steps or another --seed" in engine and "--generator_objective" not in engine


def test_coverage_line_flags_the_classes_the_generator_rarely_made():
  assert quickstart.coverage_line({}) is None
  assert quickstart.coverage_line({"released_rows_per_class": [0, 0]}) is None
  even = quickstart.coverage_line({"released_rows_per_class": [50, 50]})
  assert even == "generator classes (released targets' argmax, 100 rows): 0:50% 1:50%"
  skewed = quickstart.coverage_line({"released_rows_per_class": [5, 995, 1000, 0]})
  assert skewed.startswith("generator classes (released targets' argmax, 2,000 rows): "
                           "0:0% 1:50% 2:50% 3:0%; rarely generated (< 1%): class 0, 3, ")
  assert quickstart.COVERAGE_ANCHOR in skewed


def test_privacy_doc_anchor_and_its_figures():
  # (the anchor resolves: tests/test_doc_links.py)
  # "one Gaussian step of multiplier 0.5 gives ε = 9.997"; the digits defaults' z = 12.25.
  assert round(accounting.epsilon(dp_event.GaussianDpEvent(0.5), delta=1e-5), 3) == 9.997
  config, _ = dpdfd_cli.parse_config(["--dataset=digits"])
  plan = dpdfd.make_plan(config, 1)
  assert round(plan.noise_multiplier / (2 * math.sqrt(config.batch_size)), 2) == 12.25


def test_readme_quickstart_is_the_main_job_and_the_test_command():
  text = open(os.path.join(_REPO, "README.md"), encoding="utf-8").read()
  section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  commands = re.findall(r"```bash\n(.*?)\n```", section, re.S)
  assert commands == ["pip install -e . && python -m experiments.dpdfd "
                      "--config=configs/dpdfd/digits_quickstart.py",
                      'pip install --no-compile -e ".[test,import,export]" && pip install '
                      '--no-compile --no-deps jax2onnx==0.17.1 && python -m pytest -q -n 2 '
                      '--dist loadfile --durations=30']


def test_recorded_mnist_commands_still_run_what_they_ran():
  # Runs made before the MNIST / Fashion-MNIST defaults changed write out the flags they ran
  # with (the config's generic recipe), so their commands reproduce them under the new ones.
  checked = 0
  for path in sorted(glob.glob(os.path.join(_REPO, "docs", "results", "dpdfd__*.json"))):
    record = json.load(open(path, encoding="utf-8"))
    if "mnist / fashion_mnist flag defaults changed" not in record.get("command_note", ""):
      continue
    tail = record["command"].split("experiments.dpdfd", 1)[1]
    argv = shlex.split(re.sub(r"\$\([^)]*\)", "a,b", tail))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      config, _ = dpdfd_cli.parse_config(argv)
    assert (config.teacher_loss, config.engine.generator_objective) == ("dkd", "paper"), path
    assert config.student_model == "datalens_cnn", path  # the student every such run had
    given = {flag.split("=")[0] for flag in argv}
    if "--l2_norm_bound" not in given and "--gamma" not in given:
      assert (config.l2_clip_norm, config.teacher_loss_scale, config.gamma) == (1, 1, 1), path
    if "--bound_method" not in given:
      assert config.bound_method == "normalize", path
    checked += 1
  assert checked >= 30


def test_recorded_commands_that_ran_no_class_code_still_run_none():
  # The class-conditional generator became a recipe's (configs/dpdfd/mnist_paper_eps10.py) after most
  # DPDFD rows ran: every recorded command that names none must still parse to none.
  checked = 0
  for path in sorted(glob.glob(os.path.join(_REPO, "docs", "results", "dpdfd__*.json"))):
    command = json.load(open(path, encoding="utf-8"))["command"]
    if "experiments.dpdfd" not in command:  # a benchmark script's own flags
      continue
    tail = command.split("experiments.dpdfd", 1)[1]
    named = re.search(r"--class_conditional_weight=(\S+)", tail)
    if (named and float(named.group(1)) != 0) or "--mode=direct" in tail or "sample" in tail[:8]:
      continue
    argv = shlex.split(re.sub(r"\$\([^)]*\)", "a,b", tail))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      config, _ = dpdfd_cli.parse_config(argv)
    assert config.engine.class_conditional_weight == 0, path
    checked += 1
  assert checked >= 60
