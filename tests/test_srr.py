"""DP-DFD with selective RR: SRR frequencies, the stage loop's teacher queries, the two privacy
figures, and the run end to end (results, checkpoint, resume) on the embedded digits."""

import json
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import srr
from dpkd_jax.methods import srr_generator
from dpkd_jax.methods import srr_privacy
from dpkd_jax.methods import srr_stage
from dpkd_jax.privacy import accounting
from dpkd_jax.train import checkpoint
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import sharding
from experiments import srr as srr_cli


class CountingTeacher:
  """Wraps a teacher label function and counts its calls and labelled rows."""

  def __init__(self, label_fn):
    self.label_fn, self.calls, self.rows = label_fn, 0, []

  def __call__(self, queries):
    self.calls += 1
    self.rows.append(int(queries.shape[0]))
    return self.label_fn(queries)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("teacher"))
  cfg = teacher_lib.TeacherConfig(dataset="digits", model="lenet5", epochs=1, batch_size=64,
                                  learning_rate=3e-3)
  teacher_lib.train_teacher(cfg, workdir, progress=False)
  return workdir


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dir=teacher_dir, epsilon=1.0, student_model="lenet5",
              generator_channels=8, latent_dim=8, pretrain_steps=2, pretrain_batch_size=16,
              stages=2, samples_per_stage=32, batch_size=16, student_epochs=2)
  base.update(kw)
  return srr.SRRConfig(**base)


# ----------------------------------------------------------------------------- mechanism


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_srr_output_frequencies_match_the_formula(epsilon):
  # Prior with candidate set {0, 1, 2, 3} at tau = 0.1 (k = 4); true label 2 (in the set) for
  # half the queries and 7 (outside) for the other half. 5-sigma binomial tolerance per cell.
  n = 20_000
  prior = jnp.tile(jnp.array([0.3, 0.25, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.006, 0.004]), (2 * n, 1))
  labels = jnp.concatenate([jnp.full((n,), 2, jnp.int32), jnp.full((n,), 7, jnp.int32)])
  teacher = CountingTeacher(lambda queries: labels)
  release = srr_stage.private_labels(teacher, jax.random.key(0), jnp.zeros((2 * n, 1, 1, 1)), prior,
                                     epsilon=epsilon, threshold=0.1)
  assert teacher.calls == 1 and teacher.rows == [2 * n]
  np.testing.assert_array_equal(release.set_sizes, 4)
  k, e = 4, math.exp(epsilon)
  expected_in = np.array([1, 1, e, 1] + [0] * 6) / (e + k - 1)
  expected_out = np.array([1, 1, 1, 1] + [0] * 6) / k
  for rows, expected in ((slice(0, n), expected_in), (slice(n, 2 * n), expected_out)):
    freq = np.bincount(np.asarray(release.noisy_labels[rows]), minlength=10) / n
    tolerance = 5 * np.sqrt(expected * (1 - expected) / n) + 1e-12
    assert np.all(np.abs(freq - expected) <= tolerance), (freq, expected)


def test_stage_loop_asks_each_query_once_and_reuses_the_labels():
  # The e2e run's sizes and schedules, so that the compiled steps are shared with it.
  config = _config("unused", generator_epochs=2, generator_prior="none")
  mesh = sharding.data_mesh()
  student, generator = srr.init_models(config, jax.random.key(0))
  state = sharding.replicate(srr.init_state(config, student, generator, stages=2), mesh)
  teacher = CountingTeacher(lambda queries: jnp.arange(queries.shape[0], dtype=jnp.int32) % 10)
  step = srr_generator.make_finetune_step(state.student.graphdef)
  for stage in range(2):
    result = srr_stage.run_stage(state, jax.random.key(stage),
                                 config.stage_config(epsilon=1.0, stage=stage), teacher,
                                 generator_step=step, mesh=mesh)
    state = result.state
    chex.assert_shape([result.noisy_labels, result.set_sizes], (32,))
    if stage == 0:  # the untrained student's prior is replaced by the uniform one: K-ary RR
      np.testing.assert_array_equal(result.set_sizes, 10)
  assert teacher.calls == 2 and teacher.rows == [32, 32]  # once per query, per stage
  steps_per_epoch = 32 // 16
  assert int(state.student.step) == 2 * 2 * steps_per_epoch  # 2 epochs on the same labels
  assert int(state.generator.step) == 2 * 2 * steps_per_epoch
  assert np.isfinite(result.metrics["student_loss"])


# ----------------------------------------------------------------------------- accounting


def _plan(**kw):
  base = dict(epsilon=1.0, target_epsilon=None, delta=1e-5, stages=2, samples_per_stage=10,
              generator_prior="none")
  base.update(kw)
  return srr_privacy.plan(**base)


def test_record_epsilon_grows_with_queries_and_is_the_srr_composition():
  seen = []
  for stages in (1, 3, 9):
    plan = _plan(stages=stages)
    expected = accounting.epsilon(accounting.srr_event(epsilon_per_query=1.0,
                                                       num_queries=stages * 10), delta=1e-5)
    assert plan.num_queries == stages * 10
    assert plan.labels_epsilon == pytest.approx(expected, rel=1e-12)
    assert plan.record_epsilon == plan.labels_epsilon and plan.paper_label_epsilon == 1.0
    seen.append(plan.record_epsilon)
  assert seen[0] < seen[1] < seen[2]


def test_teacher_prior_has_no_finite_record_epsilon():
  plan = _plan(generator_prior="teacher")
  assert plan.record_epsilon == math.inf
  assert plan.labels_epsilon == pytest.approx(_plan().labels_epsilon)
  nonprivate = _plan(epsilon=math.inf)
  assert nonprivate.labels_epsilon == math.inf and nonprivate.paper_label_epsilon == math.inf


def test_target_epsilon_bounds_the_number_of_queries():
  plan = _plan(target_epsilon=100.0, stages=50)
  eps = lambda s: accounting.epsilon(  # noqa: E731
      accounting.srr_event(epsilon_per_query=1.0, num_queries=10 * s), delta=1e-5)
  assert 1 <= plan.stages < 50
  assert eps(plan.stages) <= 100.0 < eps(plan.stages + 1)
  calibrated = _plan(epsilon=None, target_epsilon=5.0, stages=2)
  assert 4.9 < calibrated.labels_epsilon <= 5.0 and calibrated.epsilon_per_query < 1.0
  with pytest.raises(ValueError, match="allows no stage"):
    _plan(target_epsilon=2.0)


def test_a_target_with_the_teacher_prior_warns_that_the_sound_epsilon_is_inf():
  with pytest.warns(UserWarning, match=r"sound \(record-level\) epsilon of this run is inf > "
                                       r"target_epsilon=100"):
    _plan(target_epsilon=100.0, stages=2, generator_prior="teacher")


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def finished_run(teacher_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("srr"))
  counters = []
  make = srr_stage.make_teacher_label_fn

  def counting_make(*args, **kwargs):
    counters.append(CountingTeacher(make(*args, **kwargs)))
    return counters[-1]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(srr_stage, "make_teacher_label_fn", counting_make)
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
  # An interruption after stage 1: a fresh workdir holding only the stage-1 checkpoint.
  _, template, _ = srr.load_run(workdir)
  arrays, meta = checkpoint.restore(os.path.join(workdir, "checkpoints"), template.arrays(), step=1)
  resumed_dir = str(tmp_path / "resumed")
  checkpoint.save(os.path.join(resumed_dir, "checkpoints"), 1, arrays, meta)
  resumed = srr.train_srr(config, resumed_dir, resume=True, progress=False)
  assert resumed["accuracy_per_stage"] == full["accuracy_per_stage"]
  assert resumed["labels_epsilon"] == pytest.approx(full["labels_epsilon"], rel=1e-9)
  assert not os.path.exists(os.path.join(resumed_dir, "generator_pretrain"))
  _, a, _ = srr.load_run(resumed_dir)
  _, b, _ = srr.load_run(workdir)
  chex.assert_trees_all_equal(a.student.params, b.student.params)
  chex.assert_trees_all_equal(a.generator.params, b.generator.params)


def test_sound_prior_reports_the_composition_and_never_pretrains(teacher_dir, tmp_path):
  config = _config(teacher_dir, generator_prior="none", seed=3)
  results = srr.train_srr(config, str(tmp_path), progress=False)
  assert results["record_level_epsilon"] == results["labels_epsilon"] < math.inf
  assert results["seed"] == 3 and not os.path.exists(tmp_path / "generator_pretrain")
  with pytest.raises(ValueError, match="only generator_prior='teacher'"):
    srr.pretrain(config, str(tmp_path / "gen"), progress=False)


def test_pretrained_generator_is_reused_only_by_its_own_kind_of_run(teacher_dir, tmp_path,
                                                                   capsys):
  gen_dir = str(tmp_path / "gen")
  pretrained = srr.pretrain(_config(teacher_dir, seed=1), gen_dir, progress=False)
  assert os.path.getsize(os.path.join(gen_dir, "samples.png")) > 0
  config = _config(teacher_dir, pretrained_generator_dir=gen_dir, seed=2)
  _, template = srr.init_models(config, jax.random.key(0))
  loaded = srr_generator.load_pretrained(gen_dir, template, config=config.pretrain_config(),
                                         identity=config.generator_identity())
  chex.assert_trees_all_equal(loaded.params, pretrained.params)
  # Through the CLI, without noise (--epsilon=inf: allowed, loudly not private).
  srr_cli.main(["--dataset=digits", f"--teacher_dir={teacher_dir}", "--epsilon=inf",
                "--student_model=lenet5", "--generator_channels=8", "--latent_dim=8",
                "--pretrain_steps=2", "--pretrain_batch_size=16", "--stages=2",
                "--samples_per_stage=32", "--batch_size=16", "--student_epochs=2", "--seed=2",
                f"--pretrained_generator_dir={gen_dir}", f"--workdir={tmp_path / 'run'}",
                "--no_progress"])
  assert "WARNING: epsilon = inf (NOT private)" in capsys.readouterr().out
  with open(tmp_path / "run" / "results.json") as f:
    results = json.load(f)
  assert results["record_level_epsilon"] == results["labels_epsilon"] == math.inf
  assert records.read_record(str(tmp_path / "run" / "record.json"))["sound_epsilon"] == "inf"
  assert not os.path.exists(tmp_path / "run" / "generator_pretrain")
  other = _config(teacher_dir, latent_dim=16)  # another architecture: refused
  _, other_template = srr.init_models(other, jax.random.key(0))
  with pytest.raises(ValueError, match="pretrained for"):
    srr_generator.load_pretrained(gen_dir, other_template, config=other.pretrain_config(),
                                  identity=other.generator_identity())
  ablated = _config(teacher_dir, generator_terms=("ce", "bn"))  # another pretraining: refused
  with pytest.raises(ValueError, match="pretrained with"):
    srr_generator.load_pretrained(gen_dir, template, config=ablated.pretrain_config(),
                                  identity=ablated.generator_identity())


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=None), "give epsilon"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=math.inf, target_epsilon=5.0), "needs noisy labels"),
    (dict(target_epsilon=-1.0), "target_epsilon"),
    (dict(delta=1.0), "delta"),
    (dict(threshold=1.5), "threshold"),
    (dict(generator_prior="public"), "generator_prior"),
    (dict(first_prior="teacher"), "first_prior"),
    (dict(generator_channels=7), "generator_channels"),
    (dict(generator_prior="none", pretrained_generator_dir="x"), "never uses"),
    (dict(generator_terms=("ce", "norm")), "generator terms"),
    (dict(bn_weight=-1.0), "bn_weight"),
    (dict(samples_per_stage=40), "multiple of batch_size"),
    (dict(stages=0), "stages"),
    (dict(student_epochs=0), "student_epochs"),
    (dict(student_lr=0.0), "student_lr"),
    (dict(dataset="imagenet"), "unknown dataset"),
    (dict(student_model="gpt"), "unknown student_model"),
    (dict(seed=-1), "seed"),
])
def test_bad_config_fails_at_construction(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _config("unused", **kwargs)


@pytest.mark.parametrize("argv,match", [
    (["--dataset=digits"], "--teacher_dir"),
    (["--dataset=digits", "--teacher_dir=x", "--epsilon=1", "--generator_terms=ce,xx"], "generator terms"),
    (["--dataset=digits", "--teacher_dir=x", "--epsilon=inf", "--target_epsilon=3"], "noisy labels"),
    (["pretrain", "--dataset=digits", "--teacher_dir=x", "--generator_prior=none"], "only generator_prior"),
    (["pretrain", "--dataset=digits", "--teacher_dir=x", "--generator_terms="], "at least one"),
])
def test_cli_rejects_bad_flags(argv, match, capsys):
  with pytest.raises(SystemExit) as exit_info:
    srr_cli.main(argv)
  assert exit_info.value.code == 2
  assert match in capsys.readouterr().err
