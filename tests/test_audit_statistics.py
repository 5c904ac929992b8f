"""The audit's statistics (jax_privacy's CanaryScoreAuditor) have power and stay sound.

Synthetic scores: clearly separated included/excluded canaries give a clearly positive bound;
scores that do not depend on the inclusion bit give a bound of about 0 (at 95% confidence a
true ε of 0 is exceeded with probability at most 5%: over 20 draws, at most a few are > 0).
"""

import math

import numpy as np
import pytest

from dpkd_jax.audit import statistics
from dpkd_jax.audit import scores


def _bits(m, seed):
  return np.random.default_rng(seed).random(m) < 0.5


def test_separated_scores_give_a_clearly_positive_bound():
  included = _bits(1000, 0)
  noise = np.random.default_rng(1).normal(size=1000)
  result = statistics.audit_scores(noise + 4.0 * included, included, delta=1e-5)
  assert result.epsilon_lower_bound > 2.0
  assert result.epsilon_lower_bound_fdp >= result.epsilon_lower_bound
  assert result.auroc > 0.95 and result.tpr_at_1pct_fpr > 0.5
  assert result.epsilon_ceiling >= result.epsilon_lower_bound_fdp
  assert result.m == 1000 and result.included == included.sum()


def test_perfect_separation_reaches_the_ceiling():
  included = _bits(200, 2)
  result = statistics.audit_scores(included.astype(float), included, delta=1e-5)
  assert result.epsilon_lower_bound_fdp == pytest.approx(result.epsilon_ceiling)
  assert result.auroc == 1.0


def test_scores_independent_of_the_bits_give_about_zero():
  bounds = []
  for seed in range(20):
    included = _bits(500, 100 + seed)
    noise = np.random.default_rng(200 + seed).normal(size=500)
    result = statistics.audit_scores(noise, included, delta=1e-5)
    assert 0.3 < result.auroc < 0.7
    bounds.append(result.epsilon_lower_bound)
  assert sum(b > 0 for b in bounds) <= 3 and max(bounds) < 0.5


def test_bad_inputs_are_refused():
  with pytest.raises(ValueError, match="both included and excluded"):
    statistics.audit_scores(np.zeros(4), np.ones(4, bool), delta=1e-5)
  with pytest.raises(ValueError, match="finite"):
    statistics.audit_scores(np.array([0.0, math.nan]), np.array([True, False]), delta=1e-5)
  with pytest.raises(ValueError, match="delta"):
    statistics.audit_scores(np.zeros(2), np.array([True, False]), delta=0.0)


def test_log_odds_is_the_margin_of_the_label():
  logits = np.log(np.array([[0.7, 0.2, 0.1], [0.25, 0.5, 0.25]]))
  np.testing.assert_allclose(scores.log_odds(logits, np.array([0, 1])),
                             [math.log(0.7 / 0.3), 0.0], atol=1e-12)
