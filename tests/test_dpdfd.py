"""DPDFD: step properties (privacy plumbing, isolation, sharding) and the run end to end."""

import json
import math
import os
import shutil
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import dpdfd_privacy
from dpkd_jax.methods import dpdfd_step
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train import checkpoint
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import sharding
from experiments import dpdfd as dpdfd_cli


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("teacher"))
  cfg = teacher_lib.TeacherConfig(dataset="digits", model="lenet5", epochs=1, batch_size=64,
                                  learning_rate=3e-3)
  teacher_lib.train_teacher(cfg, workdir, progress=False)
  return workdir


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              noise_multiplier=10.0, steps=4, batch_size=16, eval_every=2, latent_dim=8)
  base.update(kw)
  return dpdfd.DPDFDConfig(**base)


# ----------------------------------------------------------------------------- step level


def test_sigma_zero_target_is_the_nonprivate_normalized_gradient(teacher_dir):
  config = _config(teacher_dir, noise_multiplier=0.0)
  ensemble, _ = dpdfd.load_teachers(config)
  step_cfg = config.step_config()
  grads = jax.random.normal(jax.random.key(1), (1, 16, 10))
  release = dpdfd_step.private_output_gradients(step_cfg, jax.random.key(2), grads)
  expected = mechanisms.normalize_rows(grads[0], 1.0, step_cfg.stability)
  np.testing.assert_array_equal(release.noisy, expected)
  assert float(release.noise_stddev) == 0.0
  del ensemble


@pytest.mark.parametrize("weight", [0.0, 1.0, 2.5])
def test_one_hot_weight_scales_the_generator_cross_entropy(teacher_dir, weight):
  # The L_G ablation (paper Table 6) switches terms off through their weights.
  config = _config(teacher_dir, one_hot_weight=weight).step_config()
  logits = jax.random.normal(jax.random.key(3), (6, 10))
  out = dpdfd_step.core.ClassifierOutput(logits=logits, features=jnp.ones((6, 4)), hint=None)
  terms = dpdfd_step.generator_loss_terms(config, out)
  full = dpdfd_step.generator_loss_terms(_config(teacher_dir).step_config(), out)
  np.testing.assert_allclose(terms["one_hot"], weight * full["one_hot"], rtol=1e-6)
  assert float(full["one_hot"]) > 0
  np.testing.assert_allclose(terms["entropy"], full["entropy"])


def test_per_sample_output_grads_match_rowwise_autodiff(teacher_dir):
  step_cfg = _config(teacher_dir).step_config()
  s = jax.random.normal(jax.random.key(0), (5, 10))
  t = jax.random.normal(jax.random.key(1), (2, 5, 10))  # two teachers
  g = dpdfd_step.per_sample_output_grads(step_cfg, s, t)
  chex.assert_shape(g, (2, 5, 10))
  from dpkd_jax import losses
  for j in range(2):
    full = jax.grad(lambda s_: losses.dkd(s_, t[j], jnp.argmax(t[j], -1), alpha=1.0, beta=8.0,
                                          temperature=4.0).sum())(s)
    np.testing.assert_allclose(g[j], full, rtol=1e-5, atol=1e-6)


def test_no_gradient_reaches_the_teacher(teacher_dir):
  config = _config(teacher_dir)
  ensemble, _ = dpdfd.load_teachers(config)
  state = dpdfd.init_state(config, jax.random.key(0))
  step_cfg = config.step_config()
  z = jax.random.normal(jax.random.key(3), (16, config.latent_dim))
  gen, stu = state.generator, state.student

  def student_update_norm(teacher_params):
    from dpkd_jax.models import core
    x, _ = core.apply(gen.graphdef, gen.params, gen.batch_stats, z, train=True)
    t = dpdfd_step.teacher_logits(ensemble.graphdef, teacher_params, ensemble.batch_stats, x)
    s, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, x, train=True)
    g = dpdfd_step.per_sample_output_grads(step_cfg, s.logits, t)
    release = dpdfd_step.private_output_gradients(step_cfg, jax.random.key(4), g)
    target = jax.lax.stop_gradient(s.logits - step_cfg.gamma * release.noisy)
    return dpdfd_step.student_loss(step_cfg, s.logits, target)

  grads = jax.grad(student_update_norm)(ensemble.params)
  assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in jax.tree.leaves(grads))


def test_step_compiles_once_and_is_deterministic_per_key(teacher_dir):
  config = _config(teacher_dir)
  ensemble, _ = dpdfd.load_teachers(config)
  step_fn = chex.assert_max_traces(
      dpdfd_step.build_train_step(config.step_config(), ensemble.graphdef), n=1)
  jitted = jax.jit(step_fn, donate_argnums=0)
  out = []
  # One state object (one optax closure): a new optimizer object per state would be a new
  # static field and, rightly, a retrace. Copies, because the step donates its input.
  initial = dpdfd.init_state(config, jax.random.key(0))
  for _ in range(2):
    state = jax.tree.map(jnp.copy, initial)
    for step in range(2):
      state, metrics = jitted(state, ensemble.params, ensemble.batch_stats, jax.random.key(step))
    out.append(state)
  chex.assert_trees_all_equal(out[0].student.params, out[1].student.params)
  assert np.isfinite(float(metrics["student_loss"]))


def test_sharded_over_8_devices_equals_single_device(teacher_dir):
  config = _config(teacher_dir)
  ensemble, _ = dpdfd.load_teachers(config)
  results = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = sharding.data_mesh(devices)
    state = sharding.replicate(dpdfd.init_state(config, jax.random.key(0)), mesh)
    ens = sharding.replicate(ensemble, mesh)
    step = dpdfd_step.make_train_step(config.step_config(), ens.graphdef)
    state, _ = step(state, ens.params, ens.batch_stats, jax.random.key(7))
    results.append(jax.device_get(state.student.params))
  assert len(jax.devices()) == 8
  chex.assert_trees_all_close(results[0], results[1], rtol=2e-4, atol=2e-5)


# ----------------------------------------------------------------------------- privacy plan


def test_plan_sound_target_fits_and_paper_is_warned():
  kw = dict(delta=1e-5, steps=200, batch_size=64, l2_norm_bound=1.0)
  sound = dpdfd_privacy.plan(noise_multiplier=None, target_epsilon=5.0, **kw)
  assert sound.sound_epsilon <= 5.0 and sound.sound_epsilon > 4.9
  with pytest.warns(paper_accounting.PaperAccountingWarning):
    paper = dpdfd_privacy.plan(noise_multiplier=None, target_epsilon=5.0, accounting_mode="paper", **kw)
  assert paper.paper_epsilon == pytest.approx(5.0, rel=1e-6)
  # The paper formula needs far less noise, so the same run is far less private under sound accounting.
  assert paper.noise_multiplier < sound.noise_multiplier and paper.sound_epsilon > 5.0
  steps_plan = dpdfd_privacy.plan(noise_multiplier=sound.noise_multiplier * 2, target_epsilon=5.0, **kw)
  assert steps_plan.steps == 200  # more noise: the requested steps fit
  fewer = dpdfd_privacy.plan(noise_multiplier=sound.noise_multiplier / 2, target_epsilon=5.0, **kw)
  assert 1 <= fewer.steps < 200 and fewer.sound_epsilon <= 5.0
  assert dpdfd_privacy.plan(noise_multiplier=0.0, target_epsilon=None, **kw).sound_epsilon == math.inf


def test_paper_accounting_warns_at_plan_time_when_the_sound_epsilon_exceeds_the_target():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    plan = dpdfd_privacy.plan(noise_multiplier=None, target_epsilon=1.0, delta=1e-5, steps=200,
                              batch_size=64, l2_norm_bound=1.0, accounting_mode="paper")
  assert plan.sound_epsilon > 1.0
  named = f"sound epsilon of this run is {plan.sound_epsilon:.4g} > target_epsilon=1"
  assert any(named in str(w.message) for w in caught), [str(w.message) for w in caught]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # sound calibration never lands above the target: no warning
    dpdfd_privacy.plan(noise_multiplier=None, target_epsilon=1.0, delta=1e-5, steps=20,
                       batch_size=64, l2_norm_bound=1.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=0.0, target_epsilon=1.0), "needs noise"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(l2_norm_bound=0.0), "l2_norm_bound"),
    (dict(stability=-1e-3), "stability"),
    (dict(target_epsilon=-1.0), "target_epsilon"),
    (dict(delta=1.0), "delta"),
    (dict(accounting="moments"), "accounting"),
    (dict(bound_method="scale"), "bound_method"),
    (dict(student_loss="l1"), "student_loss"),
    (dict(one_hot_weight=-1.0), "one_hot_weight"),
    (dict(entropy_weight=-0.5), "entropy_weight"),
    (dict(dataset="imagenet"), "unknown dataset"),
    (dict(student_model="gpt"), "unknown student_model"),
    (dict(teacher_dirs=()), "teacher_dirs"),
    (dict(noise_multiplier=None, target_epsilon=None), "noise_multiplier, target_epsilon"),
])
def test_bad_config_fails_at_construction(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _config("unused", **kwargs)


def test_teacher_dataset_mismatch_fails_before_compute(teacher_dir, tmp_path):
  config = _config(teacher_dir, dataset="fashion_mnist")
  with pytest.raises(checkpoint.CheckpointMismatchError, match="dataset='digits'"):
    dpdfd.train_dpdfd(config, str(tmp_path), progress=False)
  with pytest.raises(ValueError, match="not divisible"):
    dpdfd.train_dpdfd(_config(teacher_dir, batch_size=12), str(tmp_path), progress=False)


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def finished_run(teacher_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("dpdfd"))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    results = dpdfd.train_dpdfd(_config(teacher_dir), workdir, progress=False)
  return workdir, results


def test_results_report_sound_epsilon_of_executed_noise(finished_run):
  workdir, results = finished_run
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["test_accuracy"] == results["test_accuracy"]
  expected = accounting.epsilon(accounting.dpdfd_event(noise_multiplier=10.0, batch_size=16, steps=4),
                                delta=1e-5)
  assert results["epsilon"] == pytest.approx(expected, rel=1e-9)
  assert results["paper_epsilon"] is not None and results["paper_epsilon"] < results["epsilon"]
  assert results["steps"] == 4
  assert os.path.getsize(os.path.join(workdir, "samples.png")) > 0
  # No seed given: a secret root seed, never printed, kept only in the checkpoint.
  assert results["seed"].startswith("os-entropy") and results["config"]["seed"] is None
  value, secret = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))["root_seed"]
  assert secret and str(value) not in json.dumps(results)


def test_results_keep_the_teacher_accuracy_apart_and_the_record_validates(finished_run):
  workdir, results = finished_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert "teacher_test_accuracy" not in saved  # a noiseless function of the private data
  private = saved[outputs.PRIVATE_KEY]
  assert "NOT covered by epsilon" in private["_note"]
  assert len(private["teacher_test_accuracy"]) == 1 and saved["warnings"] == []
  names = {name for name in dpdfd.metrics_lib.read_metrics(workdir)}
  assert names and all(n.startswith(("train/", "test/")) for n in names)
  record = records.read_record(os.path.join(workdir, "record.json"))
  assert record["method"] == "dpdfd" and record["dataset"] == "digits"
  assert record["test_accuracy"] == results["test_accuracy"]
  assert record["sound_epsilon"] == pytest.approx(results["epsilon"])
  assert record["paper_epsilon"] == pytest.approx(results["paper_epsilon"])
  assert record["neighbouring"] == "replace-one" and record["accounting"] == "sound"
  assert record["delta"] == 1e-5 and record["cpu_seconds"] > 0 and record["wall_seconds"] > 0


def test_cli_noise_multiplier_zero_is_allowed_and_loudly_not_private(teacher_dir, tmp_path,
                                                                     capsys):
  workdir = str(tmp_path / "run")
  dpdfd_cli.main(["--dataset=digits", f"--teacher_dirs={teacher_dir}", "--noise_multiplier=0",
                  "--student_model=lenet5_half", "--steps=2", "--batch_size=16",
                  "--eval_every=2", "--latent_dim=8", f"--workdir={workdir}", "--no_progress"])
  out = capsys.readouterr().out
  assert "WARNING: epsilon = inf (NOT private)" in out
  assert "private diagnostics (not covered by epsilon) in" in out
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["epsilon"] == math.inf and saved["warnings"] == [outputs.NOT_PRIVATE]
  assert records.read_record(os.path.join(workdir, "record.json"))["sound_epsilon"] == "inf"


def test_resume_is_bit_identical(teacher_dir, finished_run, tmp_path):
  workdir, full = finished_run
  config = _config(teacher_dir)
  # Simulate an interruption after step 2: a fresh workdir holding only the step-2 checkpoint
  # (arrays + ledger + plan + secret root seed) of the finished 4-step run, then resume: equal
  # results show the resumed run continued the original's (never printed) key streams.
  template = dpdfd.init_state(config, jax.random.key(0)).arrays()
  arrays, meta = checkpoint.restore(os.path.join(workdir, "checkpoints"), template, step=2)
  resumed_dir = str(tmp_path / "resumed")
  checkpoint.save(os.path.join(resumed_dir, "checkpoints"), 2, arrays, meta)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    resumed = dpdfd.train_dpdfd(config, resumed_dir, progress=False)
  assert resumed["test_accuracy"] == full["test_accuracy"]
  assert resumed["epsilon"] == pytest.approx(full["epsilon"], rel=1e-9)
  _, a, _ = dpdfd.load_run(resumed_dir)
  _, b, _ = dpdfd.load_run(workdir)
  chex.assert_trees_all_equal(a.student.params, b.student.params)
  chex.assert_trees_all_equal(a.generator.params, b.generator.params)


def test_resume_with_spent_budget_raises(teacher_dir, tmp_path):
  config = _config(teacher_dir, target_epsilon=30.0, noise_multiplier=10.0, steps=50, eval_every=50)
  plan = config.plan()
  spent = ledger_lib.PrivacyLedger(target_epsilon=30.0, delta=1e-5)
  spent.record(accounting.dpdfd_event(noise_multiplier=10.0, batch_size=16, steps=plan.steps), step=0)
  state = dpdfd.init_state(config, jax.random.key(0))
  checkpoint.save(os.path.join(str(tmp_path), "checkpoints"), 0, state.arrays(),
                  {"config": dpdfd._config_json(config), "step": 0, "ledger": spent.to_json()})
  with pytest.raises(ledger_lib.BudgetExceededError):
    dpdfd.train_dpdfd(config, str(tmp_path), progress=False)


def test_sample_release(finished_run, tmp_path):
  workdir, _ = finished_run
  path = dpdfd.sample(workdir, 37, seed=0, out_path=str(tmp_path / "syn.npz"))
  with np.load(path) as d:
    assert d["x"].shape == (37, 28, 28, 1) and d["x"].dtype == np.uint8
    assert d["y"].shape == (37,) and d["y"].min() >= 0 and d["y"].max() < 10


def test_multi_teacher_ensemble_step(teacher_dir):
  config = _config(teacher_dir, teacher_dirs=(teacher_dir, "b", "c"))  # 3 teachers
  ensemble = dpdfd_step.TeacherEnsemble.stack([teacher_lib.load_teacher(teacher_dir).parts] * 3)
  assert ensemble.size == 3
  step_cfg = config.step_config()
  # Three identical teachers: the aggregate's noiseless part equals one teacher's bounded rows,
  # and the noise on the mean is sigma*C/n.
  grads = jnp.stack([jax.random.normal(jax.random.key(5), (16, 10))] * 3)
  release = dpdfd_step.private_output_gradients(step_cfg, jax.random.key(6), grads)
  assert float(release.noise_stddev) == pytest.approx(10.0 / 3)
  assert float(release.accounting_noise_multiplier) == pytest.approx(10.0 / (2 * 4))
  step = dpdfd_step.make_train_step(step_cfg, ensemble.graphdef)
  state, metrics = step(dpdfd.init_state(config, jax.random.key(0)), ensemble.params,
                        ensemble.batch_stats, jax.random.key(1))
  assert np.isfinite(float(metrics["student_loss"]))
  # Accounting: a record in one shard of one partition (m = 1) -> the one-teacher event; by
  # default (no cards) every teacher may hold it: sensitivity 3x.
  single = _config(teacher_dir).plan().sound_epsilon
  assert config.plan(teachers_per_record=1).sound_epsilon == pytest.approx(single)
  worst = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=10.0, batch_size=16, steps=4, num_teachers=3, teachers_per_record=3),
      delta=1e-5)
  assert config.plan().sound_epsilon == pytest.approx(worst) and worst > 2 * single


def test_the_same_teacher_twice_is_refused(teacher_dir, tmp_path):
  # `--teacher_dirs=T,T` used to run with the one-teacher epsilon (sensitivity 2x reported 1x).
  copied = str(tmp_path / "copy")
  shutil.copytree(teacher_dir, copied)
  for dirs in ((teacher_dir, teacher_dir), (teacher_dir, copied)):
    with pytest.raises(errors.UserError, match="twice|same teacher"):
      dpdfd.train_dpdfd(_config(teacher_dir, teacher_dirs=dirs), str(tmp_path / "run"),
                        progress=False)
  assert not os.path.exists(tmp_path / "run" / "results.json")


def test_overlapping_teachers_are_charged_per_record(teacher_dir, tmp_path, capsys):
  # Two whole-data teachers (another seed): one record reaches both, so each summed row
  # moves by 4C and epsilon is that of sigma / 2.
  other = str(tmp_path / "other")
  teacher_lib.train_teacher(teacher_lib.TeacherConfig(
      dataset="digits", model="lenet5", epochs=1, batch_size=64, learning_rate=3e-3, seed=1),
      other, progress=False)
  config = _config(teacher_dir, teacher_dirs=(teacher_dir, other), steps=2)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    results = dpdfd.train_dpdfd(config, str(tmp_path / "run"), progress=False)
  expected = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=10.0, batch_size=16, steps=2, num_teachers=2, teachers_per_record=2),
      delta=1e-5)
  one_teacher = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=10.0, batch_size=16, steps=2), delta=1e-5)
  assert results["epsilon"] == pytest.approx(expected, rel=1e-9) and expected > one_teacher
  assert results["teachers_per_record"] == 2
  assert "may reach 2 teachers" in capsys.readouterr().out


def test_cifar10_runs_end_to_end_on_mock_data(tmp_path):
  # The README's CIFAR-10 command needs tfds online; here tfds serves random mock images of
  # the real shapes (32x32x3, 10 classes), so the whole path (teacher, 3-channel generator,
  # student, accounting, sample grid) runs offline.
  data.clear_cache()
  try:
    with tfds.testing.mock_data(num_examples=64):
      teacher_dir = str(tmp_path / "teacher")
      teacher_lib.train_teacher(teacher_lib.TeacherConfig(
          dataset="cifar10", model="lenet5", epochs=1, batch_size=32, learning_rate=3e-3),
          teacher_dir, progress=False)
      config = dpdfd.DPDFDConfig(dataset="cifar10", teacher_dirs=(teacher_dir,),
                                 student_model="lenet5_half", generator_channels=8,
                                 noise_multiplier=10.0, steps=2, batch_size=16, eval_every=2,
                                 latent_dim=8)
      results = dpdfd.train_dpdfd(config, str(tmp_path / "run"), progress=False)
  finally:
    data.clear_cache()
  assert 0.0 <= results["test_accuracy"] <= 1.0
  assert 0 < results["epsilon"] < math.inf
  assert os.path.exists(tmp_path / "run" / "samples.png")
