"""Tests for dpkd_jax.privacy.paper_accounting: paper figures and warnings."""

import math

import numpy as np
import pytest
from scipy import stats

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import paper_accounting

DELTA = 1e-5


def analytic_gaussian_delta(eps: float, z: float) -> float:
  """δ(ε) of one Gaussian with sensitivity 1 and std z (Balle & Wang 2018)."""
  return float(stats.norm.cdf(0.5 / z - eps * z)
               - math.exp(eps) * stats.norm.cdf(-0.5 / z - eps * z))


def paper_dpdfd(**kwargs) -> float:
  with pytest.warns(paper_accounting.PaperAccountingWarning,
                    match="reconstruction"):
    return paper_accounting.paper_dpdfd_epsilon(**kwargs)


@pytest.mark.parametrize("sigma,bound,steps", [(100.0, 1.0, 1),
                                               (5.0, 1.0, 200),
                                               (1.0, 0.1, 1000)])
def test_paper_dpdfd_is_the_optimized_rdp_bound(sigma, bound, steps):
  # Brute-force min over α of T·α·C²/(2σ²) + log(1/δ)/(α − 1).
  alphas = 1 + np.logspace(-4, 6, 200_001)
  brute = np.min(steps * alphas * bound**2 / (2 * sigma**2)
                 + math.log(1 / DELTA) / (alphas - 1))
  ours = paper_dpdfd(noise_multiplier=sigma, l2_clip_norm=bound, steps=steps,
                     delta=DELTA)
  assert ours <= brute <= ours * (1 + 1e-6)


def test_paper_dpdfd_depends_on_c_over_sigma():
  small = paper_dpdfd(noise_multiplier=100.0, l2_clip_norm=1.0, steps=10,
                      delta=DELTA)
  large = paper_dpdfd(noise_multiplier=100.0, l2_clip_norm=2.0, steps=10,
                      delta=DELTA)
  # Only C/σ enters the paper's figure, and it grows with C.
  assert large > small
  assert large == pytest.approx(paper_dpdfd(
      noise_multiplier=50.0, l2_clip_norm=1.0, steps=10, delta=DELTA))


def test_paper_dpdfd_understates_the_worked_example():
  # docs/privacy.md worked figure: one step, B = 256, σ = 100, δ = 1e-5.
  sound = accounting.epsilon(accounting.dpdfd_event(
      noise_multiplier=100.0, batch_size=256, steps=1), delta=DELTA)
  paper = paper_dpdfd(noise_multiplier=100.0, l2_clip_norm=1.0, steps=1,
                      delta=DELTA)
  assert paper < sound / 10


def test_paper_srr_is_per_query_and_below_record_level():
  with pytest.warns(paper_accounting.PaperAccountingWarning,
                    match="label DP"):
    paper = paper_accounting.paper_srr_label_epsilon(1.0)
  assert paper == 1.0
  record_level = accounting.epsilon(accounting.srr_event(
      epsilon_per_query=1.0, num_queries=10), delta=DELTA)
  assert record_level > 5 * paper


@pytest.mark.parametrize("sigma", [6.0, 20.0])
def test_paper_rona_is_the_classic_gaussian_bound(sigma):
  with pytest.warns(paper_accounting.PaperAccountingWarning, match="2B"):
    eps = paper_accounting.paper_rona_epsilon(noise_multiplier=sigma,
                                              delta=DELTA)
  assert eps == pytest.approx(math.sqrt(2 * math.log(1.25 / DELTA)) / sigma)
  assert eps < 1  # The classic bound's premise holds for these σ.
  # Valid with the paper's sensitivity B (noise multiplier σ)...
  assert analytic_gaussian_delta(eps, sigma) <= DELTA
  # ...but not with the true replace-one sensitivity 2B (multiplier σ/2).
  assert analytic_gaussian_delta(eps, sigma / 2) > DELTA


def test_paper_rona_warns_when_premise_fails():
  with pytest.warns(paper_accounting.PaperAccountingWarning,
                    match="premise"):
    eps = paper_accounting.paper_rona_epsilon(noise_multiplier=1.0,
                                              delta=DELTA)
  assert eps > 1


@pytest.mark.parametrize("call,match", [
    (lambda: paper_accounting.paper_dpdfd_epsilon(
        noise_multiplier=0.0, l2_clip_norm=1.0, steps=1, delta=DELTA),
     "noise_multiplier"),
    (lambda: paper_accounting.paper_dpdfd_epsilon(
        noise_multiplier=1.0, l2_clip_norm=-1.0, steps=1, delta=DELTA),
     "l2_clip_norm"),
    (lambda: paper_accounting.paper_dpdfd_epsilon(
        noise_multiplier=1.0, l2_clip_norm=1.0, steps=-1, delta=DELTA),
     "steps"),
    (lambda: paper_accounting.paper_dpdfd_epsilon(
        noise_multiplier=1.0, l2_clip_norm=1.0, steps=1, delta=1.5), "delta"),
    (lambda: paper_accounting.paper_srr_label_epsilon(0.0),
     "epsilon_per_query"),
    (lambda: paper_accounting.paper_rona_epsilon(noise_multiplier=1.0,
                                                 delta=0.0), "delta"),
])
def test_bad_parameters_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()
