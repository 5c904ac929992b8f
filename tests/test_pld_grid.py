"""Tests for dpkd_jax.privacy.pld_grid (through accounting.epsilon): bounded memory at any
σ >= 0.01, accuracy within 1% of a fine grid, and soundness against dp_accounting's own PLDs."""

import json
import math
import os
import subprocess
import sys
import textwrap

from dp_accounting import dp_event
from dp_accounting import privacy_accountant
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution
import pytest

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import gaussian_exact
from dpkd_jax.privacy import pld_grid

DELTA = 1e-5
_REL = privacy_accountant.NeighboringRelation
_RELATIONS = {accounting.ADD_REMOVE: _REL.ADD_OR_REMOVE_ONE,
              accounting.REPLACE_ONE: _REL.REPLACE_ONE}


def _direct_dpsgd(q, z, steps, relation, interval):
  """dp_accounting's PLDAccountant on T Poisson-sampled Gaussians at a fixed grid."""
  acc = pld_privacy_accountant.PLDAccountant(_RELATIONS[relation],
                                             value_discretization_interval=interval)
  acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
  return acc.get_epsilon(DELTA)


@pytest.mark.parametrize("relation", [accounting.ADD_REMOVE, accounting.REPLACE_ONE])
def test_small_epsilon_dpsgd_is_within_one_percent_of_a_fine_grid(relation):
  # The case: at the old fixed 1e-3 grid ε was 42% above the 1e-4 grid.
  q, z, steps = 0.0011, 2.72, 6089
  ours = accounting.epsilon(accounting.dpsgd_event(
      noise_multiplier=z, sampling_rate=q, steps=steps, relation=relation), delta=DELTA)
  fine = _direct_dpsgd(q, z, steps, relation, 1e-4)
  finer = _direct_dpsgd(q, z, steps, relation, 2e-5)
  assert fine * (1 - 1e-9) <= ours <= fine * 1.01
  assert finer * (1 - 1e-9) <= ours <= finer * 1.01  # still sound, still within 1%
  coarse = _direct_dpsgd(q, z, steps, relation, 1e-3)
  assert coarse > 1.1 * ours  # what a fixed 1e-3 grid reports


@pytest.mark.parametrize("relation", [accounting.ADD_REMOVE, accounting.REPLACE_ONE])
@pytest.mark.parametrize("q,z,steps", [(0.01, 1.0, 1000), (0.05, 3.0, 200)])
def test_dpsgd_is_sound_and_close_to_the_fine_grid(q, z, steps, relation):
  ours = accounting.epsilon(accounting.dpsgd_event(
      noise_multiplier=z, sampling_rate=q, steps=steps, relation=relation), delta=DELTA)
  fine = _direct_dpsgd(q, z, steps, relation, 1e-4)
  assert fine * (1 - 1e-6) <= ours <= fine * 1.01


def _rr_pld(eps0, n, interval):
  p = 2 / (math.exp(eps0) + 1)
  return privacy_loss_distribution.from_randomized_response(
      noise_parameter=p, num_buckets=2, value_discretization_interval=interval,
      neighboring_relation=_REL.REPLACE_ONE).self_compose(n)


def test_mixed_trees_are_sound_against_fine_grid_plds():
  # A pessimistic grid overstates ε by at most one step per composed mechanism: ours may be
  # below the fine grid by that much (it is exact for Gaussians), never by more.
  interval = 2e-5
  laplace = privacy_loss_distribution.from_laplace_mechanism(
      parameter=1 / 0.3, value_discretization_interval=interval).self_compose(5)
  gaussian = privacy_loss_distribution.from_gaussian_mechanism(
      standard_deviation=100.0 / 32 / math.sqrt(4), value_discretization_interval=interval)
  cases = [
      (accounting.laplace_counts_event(epsilon_per_round=0.3, rounds=5), laplace, 5),
      (dp_event.ComposedDpEvent([
          accounting.srr_event(epsilon_per_query=0.5, num_queries=10),
          accounting.srr_event(epsilon_per_query=1.0, num_queries=10)]),
       _rr_pld(0.5, 10, interval).compose(_rr_pld(1.0, 10, interval)), 20),
      (dp_event.ComposedDpEvent([
          accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256, steps=4),
          accounting.srr_event(epsilon_per_query=0.5, num_queries=10)]),
       gaussian.compose(_rr_pld(0.5, 10, interval)), 11),
  ]
  for event, pld, mechanisms in cases:
    fine = pld.get_epsilon_for_delta(DELTA)
    ours = accounting.epsilon(event, delta=DELTA)
    assert fine - mechanisms * interval <= ours <= fine * 1.01, event


_MEMORY_SCRIPT = textwrap.dedent("""
    import json, resource
    from dp_accounting import dp_event
    from dpkd_jax.privacy import accounting, calibration, ledger as ledger_lib

    def vm_bytes():
      with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

    # <= 1 GiB more than what the imports (JAX included) already mapped.
    limit = vm_bytes() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = {}
    for sigma in (1.0, 0.3, 0.01):
      run = accounting.dpdfd_event(noise_multiplier=sigma, batch_size=256, steps=100)
      out[f"dpdfd {sigma}"] = accounting.epsilon(run, delta=1e-5)
      ledger = ledger_lib.PrivacyLedger(target_epsilon=1e300, delta=1e-5)
      for step in range(3):
        ledger.record(accounting.dpdfd_event(noise_multiplier=sigma, batch_size=256, steps=1),
                      step=step)
      out[f"ledger {sigma}"] = ledger.spent_epsilon()
      if sigma == 1.0:
        continue  # The mixed tree's cost does not grow as σ falls: two values suffice.
      out[f"mixed {sigma}"] = accounting.epsilon(dp_event.ComposedDpEvent([
          run, accounting.laplace_counts_event(epsilon_per_round=0.5, rounds=3),
          accounting.srr_event(epsilon_per_query=0.2, num_queries=50, num_classes=10),
          accounting.srr_event(epsilon_per_query=0.1, num_queries=50)]), delta=1e-5)
    for z in (0.01, 0.3):
      for relation in ("add-remove", "replace-one"):
        out[f"dpsgd {z} {relation}"] = accounting.epsilon(accounting.dpsgd_event(
            noise_multiplier=z, sampling_rate=256 / 60000, steps=2344, relation=relation),
            delta=1e-5)
    out["max steps"] = calibration.calibrate_dpdfd_steps(
        target_epsilon=1e6, delta=1e-5, noise_multiplier=0.3, batch_size=256,
        max_steps=100_000)
    print(json.dumps(out))
""")


def test_every_cli_epsilon_fits_in_one_gigabyte():
  """σ down to 0.01 under a 1 GiB address-space limit (the old fixed grid asked 18 GB at
  σ = 1 and 764 GiB at σ = 0.01). The timeout is a hang guard, not a timing assertion."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
  done = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True,
                        timeout=600, env=env, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  for sigma in (1.0, 0.3, 0.01):
    z = sigma / (2 * math.sqrt(256))
    assert out[f"dpdfd {sigma}"] == pytest.approx(
        gaussian_exact.epsilon_for_delta(DELTA, z / math.sqrt(100)), rel=1e-12)
    assert out[f"ledger {sigma}"] == pytest.approx(
        gaussian_exact.epsilon_for_delta(DELTA, z / math.sqrt(3)), rel=1e-12)
    if sigma < 1:
      assert out[f"dpdfd {sigma}"] < out[f"mixed {sigma}"] < math.inf
  for z in (0.01, 0.3):
    assert out[f"dpsgd {z} add-remove"] < out[f"dpsgd {z} replace-one"] < math.inf
  assert 1 <= out["max steps"] < 100_000


def test_noise_too_small_for_any_grid_falls_back_to_a_sound_closed_form():
  gaussian = accounting.dpdfd_event(noise_multiplier=1e-4, batch_size=256, steps=100)
  laplace = accounting.laplace_counts_event(epsilon_per_round=0.5, rounds=3)
  with pytest.raises(pld_grid.GridTooCoarse):
    pld_grid.evaluate([("gaussian", 1e-4 / 32 / 10), ("laplace", 2.0, 3)],
                      lambda pld: pld.get_epsilon_for_delta(DELTA), None)
  alone = accounting.epsilon(gaussian, delta=DELTA)
  both = accounting.epsilon(dp_event.ComposedDpEvent([gaussian, laplace]), delta=DELTA)
  assert alone < both <= alone + 1.5  # Laplace charged its pure ε = 3 · 0.5
  assert accounting.delta_for_epsilon(dp_event.ComposedDpEvent([gaussian, laplace]),
                                      epsilon=both) <= DELTA


def test_explicit_interval_is_used_as_given():
  event = accounting.dpsgd_event(noise_multiplier=2.72, sampling_rate=0.0011, steps=6089,
                                 relation="add-remove")
  for interval in (1e-3, 1e-2):
    assert accounting.epsilon(event, delta=DELTA, value_discretization_interval=interval) == (
        pytest.approx(_direct_dpsgd(0.0011, 2.72, 6089, accounting.ADD_REMOVE, interval),
                      rel=1e-9))


def test_discrete_laplace_width_is_its_loss_range():
  # dp_accounting's tail object for the discrete Laplace reports an empty x range; the width
  # is 2·a·Δ (losses a·(|x − Δ| − |x|)), so the pilot grid of a composition stays small.
  floor, width = pld_grid._widths(("discrete_laplace", 0.25, 4, 1))
  assert width == 2.0 and floor == 2.0 / pld_grid.MAX_POINTS
  floor, width = pld_grid._widths(("discrete_laplace", 0.25, 4, 40))
  assert 2.0 < width <= 40 * 2.0 + 1.0


def _pmf_state(pld):
  # pylint: disable=protected-access
  pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
  return [(dense._probs.copy(), dense._lower_loss, dense._infinity_mass)
          for dense in (pmf.to_dense_pmf() for pmf in pmfs)]


@pytest.mark.parametrize("part", [("poisson_gaussian", 0.02, 1.1, 50, _REL.REPLACE_ONE),
                                  ("poisson_gaussian", 0.02, 1.1, 50, _REL.ADD_OR_REMOVE_ONE),
                                  ("poisson_laplace", 0.05, 3.0, 20)])
def test_a_memoized_subsampled_step_is_reused_unchanged_and_gives_the_same_epsilon(part):
  pld_grid._subsampled_pld.cache_clear()
  read = lambda pld: pld.get_epsilon_for_delta(DELTA)  # noqa: E731
  first = pld_grid.evaluate([part], read, interval=None)
  single = pld_grid.single_pld(part, 1e-3)
  before = _pmf_state(single)
  assert pld_grid.single_pld((*part[:-2], 7, part[-1]) if part[0] == "poisson_gaussian"
                             else (*part[:-1], 7), 1e-3) is single  # the count is not a key
  again = pld_grid.evaluate([part], read, interval=None)  # composes the memoized step again
  assert again == first
  for (probs, lower, inf), (probs2, lower2, inf2) in zip(before, _pmf_state(single)):
    assert (probs == probs2).all() and lower == lower2 and inf == inf2
  pld_grid._subsampled_pld.cache_clear()
  assert pld_grid.evaluate([part], read, interval=None) == first  # built afresh: the same
