"""DP-DFD with selective RR end to end on the embedded digits: results with both privacy
figures, private diagnostics, checkpoint, resume, generator reuse, one-line plan errors."""

import dataclasses
import json
import math
import os
import shutil

import chex
import jax
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.errors import UserError
from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import config_migration
from dpkd_jax.methods.srr import pretraining
from dpkd_jax.methods.srr import stage as stage_lib
from dpkd_jax.privacy import accounting
from dpkd_jax.train import checkpoint
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from experiments import srr as srr_cli
from resume_fixtures import interrupted_at
from teacher_fixtures import CountingTeacher, retrain_in_place

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(srr.EngineOptions)}  # nested options

def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dir=teacher_dir, epsilon=1.0, student_model="lenet5",
              generator_channels=8, latent_dim=8, pretrain_steps=2, pretrain_batch_size=16,
              stages=2, samples_per_stage=32, batch_size=16, student_epochs=2)
  base.update(kw)
  engine = {name: base.pop(name) for name in list(base) if name in _ENGINE_FIELDS}
  return srr.SRRConfig(**base, engine=srr.EngineOptions(**engine))


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def finished_run(teacher_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("srr"))
  counters = []
  make = stage_lib.make_teacher_label_fn

  def counting_make(*args, **kwargs):
    counters.append(CountingTeacher(make(*args, **kwargs)))
    return counters[-1]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(stage_lib, "make_teacher_label_fn", counting_make)
    results = srr.train_srr(_config(teacher_dir), workdir, progress=False)  # secret seed
  return workdir, results, counters[0]


def test_results_report_both_figures(finished_run):
  workdir, results, teacher = finished_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["test_accuracy"] == results["test_accuracy"] == results["accuracy_per_stage"][-1]
  assert len(results["accuracy_per_stage"]) == 2 and results["num_queries"] == 64
  assert teacher.calls == 2 and sum(teacher.rows) == 64  # the ledger's queries, each asked once
  expected = accounting.epsilon(accounting.srr_event(epsilon_per_query=1.0, num_queries=64),
                                delta=1e-5)
  assert results["labels_epsilon"] == pytest.approx(expected, rel=1e-9)
  assert saved["record_level_epsilon"] == math.inf  # json: Infinity
  assert results["paper_label_epsilon_per_query"] == 1.0
  per_class = saved["test_accuracy_per_class"]  # the released student's, per true test class
  sizes = np.bincount(data.load("digits", "test").labels, minlength=10)
  assert np.dot(per_class, sizes) / sizes.sum() == pytest.approx(results["test_accuracy"],
                                                                 abs=1e-9)
  assert "label-DP per query" in results["paper_label_epsilon_note"]
  assert "conditional on the generator" in results["labels_epsilon_note"]
  assert results["seed"] != results["config"]["seed"] and "secret" in results["seed"]
  assert os.path.getsize(os.path.join(workdir, "samples.png")) > 0
  assert checkpoint.latest_step(os.path.join(workdir, "checkpoints")) == 2
  assert checkpoint.latest_step(os.path.join(workdir, "generator_pretrain", "checkpoints")) == 2


def test_teacher_values_are_private_diagnostics_and_the_record_validates(finished_run):
  workdir, results, _ = finished_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert "teacher_test_accuracy" not in saved
  private = saved[outputs.PRIVATE_KEY]
  assert 0 <= private["teacher_test_accuracy"] <= 1
  # The generator's pretraining losses are functions of the teacher: never in metrics.csv.
  pretrain = os.path.join(workdir, "generator_pretrain")
  assert private["files"] == [os.path.join("generator_pretrain", outputs.PRIVATE_CSV)]
  assert not os.path.exists(os.path.join(pretrain, "metrics.csv"))
  assert "private_diagnostics/pretrain/loss" in outputs.read_private_diagnostics(pretrain)
  assert saved["warnings"] == [outputs.NOT_PRIVATE]  # teacher prior: record-level ε = inf
  record = records.read_record(os.path.join(workdir, "record.json"))
  assert record["method"] == "srr" and record["sound_epsilon"] == "inf"
  assert record["paper_epsilon"] == 1.0 and record["test_accuracy"] == results["test_accuracy"]


def test_resume_is_bit_identical_and_refused_without_resume(teacher_dir, finished_run, tmp_path):
  workdir, full, _ = finished_run
  config = _config(teacher_dir)
  with pytest.raises(ValueError, match="already holds"):
    srr.train_srr(config, workdir, progress=False)
  # An interruption after stage 1: a fresh workdir holding only the stage-1 checkpoint, its
  # config in the first saved format (flat, the old names, the later fields left out at their
  # default). Resumed, it must end as the uninterrupted run (compared after the migration);
  # a checkpoint in today's format resumes in test_replay_resumes_with_every_earlier_release.
  _, template, _ = srr.load_run(workdir)
  arrays, meta = checkpoint.restore(os.path.join(workdir, "checkpoints"), template.arrays(),
                                    step=1)
  old_names = {new: old for old, new in config_migration.V1_RENAMED.items()}
  saved = config.to_json()
  flat = {**{k: v for k, v in saved.items() if k not in ("version", "engine")}, **saved["engine"]}
  version1 = {old_names.get(k, k): v for k, v in flat.items()
              if config_migration.V1_OMITTED.get(k, object()) != v}
  assert "student_lr" in version1 and "student_replay" not in version1
  v1_dir = str(tmp_path / "format_1")
  checkpoint.save(os.path.join(v1_dir, "checkpoints"), 1, arrays, {**meta, "config": version1})
  resumed = srr.train_srr(config, v1_dir, resume=True, progress=False)
  assert resumed["accuracy_per_stage"] == full["accuracy_per_stage"]
  assert resumed["labels_epsilon"] == pytest.approx(full["labels_epsilon"], rel=1e-9)
  assert resumed["config"] == config.to_json()  # saved in today's format from then on
  assert not os.path.exists(os.path.join(v1_dir, "generator_pretrain"))
  _, a, _ = srr.load_run(v1_dir)
  _, b, _ = srr.load_run(workdir)
  chex.assert_trees_all_equal(a.student.params, b.student.params)
  chex.assert_trees_all_equal(a.generator.params, b.generator.params)


@pytest.fixture(scope="module")
def sound_prior_run(teacher_dir, tmp_path_factory):
  """(config, workdir, results) of one uninterrupted run without the teacher prior (so with a
  sound record-level epsilon), replaying its earlier releases, its stages selected on a
  validation hold-out of 100 records, public seed 3. (Three options of independent parts: the
  generator's start, the student's data, the evaluation; each test below checks one.)"""
  config = _config(teacher_dir, student_replay=True, seed=3, generator_prior="none",
                   validation_examples=100)
  workdir = str(tmp_path_factory.mktemp("srr_sound_prior"))
  return config, workdir, srr.train_srr(config, workdir, progress=False)


def test_replay_resumes_with_every_earlier_release(sound_prior_run, tmp_path):
  # The released rows of stage 0 live only in the checkpoint: a run resumed after stage 1
  # must replay the same rows as the uninterrupted one.
  config, workdir, full = sound_prior_run
  _, template, _ = srr.load_run(workdir)
  assert template.released is not None
  resumed_dir = str(tmp_path / "resumed")
  interrupted_at(workdir, 1, template.arrays(), resumed_dir)
  resumed = srr.train_srr(config, resumed_dir, resume=True, progress=False)
  per_stage = "validation_accuracy_per_stage"  # the stages' accuracies on the hold-out
  assert resumed[outputs.PRIVATE_KEY][per_stage] == full[outputs.PRIVATE_KEY][per_stage]
  assert resumed["test_accuracy"] == full["test_accuracy"]
  (_, a, _), (_, b, _) = srr.load_run(resumed_dir), srr.load_run(workdir)
  chex.assert_trees_all_equal(a.student.params, b.student.params)
  chex.assert_trees_all_equal(a.released, b.released)
  assert int(np.count_nonzero(a.released.candidate_mask.any(-1))) == 2 * 32  # both stages


def test_sound_prior_reports_the_composition_and_never_pretrains(sound_prior_run, tmp_path):
  # The run replays its releases too: replay changes what the student trains on, not the
  # labels' accounting nor whether a generator is pretrained.
  config, workdir, results = sound_prior_run
  assert results["record_level_epsilon"] == results["labels_epsilon"] < math.inf
  assert results["seed"] == 3
  assert not os.path.exists(os.path.join(workdir, "generator_pretrain"))
  with pytest.raises(ValueError, match="only generator_prior='teacher'"):
    srr.pretrain(config, str(tmp_path / "gen"), progress=False)


@pytest.fixture(scope="module")
def pretrained(teacher_dir, tmp_path_factory):
  """(workdir, generator) of `srr.pretrain` against the shared teacher."""
  gen_dir = str(tmp_path_factory.mktemp("srr_gen"))
  return gen_dir, srr.pretrain(_config(teacher_dir, seed=1), gen_dir, progress=False)


def test_a_standalone_pretraining_writes_its_record_and_reruns_without_training(
    teacher_dir, pretrained):
  gen_dir, generator = pretrained
  record = records.read_record(os.path.join(gen_dir, "record.json"))
  config = _config(teacher_dir, seed=1)
  assert record["method"] == "srr_generator" and record["test_accuracy"] is None
  assert record["sound_epsilon"] == "inf" and record["cpu_seconds"] > 0
  assert record["pretrain_steps"] == config.pretrain_steps
  assert set(record["final_metrics"]) >= {"loss"}
  # The same command again finds the finished generator: nothing retrained, one more segment.
  again = srr.pretrain(config, gen_dir, progress=False)
  chex.assert_trees_all_equal(again.params, generator.params)
  assert records.read_record(os.path.join(gen_dir, "record.json"))["segments"] == 2
  # The same pretraining flags for another generator (wider): one user error, nothing written.
  before = sorted(os.listdir(os.path.join(gen_dir, "checkpoints")))
  with pytest.raises(UserError, match="pretrained for another run"):
    srr.pretrain(_config(teacher_dir, seed=1, generator_channels=16), gen_dir, progress=False)
  assert sorted(os.listdir(os.path.join(gen_dir, "checkpoints"))) == before


def _load(gen_dir, config, teacher_dir=None):
  """`load_pretrained` as a run of `config` asks for it, its teacher read from `teacher_dir`."""
  teacher_dir = teacher_dir or config.teacher_dir
  _, template = srr.init_models(config, jax.random.key(0))
  teacher = teacher_lib.load_teacher(teacher_dir).parts
  return pretraining.load_pretrained(gen_dir, template, config=config.pretrain_config(),
                                     identity=config.generator_identity(teacher),
                                     teacher_dir=teacher_dir)


def _cli_from(gen_dir, teacher_dir, workdir):
  srr_cli.main(["--dataset=digits", f"--teacher_dir={teacher_dir}", "--epsilon=inf",
                "--student_model=lenet5", "--generator_channels=8", "--latent_dim=8",
                "--pretrain_steps=2", "--pretrain_batch_size=16", "--stages=2",
                "--samples_per_stage=32", "--batch_size=16", "--student_epochs=2", "--seed=2",
                f"--pretrained_generator_dir={gen_dir}", f"--workdir={workdir}", "--no_progress"])


def test_pretrained_generator_is_reused_only_by_its_own_kind_of_run(teacher_dir, pretrained,
                                                                   tmp_path, capsys):
  gen_dir, generator = pretrained
  assert os.path.getsize(os.path.join(gen_dir, "samples.png")) > 0
  config = _config(teacher_dir, pretrained_generator_dir=gen_dir, seed=2)
  chex.assert_trees_all_equal(_load(gen_dir, config).params, generator.params)
  # Through the CLI, without noise (--epsilon=inf: allowed, loudly not private).
  _cli_from(gen_dir, teacher_dir, tmp_path / "run")
  assert "WARNING: epsilon = inf (NOT private)" in capsys.readouterr().out
  with open(tmp_path / "run" / "results.json") as f:
    results = json.load(f)
  assert results["record_level_epsilon"] == results["labels_epsilon"] == math.inf
  assert records.read_record(str(tmp_path / "run" / "record.json"))["sound_epsilon"] == "inf"
  assert not os.path.exists(tmp_path / "run" / "generator_pretrain")
  with pytest.raises(UserError, match="pretrained for latent_dim=8, this run needs latent_dim"):
    _load(gen_dir, _config(teacher_dir, latent_dim=16))  # another architecture: refused
  with pytest.raises(ValueError, match="pretrained with"):  # another pretraining: refused
    _load(gen_dir, _config(teacher_dir, generator_terms=("ce", "bn")))


def test_the_teacher_is_known_by_its_weights_not_its_path(teacher_dir, pretrained, tmp_path,
                                                          monkeypatch, capsys):
  gen_dir, generator = pretrained
  saved = checkpoint.restore_metadata(os.path.join(gen_dir, "checkpoints"))["identity"]
  assert "teacher_dir" not in saved and len(saved["teacher_sha256"]) == 64
  assert saved == _config(teacher_dir).generator_identity(
      teacher_lib.load_teacher(teacher_dir).parts)
  # The same weights elsewhere, named by a relative path from another directory: accepted.
  copied = str(tmp_path / "moved_teacher")
  shutil.copytree(teacher_dir, copied)
  monkeypatch.chdir(tmp_path)
  config = _config("moved_teacher")
  chex.assert_trees_all_equal(_load(gen_dir, config).params, generator.params)
  # That copy retrained in place (same path, other weights): one line, exit 2, naming it.
  retrain_in_place(copied)
  with pytest.raises(UserError, match="other teacher weights than 'moved_teacher'"):
    _load(gen_dir, config)
  with pytest.raises(SystemExit) as exit_info:
    _cli_from(gen_dir, "moved_teacher", tmp_path / "run")
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
  assert "'moved_teacher'" in err and "pretrain the generator again" in err


def test_an_identity_that_names_the_teacher_by_its_path_is_refused(teacher_dir, pretrained,
                                                                   tmp_path):
  gen_dir, _ = pretrained
  verified = checkpoint.read_verified(os.path.join(gen_dir, "checkpoints"))
  identity = {k: v for k, v in verified.meta["identity"].items() if k != "teacher_sha256"}
  old = {**verified.meta, "identity": {**identity, "teacher_dir": os.path.abspath(teacher_dir)}}
  old_dir = str(tmp_path / "old_gen")
  checkpoint.save(os.path.join(old_dir, "checkpoints"), verified.step, verified.arrays, old)
  with pytest.raises(UserError, match="before generators recorded their teacher's weights") as e:
    _load(old_dir, _config(teacher_dir))
  assert "pretrain the generator again" in str(e.value) and "\n" not in str(e.value)


def test_a_target_no_stage_fits_is_one_line_and_exit_2(teacher_dir, tmp_path, capsys):
  # Found by make_plan (calibration) inside the run: it used to end in a traceback.
  workdir = tmp_path / "run"
  with pytest.raises(SystemExit) as exit_info:
    srr_cli.main(["--dataset=digits", f"--teacher_dir={teacher_dir}", "--generator_prior=none",
                  "--epsilon=2", "--target_epsilon=40", "--samples_per_stage=64",
                  "--batch_size=16", f"--workdir={workdir}", "--no_progress"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "allows no stage" in err and "Traceback" not in err and len(err.splitlines()) == 1
  assert not workdir.exists()  # nothing written


def test_a_validation_hold_out_keeps_the_test_split_for_the_end(sound_prior_run):
  # The stages are evaluated on the hold-out (private diagnostics only); the test split is
  # read once, at the end; the record says how the run was selected.
  _, workdir, results = sound_prior_run
  private = results[outputs.PRIVATE_KEY]
  assert "accuracy_per_stage" not in results and len(private["validation_accuracy_per_stage"]) == 2
  assert private["validation_examples"] == 100 and 0 <= results["test_accuracy"] <= 1
  assert not any(name.startswith("test/") for name in metrics_lib.read_metrics(workdir))
  assert "private_diagnostics/validation/accuracy" in outputs.read_private_diagnostics(workdir)
  assert records.read_record(os.path.join(workdir, "record.json"))["selection"] == "validation"
