"""RONA's plan: σ calibrated for a target, the non-private plan, and the single source of σ.

The single-source tests: the private step built from a plan releases noise of std σB with σ of
that plan (and twice it from a plan with 2σ), and after a tiny run every event of
privacy_ledger.json is `plan.event(queries_per_epoch)` of the plan saved in the checkpoint.
Tolerances: ε recomputed from the same events agrees to 1e-9 (relative); σB in float32 to
1e-6 (relative).
"""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax.methods import rona
from dpkd_jax.methods.rona import sanitize
from dpkd_jax.methods.rona import step
from dpkd_jax.methods.rona import student
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train.state import TrainState

INFO = data.DATASETS["digits"]


def _config(**kw):
  base = dict(noise_multiplier=2.0, dataset="digits", teacher_model="lenet5_half",
              student_model="lenet5_half", teacher_epochs=1, teacher_batch_size=64,
              hint_epochs=1, rounds=1, self_learning_epochs=1, distillation_epochs=1,
              num_query_samples=64, batch_size=32, self_learning_batch_size=64, seed=0)
  base.update(kw)
  return rona.RONAConfig(**base)


def test_target_epsilon_calibrates_sigma():
  plan = rona.make_plan(_config(noise_multiplier=None, target_epsilon=5.0,
                                num_query_samples=640))
  assert plan.releases == 40 and plan.queries_per_epoch == 20
  assert 4.95 <= plan.sound_epsilon <= 5.0 and plan.budget_epsilon == 5.0
  assert plan.sound_epsilon == pytest.approx(accounting.epsilon(accounting.rona_event(
      noise_multiplier=plan.noise_multiplier, num_queries=40), delta=1e-5))
  assert plan.sound_epsilon == pytest.approx(
      accounting.epsilon(plan.event(plan.releases), delta=1e-5), rel=1e-9)


def test_non_private_plan_reports_infinite_epsilon_and_no_paper_figure():
  plan = rona.make_plan(_config(noise_multiplier=0.0, bound_mode="none"))
  assert plan.sound_epsilon == math.inf and plan.paper_epsilon is None
  # Nothing finite to keep: no budget, no ledger.
  assert plan.budget_epsilon is None and plan.new_ledger() is None


def test_target_epsilon_without_queries_is_refused():
  with pytest.raises(ValueError, match="target_epsilon needs queries"):
    rona.make_plan(_config(noise_multiplier=None, target_epsilon=1.0, hint_epochs=0,
                           distillation_epochs=0))


def test_plan_fields_and_its_results_names():
  plan = rona.make_plan(_config(bound_mode="fixed", hint_l2_clip_norm=5.0, distill_l2_clip_norm=0.5))
  assert plan.sanitize_config("hint") == sanitize.SanitizeConfig(
      noise_multiplier=2.0, bound_mode="fixed", l2_bound=5.0)
  assert plan.sanitize_config("distill").l2_bound == 0.5
  assert plan.results_fields() == {
      "num_queries": 4, "queries_per_epoch": 2, "noise_multiplier": 2.0,
      "planned_epsilon": plan.sound_epsilon, "accounting": "sound",
      "paper_epsilon_composed": plan.paper_epsilon,
      "paper_epsilon_per_query": plan.paper_epsilon_per_query,
      "paper_epsilon_warning": plan.paper_epsilon_warning,
      "budget_epsilon": plan.sound_epsilon}
  assert plan.to_json()["plan"] == "RONAPlan" and plan.to_json()["releases"] == 4
  with pytest.raises(ValueError, match="needs noise_multiplier=0"):
    dataclasses.replace(plan, bound_mode="none", hint_l2_clip_norm=None, distill_l2_clip_norm=None)


def test_paper_figures_beside_the_sound_one():
  # Theorem 2 reconstruction: rho = T / (2 sigma^2) at sensitivity B; per query the classic
  # Gaussian bound. T = 4 queries at sigma = 2.
  plan = rona.make_plan(_config())
  rho = 4 / (2 * 2.0**2)
  assert plan.paper_epsilon == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e5)))
  assert plan.paper_epsilon_per_query == pytest.approx(math.sqrt(2 * math.log(1.25e5)) / 2.0)
  # Sensitivity 2B, not B: the sound figure of the same noise is larger.
  assert plan.sound_epsilon > plan.paper_epsilon


def test_paper_accounting_calibrates_sigma_by_theorem_2_and_keeps_the_sound_epsilon():
  config = _config(noise_multiplier=None, target_epsilon=5.0, num_query_samples=640,
                   accounting="paper")
  with pytest.warns(UserWarning, match="NOT a valid guarantee"):
    plan = rona.make_plan(config)
  sound = rona.make_plan(dataclasses.replace(config, accounting="sound"))
  assert plan.accounting == "paper" and plan.paper_epsilon == pytest.approx(5.0, rel=1e-9)
  # Half the sound sigma or so (sensitivity B instead of 2B); the ledger keeps the sound figure
  # of the noise executed, above the target, and never less than what it will spend.
  assert plan.noise_multiplier < sound.noise_multiplier
  assert plan.sound_epsilon == pytest.approx(accounting.epsilon(accounting.rona_event(
      noise_multiplier=plan.noise_multiplier, num_queries=40), delta=1e-5))
  assert plan.sound_epsilon > 5.0 and plan.budget_epsilon == plan.sound_epsilon


def test_paper_accounting_needs_a_target():
  with pytest.raises(ValueError, match="accounting='paper' chooses sigma"):
    _config(accounting="paper")
  with pytest.raises(ValueError, match="accounting"):
    _config(noise_multiplier=None, target_epsilon=1.0, accounting="papers")


class _Tiny(nnx.Module):
  """A two-layer classifier whose hint is its (B, 8) hidden layer: cheap to compile."""

  def __init__(self, seed: int):
    rngs = nnx.Rngs(seed)
    self.hidden, self.head = nnx.Linear(28 * 28, 8, rngs=rngs), nnx.Linear(8, 10, rngs=rngs)

  def __call__(self, x, *, train=False):
    del train
    hint = self.hidden(x.reshape(x.shape[0], -1))  # (B, 8)
    return core.ClassifierOutput(self.head(hint), hint, hint)


def test_the_step_takes_sigma_from_the_plan():
  plan = rona.make_plan(_config(bound_mode="fixed", hint_l2_clip_norm=1.0, distill_l2_clip_norm=1.0))
  teacher = core.split(_Tiny(0))
  hinted = core.split(student.create_hinted_student(
      _Tiny(1), input_shape=(28, 28, 1), teacher_hint_shape=(8,), rngs=nnx.Rngs(2)))
  images = jnp.asarray(data.load("digits", "train").images[:8])
  kernels = {}
  for sigma in (plan.noise_multiplier, 2 * plan.noise_multiplier):
    train_step = jax.jit(step.build_train_step(
        dataclasses.replace(plan, noise_multiplier=sigma), "hint", temperature=4.0,
        info=INFO, teacher_graphdef=teacher.graphdef, aux_graphdef=None))
    state = TrainState.create(hinted, optax.sgd(0.1))
    state, _, metrics = train_step(
        state, step.FrozenModel(teacher.params, teacher.batch_stats), None,
        sanitize.BoundState.zeros(), images, np.ones((8,), bool), jax.random.key(0))
    np.testing.assert_allclose(metrics["noise_stddev"], sigma * 1.0, rtol=1e-6)
    kernels[sigma] = state.params["adapter"]["layer"]["kernel"]
  # Same key, same data: only σ changed, and the released noise (so the update) with it.
  assert not np.allclose(*kernels.values())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("rona_tiny"))
  # The cheapest run that charges the ledger: fixed bounds (no auxiliary teacher), its first
  # unit only (one hint epoch of two queries); the full schedule is test_rona_run.py's.
  config = _config(bound_mode="fixed", hint_l2_clip_norm=5.0, distill_l2_clip_norm=0.5)
  return workdir, rona.train_rona(config, workdir, stop_after_units=1, progress=False,
                                  latency_seconds=0.0)


def test_ledger_events_are_the_saved_plans_events(tiny_run):
  workdir, results = tiny_run
  saved = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))["plan"]
  assert saved.pop("plan") == "RONAPlan"
  plan = rona.RONAPlan(**saved)
  ledger = ledger_lib.PrivacyLedger.load(os.path.join(workdir, "privacy_ledger.json"))
  assert [e.note for e in ledger.entries] == ["hint round 0 epoch 0"]
  for entry in ledger.entries:
    assert ledger_lib.event_to_dict(entry.event) == ledger_lib.event_to_dict(
        plan.event(plan.queries_per_epoch))
  assert ledger.target_epsilon == plan.budget_epsilon and ledger.delta == plan.delta
  assert results["num_queries_executed"] == plan.queries_per_epoch == 2
  assert results["epsilon"] == pytest.approx(
      accounting.epsilon(plan.event(2), delta=plan.delta), rel=1e-9)
  assert results["noise_multiplier"] == plan.noise_multiplier == 2.0
