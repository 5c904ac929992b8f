"""dpkd_jax.methods.dpdfd.quickstart and the Quickstart command `experiments.dpdfd --dataset=digits`:
the teacher trained then reused, the closing summary, the chance line, the digits defaults."""

import contextlib
import dataclasses
import io
import json
import math
import os
import re

import pytest
from dp_accounting import dp_event

from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import quickstart
from dpkd_jax.privacy import accounting
from dpkd_jax.train import summary
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
  config, a = dpdfd_cli.parse_config(["--dataset=mnist", "--teacher_dirs=t",
                                      "--target_epsilon=1"])
  default = dpdfd.DPDFDConfig(dataset="mnist", teacher_dirs=("t",), target_epsilon=1.0)
  assert config == default and a.teacher_config is None


def test_bad_input_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert "give noise_multiplier, target_epsilon" in _exit_2(
      ["--dataset=mnist", "--teacher_dirs=t"], capsys)
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
  assert lines[:4] == [
      f"student test accuracy: {results['test_accuracy']:.4f} (digits test split)",
      f"teacher test accuracy: {card['test_accuracy']:.4f} [PRIVATE diagnostic: non-private "
      "teacher, not covered by epsilon, do not publish]",
      f"privacy: sound epsilon {results['epsilon']:.4g} at delta 1e-05, replace-one "
      "neighbouring (dp_accounting)",
      f"student checkpoint: {os.path.join(workdir, 'checkpoints', '4')}"]
  assert f"run report: {os.path.join(workdir, 'report.md')}" in lines
  assert not any("paper-formula" in line for line in lines)  # sound accounting
  assert results["epsilon"] <= 10.0 and results["steps"] == 4
  assert os.path.isfile(os.path.join(workdir, "report.md"))
  assert summary.at_chance(results["test_accuracy"], 10) == lines[-1].startswith(
      "why at chance: one record may change its teacher arbitrarily")


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


def test_convert_reuses_the_teacher_whose_card_matches(first_run, tmp_path):
  teacher_dir = os.path.join(first_run[0], "runs", "teacher", "digits_lenet5")
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=(teacher_dir,), steps=2,
                             eval_every=2, batch_size=16, generator_channels=16, latent_dim=8,
                             student_model="lenet5_half", noise_multiplier=0.0, seed=0)
  logged = []
  tcfg = teacher_lib.TeacherConfig(dataset="digits", model="lenet5", epochs=1)
  results = quickstart.convert(config, str(tmp_path), teacher_config=tcfg, progress=False,
                               log=logged.append)
  reused = os.path.join(first_run[0], "runs", "teacher", "digits_lenet5")
  assert logged == [f"teacher: reusing {reused} (lenet5 on digits, its card.json matches; "
                    "remove the directory to retrain)"]
  lines = quickstart.summary_lines(results, str(tmp_path))
  assert "privacy: sound epsilon inf" in lines[2]
  assert "WARNING: epsilon = inf (NOT private)" in lines
  (tmp_path / "model_card.md").write_text("card")
  assert f"model card: {tmp_path}/model_card.md" in summary.file_lines(str(tmp_path))


def test_chance_reason_names_the_cause():
  private = {"noise_multiplier": 80.0, "steps": 200, "epsilon": 9.999,
             "teachers_per_record": 1, "config": {"batch_size": 32}}
  line = quickstart.chance_reason(private)
  assert "sigma/(2m*sqrt(B)) = 7.07 per step over 200 steps, too little signal from one " \
      "teacher" in line
  assert quickstart.PRIVACY_ANCHOR in line and "--noise_multiplier=0" in line
  assert "disjoint shards" in line
  ensemble = quickstart.chance_reason({**private, "num_teachers": 10})
  assert "from 10 teachers" in ensemble and "disjoint shards" not in ensemble
  # The disagreement generator's probes are rows of the same release: R = B·(1 + m).
  probing = quickstart.chance_reason({**private, "config": {
      "batch_size": 32, "generator_objective": "disagreement", "probe_directions": 1}})
  assert "sigma/(2m*sqrt(B)) = 5 per step" in probing
  noiseless = quickstart.chance_reason({"noise_multiplier": 0.0, "steps": 4})
  assert "did not learn in 4 steps" in noiseless
  assert "--generator_objective=disagreement" in noiseless
  assert summary.at_chance(0.14, 10) and not summary.at_chance(0.16, 10)
  assert summary.at_chance(math.nan, 10)


def test_engine_anchor_exists_and_a_noiseless_run_at_chance_points_to_it():
  text = open(os.path.join(_REPO, "docs", "RESULTS.md"), encoding="utf-8").read()
  slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-")
           for h in re.findall(r"^#+ (.+)$", text, re.M)}
  assert quickstart.ENGINE_ANCHOR.split("#")[1] in slugs
  reason = quickstart.chance_reason({"noise_multiplier": 0.0, "steps": 5})
  assert quickstart.ENGINE_ANCHOR in reason and "5 steps" in reason


def test_privacy_doc_anchor_and_its_figures():
  text = open(os.path.join(_REPO, "docs", "privacy.md"), encoding="utf-8").read()
  slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-")
           for h in re.findall(r"^#+ (.+)$", text, re.M)}
  assert quickstart.PRIVACY_ANCHOR.split("#")[1] in slugs
  # "one Gaussian step of multiplier 0.5 gives ε = 9.997"; the digits defaults' z = 12.25.
  assert round(accounting.epsilon(dp_event.GaussianDpEvent(0.5), delta=1e-5), 3) == 9.997
  config, _ = dpdfd_cli.parse_config(["--dataset=digits"])
  plan = dpdfd.make_plan(config, 1)
  assert round(plan.noise_multiplier / (2 * math.sqrt(config.batch_size)), 2) == 12.25


def test_readme_quickstart_is_the_main_job_and_the_test_command():
  text = open(os.path.join(_REPO, "README.md"), encoding="utf-8").read()
  section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  commands = re.findall(r"```bash\n(.*?)\n```", section, re.S)
  assert commands == ["pip install -e . && python -m experiments.dpdfd --dataset=digits",
                      'pip install -e ".[test,import,export]" && pip install --no-deps '
                      'jax2onnx==0.17.1 && python -m pytest -q -n 2 --dist loadfile']
