"""Tests for dpkd_jax.privacy.neighbouring: relation tags, mixed trees refused, and DP-SGD
under both relations checked against an independent numerical computation."""

import math

from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest
from scipy import fft as scipy_fft
from scipy import optimize
from scipy import stats

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import neighbouring

DELTA = 1e-5
REPLACE, ADD_REMOVE = accounting.REPLACE_ONE, accounting.ADD_REMOVE


def _dpsgd(relation, z=1.0, q=0.01, steps=10):
  return accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=steps,
                                relation=relation)


def test_every_builder_is_tagged_with_its_relation():
  events = {
      "dpdfd": accounting.dpdfd_event(noise_multiplier=10.0, batch_size=4, steps=2),
      "srr": accounting.srr_event(epsilon_per_query=1.0, num_queries=3),
      "laplace": accounting.laplace_counts_event(epsilon_per_round=1.0, rounds=2),
      "rona": accounting.rona_event(noise_multiplier=4.0, num_queries=3),
      "pate": accounting.pate_event(noise_std=5.0, num_queries=3),
  }
  for name, event in events.items():
    assert isinstance(event, accounting.TaggedDpEvent), name
    assert accounting.relation_of(event) == REPLACE, name
  assert accounting.relation_of(accounting.dpsgd_event(
      noise_multiplier=1.0, sampling_rate=0.1, steps=2, relation="add-remove")) == ADD_REMOVE
  with pytest.raises(TypeError):  # no default relation: the caller names it
    accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.1, steps=2)
  assert accounting.relation_of(_dpsgd(REPLACE)) == REPLACE
  # Still a SelfComposedDpEvent: .event / .count read as before, and dp_accounting's own
  # accountants accept it.
  rona = events["rona"]
  assert rona.count == 3 and rona.event == dp_event.GaussianDpEvent(2.0)
  rdp = rdp_privacy_accountant.RdpAccountant().compose(rona).get_epsilon(DELTA)
  assert rdp == pytest.approx(accounting.epsilon(rona, delta=DELTA, accountant="rdp"))


def test_untagged_leaves_follow_the_documented_rules():
  assert accounting.relation_of(dp_event.GaussianDpEvent(1.0)) is None
  assert accounting.relation_of(dp_event.RandomizedResponseDpEvent(0.5, 2)) == REPLACE
  raw_poisson = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
  assert accounting.relation_of(raw_poisson) == ADD_REMOVE
  # An untagged Gaussian takes the relation of the tree it is in.
  assert accounting.relation_of(dp_event.ComposedDpEvent(
      [dp_event.GaussianDpEvent(1.0), _dpsgd(REPLACE)])) == REPLACE
  # A tag fixes the relation of an untagged Poisson sample inside it.
  assert accounting.relation_of(neighbouring.tag(raw_poisson, REPLACE)) == REPLACE


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("other", [
    accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256, steps=3),
    accounting.pate_event(noise_std=40.0, num_queries=10),
    accounting.laplace_counts_event(epsilon_per_round=0.5, rounds=2),
])
def test_add_remove_dpsgd_does_not_compose_with_replace_one_events(other, accountant):
  mixed = dp_event.ComposedDpEvent([_dpsgd(ADD_REMOVE), other])
  with pytest.raises(ValueError, match="neighbouring relations"):
    accounting.epsilon(mixed, delta=DELTA, accountant=accountant)
  with pytest.raises(ValueError, match="neighbouring relations"):
    accounting.delta_for_epsilon(mixed, epsilon=5.0, accountant=accountant)


def test_one_relation_composes():
  parts = [_dpsgd(REPLACE), accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256,
                                                   steps=3)]
  both = accounting.epsilon(dp_event.ComposedDpEvent(parts), delta=DELTA)
  assert both > max(accounting.epsilon(part, delta=DELTA) for part in parts)


def test_nested_tags_must_agree():
  with pytest.raises(ValueError, match="mixed neighbouring relations"):
    accounting.epsilon(neighbouring.tag(_dpsgd(ADD_REMOVE), REPLACE), delta=DELTA)
  with pytest.raises(ValueError, match="replace-one only"):
    accounting.epsilon(neighbouring.tag(dp_event.RandomizedResponseDpEvent(0.5, 2), ADD_REMOVE),
                       delta=DELTA)
  with pytest.raises(ValueError, match="neighbouring relation must be"):
    accounting.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.1, steps=1, relation="replace")
  with pytest.raises(ValueError, match="count"):
    accounting.TaggedDpEvent(dp_event.GaussianDpEvent(1.0), 0, REPLACE)


def test_dpsgd_figures_of_the_issue():
  # q = 256/60000, z = 1, T = 2344: add/remove 1.10 (Opacus' figure), replace-one 1.76.
  kwargs = dict(z=1.0, q=256 / 60000, steps=2344)
  assert accounting.epsilon(_dpsgd(ADD_REMOVE, **kwargs), delta=DELTA) == pytest.approx(
      1.10, abs=0.01)
  assert accounting.epsilon(_dpsgd(REPLACE, **kwargs), delta=DELTA) == pytest.approx(
      1.76, abs=0.01)


def test_replace_one_has_no_rdp_in_this_dp_accounting():
  with pytest.raises(ValueError, match="no RDP"):
    accounting.epsilon(_dpsgd(REPLACE), delta=DELTA, accountant="rdp")


def test_full_batch_replace_one_is_a_gaussian_with_twice_the_shift():
  event = _dpsgd(REPLACE, z=2.0, q=1.0, steps=4)
  twice = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.0), 4)
  assert accounting.epsilon(event, delta=DELTA) == pytest.approx(
      accounting.epsilon(twice, delta=DELTA), rel=1e-12)


def _composed_epsilon(log_p, log_q, mass_p, steps, delta, width=5e-4):
  """ε of the `steps`-fold product of two distributions on a grid, by our own PLD.

  The privacy loss L = log p/q under P is rounded UP to a grid of `width` (so the result is an
  upper bound), its law convolved `steps` times by FFT, and δ(ε) = E[(1 − e^{ε − L})_+].
  """
  loss = log_p - log_q
  keep = mass_p > 1e-300
  index = np.ceil(loss[keep] / width).astype(np.int64)
  low = index.min()
  pmf = np.bincount(index - low, weights=mass_p[keep])
  size = scipy_fft.next_fast_len(len(pmf) * steps)
  composed = scipy_fft.irfft(scipy_fft.rfft(pmf, size) ** steps, size).clip(0.0)
  losses = (np.arange(size) + low * steps) * width

  def delta_of(eps):
    return float(np.sum(composed * np.clip(-np.expm1(eps - losses), 0.0, None)))

  return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 50.0, xtol=1e-9)


@pytest.mark.parametrize("z,q,steps", [(0.8, 0.05, 20), (1.5, 0.2, 8)])
def test_dpsgd_matches_an_independent_numerical_pld(z, q, steps):
  """Both relations against the hockey-stick divergence of the dominating mixtures, computed
  here from the densities (add/remove: max of the remove and add directions)."""
  x = np.arange(-14 * z - 1, 14 * z + 1, 5e-4 * z)  # (X,)
  dx = x[1] - x[0]
  base = stats.norm.logpdf(x, 0.0, z)
  up = np.logaddexp(math.log1p(-q) + base, math.log(q) + stats.norm.logpdf(x, 1.0, z))
  down = np.logaddexp(math.log1p(-q) + base, math.log(q) + stats.norm.logpdf(x, -1.0, z))
  replace = _composed_epsilon(up, down, np.exp(up) * dx, steps, DELTA)
  add_remove = max(_composed_epsilon(up, base, np.exp(up) * dx, steps, DELTA),
                   _composed_epsilon(base, up, np.exp(base) * dx, steps, DELTA))
  for relation, independent in ((REPLACE, replace), (ADD_REMOVE, add_remove)):
    ours = accounting.epsilon(_dpsgd(relation, z=z, q=q, steps=steps), delta=DELTA)
    assert ours == pytest.approx(independent, rel=1e-2), relation
  assert replace > add_remove


def test_antipodal_gradients_dominate_one_replace_one_step():
  """One step of replace-one DP-SGD: the pair dp_accounting analyses (g = +C, g' = −C) has the
  largest δ(ε) among other replacements (orthogonal, shorter, zero), in 2-D, both directions."""
  z, q = 0.7, 0.3
  grid = np.linspace(-8 * z - 1.2, 8 * z + 1.2, 601)
  xs, ys = np.meshgrid(grid, grid, indexing="ij")
  cell = (grid[1] - grid[0]) ** 2

  def mixture(g):
    return ((1 - q) * stats.norm.pdf(xs, 0, z) * stats.norm.pdf(ys, 0, z)
            + q * stats.norm.pdf(xs, g[0], z) * stats.norm.pdf(ys, g[1], z))

  ours = accounting.TaggedDpEvent(
      dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), 1, REPLACE)
  bounds = {eps: accounting.delta_for_epsilon(ours, epsilon=eps,
                                             value_discretization_interval=1e-4)
            for eps in (0.1, 1.0, 2.0)}
  first = mixture((1.0, 0.0))
  for other in [(-1.0, 0.0), (0.0, 1.0), (-0.5, 0.5), (0.0, 0.0)]:
    second = mixture(other)
    for eps, bound in bounds.items():
      for p, r in ((first, second), (second, first)):
        divergence = float(np.sum(np.clip(p - math.exp(eps) * r, 0.0, None)) * cell)
        assert divergence <= bound * (1 + 1e-3) + 1e-9, (other, eps)
