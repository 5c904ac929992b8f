"""dpkd_jax.methods.dpdfd.privacy: the plans, and σ from one source (the step and the ledger)."""

import dataclasses
import json
import math
import os
import warnings

from dp_accounting import dp_event
import jax
import numpy as np
import pytest
from flax import nnx
from dpdfd_fixtures import dpdfd_config

from dpkd_jax import models
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.privacy import secure_gaussian
from dpkd_jax.train import checkpoint
from dpkd_jax.train import ledger_file
from experiments import dpdfd as dpdfd_cli


def _config(**kw):
  base = dict(dataset="digits", teacher_dirs=("unused",), student_model="lenet5_half",
              noise_multiplier=10.0, steps=4, batch_size=16, eval_every=2, latent_dim=8)
  return dpdfd_config(**{**base, **kw})


# ----------------------------------------------------------------------------- resolution


def test_plan_sound_target_fits_and_paper_is_warned():
  kw = dict(steps=200, batch_size=64)
  sound = dpdfd.make_plan(_config(noise_multiplier=None, target_epsilon=5.0, **kw))
  assert sound.sound_epsilon <= 5.0 and sound.sound_epsilon > 4.9
  with pytest.warns(paper_accounting.PaperAccountingWarning):
    paper = dpdfd.make_plan(_config(noise_multiplier=None, target_epsilon=5.0,
                                    accounting="paper", **kw))
  assert paper.paper_epsilon == pytest.approx(5.0, rel=1e-6)
  # The paper formula needs far less noise, so the same run is far less private (sound).
  assert paper.noise_multiplier < sound.noise_multiplier and paper.sound_epsilon > 5.0
  more = dpdfd.make_plan(_config(noise_multiplier=sound.noise_multiplier * 2,
                                 target_epsilon=5.0, **kw))
  assert more.releases == 200  # more noise: the requested steps fit
  fewer = dpdfd.make_plan(_config(noise_multiplier=sound.noise_multiplier / 2,
                                  target_epsilon=5.0, **kw))
  assert 1 <= fewer.releases < 200 and fewer.sound_epsilon <= 5.0
  assert dpdfd.make_plan(_config(noise_multiplier=0.0, **kw)).sound_epsilon == math.inf


def test_paper_accounting_warns_at_plan_time_when_the_sound_epsilon_exceeds_the_target():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    plan = dpdfd.make_plan(_config(noise_multiplier=None, target_epsilon=1.0, steps=200,
                                   batch_size=64, accounting="paper"))
  assert plan.sound_epsilon > 1.0
  named = f"sound epsilon of this run is {plan.sound_epsilon:.4g} > target_epsilon=1"
  assert any(named in str(w.message) for w in caught), [str(w.message) for w in caught]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # sound calibration never lands above the target: no warning
    dpdfd.make_plan(_config(noise_multiplier=None, target_epsilon=1.0, steps=20, batch_size=64))


def test_budget_is_the_target_in_sound_mode_else_the_planned_sound_epsilon():
  assert dpdfd.make_plan(_config(target_epsilon=30.0, steps=50)).budget_epsilon == 30.0
  planned = dpdfd.make_plan(_config())
  assert planned.budget_epsilon == planned.sound_epsilon < math.inf
  with pytest.warns(paper_accounting.PaperAccountingWarning):
    paper = dpdfd.make_plan(_config(noise_multiplier=None, target_epsilon=1.0,
                                    accounting="paper"))
  assert paper.budget_epsilon == paper.sound_epsilon > 1.0
  nonprivate = dpdfd.make_plan(_config(noise_multiplier=0.0))
  assert nonprivate.budget_epsilon is None and nonprivate.new_ledger() is None
  assert nonprivate.paper_epsilon is None


def test_event_is_the_executed_noise_per_record_reach():
  config = _config(teacher_dirs=("a", "b", "c"))
  plan = dpdfd.make_plan(config)  # no cards: every teacher may hold a record (m = n = 3)
  assert (plan.num_teachers, plan.teachers_per_record, plan.batch_size) == (3, 3, 16)
  assert plan.event(2) == accounting.dpdfd_event(noise_multiplier=10.0, batch_size=16, steps=2,
                                                 num_teachers=3, teachers_per_record=3)
  worst = accounting.epsilon(plan.event(4), delta=1e-5)
  single = dpdfd.make_plan(_config()).sound_epsilon
  assert plan.sound_epsilon == pytest.approx(worst) and worst > 2 * single
  # A record in one shard of one partition (m = 1): the one-teacher event.
  assert dpdfd.make_plan(config, teachers_per_record=1).sound_epsilon == pytest.approx(single)
  # A stacked ensemble: n is the loaded stack's size, which the config does not hold.
  stacked = _config(teacher_dirs=(), teacher_ensemble_dir="ens")
  with pytest.raises(ValueError, match="pass num_teachers"):
    dpdfd.make_plan(stacked)
  plan = dpdfd.make_plan(stacked, 1, num_teachers=3)
  assert (plan.num_teachers, plan.teachers_per_record) == (3, 1)
  assert plan.sound_epsilon == pytest.approx(single)


def test_disagreement_probes_are_rows_of_the_release_and_cost_epsilon():
  plain = dpdfd.make_plan(_config())
  config = _config(generator_objective="disagreement", bound_method="clip", probe_directions=3)
  plan = dpdfd.make_plan(config)
  assert (plan.probes_per_sample, plan.rows_per_step) == (3, 64)
  assert plan.event(2) == accounting.dpdfd_event(noise_multiplier=10.0, batch_size=64, steps=2,
                                                 num_teachers=1, teachers_per_record=1)
  assert plan.sound_epsilon > plain.sound_epsilon
  # A target ε calibrates σ for the rows actually released: larger than without probes.
  target = dict(noise_multiplier=None, target_epsilon=5.0)
  assert (dpdfd.make_plan(_config(**target, generator_objective="disagreement",
                                  bound_method="clip")).noise_multiplier
          > dpdfd.make_plan(_config(**target)).noise_multiplier)
  # The paper's Theorem 3 counts steps, not rows.
  assert plan.paper_epsilon == pytest.approx(plain.paper_epsilon)
  # The probe count means nothing to the paper generator.
  assert dpdfd.make_plan(_config(probe_directions=3)).rows_per_step == 16


def test_direct_plan_is_not_private():
  config = dpdfd.DirectConfig(dataset="digits", noise_multiplier=5.0, steps=3)
  plan = dpdfd.make_direct_plan(config)
  assert plan.releases == 3 and plan.noise_multiplier == 5.0 and not plan.private
  assert accounting.epsilon(plan.event(3), delta=1e-5) == math.inf == plan.sound_epsilon
  with pytest.warns(paper_accounting.PaperAccountingWarning):
    expected = paper_accounting.paper_dpdfd_epsilon(noise_multiplier=5.0, l2_clip_norm=1.0,
                                                    steps=3, delta=1e-5)
  assert plan.paper_epsilon == pytest.approx(expected)


# ----------------------------------------------------------------------------- one source


def _spy_on_releases(monkeypatch):
  """Every release of A_{C,σ} the (jitted) step makes, appended as NumPy to the list returned."""
  released = []
  real = step_lib.private_output_gradients

  def spy(plan, key, grads):
    out = real(plan, key, grads)
    jax.debug.callback(lambda noisy: released.append(np.asarray(noisy)), out.noisy)
    return out

  monkeypatch.setattr(step_lib, "private_output_gradients", spy)
  return released


def test_the_step_takes_its_noise_from_the_plan(monkeypatch):
  # Build the step from the plan and from copies with another sigma: with the same key, the
  # released rows move by exactly the plan's sigma times one noise draw.
  config = _config(generator_channels=8)
  info = config.info
  teacher = core.split(models.create_classifier("lenet5", num_classes=info.num_classes,
                                                input_shape=info.image_shape,
                                                rngs=nnx.Rngs(0)))
  ensemble = dpdfd.TeacherEnsemble.stack([teacher])
  plan = dpdfd.make_plan(config)
  released = _spy_on_releases(monkeypatch)
  state = dpdfd.init_state(config, jax.random.key(0))
  for sigma in (0.0, plan.noise_multiplier, 2 * plan.noise_multiplier):
    step = jax.jit(dpdfd.build_train_step(dataclasses.replace(plan, noise_multiplier=sigma),
                                          config, ensemble.graphdef))
    _, metrics = step(state, ensemble.params, ensemble.batch_stats, jax.random.key(1))
    assert float(metrics["noise_std"]) == pytest.approx(sigma * plan.l2_clip_norm)
  jax.effects_barrier()
  bounded, once, twice = released
  assert np.abs(once - bounded).max() > 1.0
  np.testing.assert_allclose(twice - bounded, 2 * (once - bounded), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def finished_run(teacher_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("dpdfd"))
  config = _config(teacher_dirs=(teacher_dir,), steps=3, target_epsilon=50.0)
  return workdir, dpdfd.train_dpdfd(config, workdir, progress=False)


def test_the_ledger_charges_the_events_of_the_saved_plan(finished_run):
  workdir, results = finished_run
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  saved = dict(meta["plan"])
  assert saved.pop("plan") == "DPDFDPlan"
  plan = dpdfd.DPDFDPlan(**saved)
  with open(os.path.join(workdir, ledger_file.FILE_NAME)) as f:
    entries = json.load(f)["entries"]
  chunks = [2, 1]  # eval_every = 2 over 3 steps
  assert [e["event"] for e in entries] == [
      ledger_lib.event_to_dict(plan.event(n)) for n in chunks]
  assert results["noise_multiplier"] == plan.noise_multiplier
  assert results["epsilon"] == pytest.approx(plan.sound_epsilon, rel=1e-9)
  assert results["paper_epsilon"] == plan.paper_epsilon and plan.budget_epsilon == 50.0
  assert json.loads(meta["ledger"])["target_epsilon"] == plan.budget_epsilon


# ----------------------------------------------------------------------------- secure noise


def test_secure_plan_carries_the_mode_and_its_zcdp_event():
  plan = dpdfd.make_plan(_config(secure_noise=True))
  assert plan.secure_noise and plan.num_outputs == 10 and plan.grid_bits is None
  event = plan.event(3)
  assert isinstance(event.event, dp_event.ZCDpEvent) and event.count == 3
  assert event == accounting.dpdfd_event(noise_multiplier=10.0, batch_size=16, steps=3,
                                         secure_noise=True, num_outputs=10)
  float_plan = dpdfd.make_plan(_config())
  assert plan.sound_epsilon >= float_plan.sound_epsilon
  assert plan.sound_epsilon == accounting.epsilon(plan.event(4), delta=plan.delta)
  # The default plan saves what it saved before the mode existed; the secure one names it.
  assert "secure_noise" not in float_plan.to_json() and plan.to_json()["secure_noise"]
  assert dpdfd.DPDFDPlan(**{k: v for k, v in plan.to_json().items() if k != "plan"}) == plan


def test_secure_calibration_meets_the_target():
  for kw in (dict(noise_multiplier=None), dict(noise_multiplier=30.0, steps=400)):
    plan = dpdfd.make_plan(_config(secure_noise=True, target_epsilon=8.0, **kw))
    assert plan.sound_epsilon <= 8.0 and plan.budget_epsilon == 8.0
    assert plan.sound_epsilon > 7.0  # calibrated, not just safe


def test_secure_noise_flags_are_checked():
  with pytest.raises(ValueError, match="secure_noise"):
    _config(secure_noise=True, noise_multiplier=0.0)
  with pytest.raises(ValueError, match="secure_grid_bits"):
    _config(secure_grid_bits=8)
  assert _config(secure_noise=True, secure_grid_bits=8).secure_grid_bits == 8
  assert _config().to_json()["secure_noise"] is False  # saved, and read back


def test_cli_secure_noise_run_charges_the_zcdp_events(teacher_dir, tmp_path, monkeypatch):
  released = _spy_on_releases(monkeypatch)
  workdir = str(tmp_path / "run")
  dpdfd_cli.main(["--dataset=digits", f"--teacher_dirs={teacher_dir}", "--noise_multiplier=20",
                  "--secure_noise", "--student_model=lenet5_half", "--steps=2",
                  "--batch_size=16", "--eval_every=2", "--latent_dim=8", "--generator_channels=8",
                  f"--workdir={workdir}", "--no_progress"])
  jax.effects_barrier()
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  saved = dict(meta["plan"])
  saved.pop("plan")
  plan = dpdfd.DPDFDPlan(**saved)
  assert plan.secure_noise
  with open(os.path.join(workdir, ledger_file.FILE_NAME)) as f:
    entries = json.load(f)["entries"]
  assert [e["event"] for e in entries] == [ledger_lib.event_to_dict(plan.event(2))]
  assert entries[0]["event"]["event"]["type"] == "zcdp"
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  continuous = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=20.0, batch_size=16, steps=2), delta=1e-5)
  assert results["epsilon"] == pytest.approx(plan.sound_epsilon) and (
      results["epsilon"] >= continuous)
  grid = secure_gaussian.choose_grid(noise_multiplier=20.0, bound=plan.l2_clip_norm)
  for rows in released:  # every release lies on the grid of the plan's sigma
    units = rows.astype(np.float64) / grid.step
    np.testing.assert_allclose(units, np.round(units), atol=1e-3)
