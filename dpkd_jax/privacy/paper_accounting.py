"""The papers' own privacy figures, for comparison only: never the default.

Every `paper_*` function returns the figure a paper reports (or, where the
paper's text was not available to us, a reconstruction that says so), emits a
`PaperAccountingWarning`, and documents when the figure is and is not a valid
guarantee. The sound figures come from `dpkd_jax.privacy.accounting`; both are
tabulated by `benchmarks/privacy_figures.py` and discussed in docs/privacy.md.
"""

import math
import warnings

from dpkd_jax.privacy import validation


class PaperAccountingWarning(UserWarning):
  """A paper's privacy figure was requested; it is not this library's bound."""


def _warn(message: str) -> None:
  # stacklevel=3: point at the caller of the public paper_* function.
  warnings.warn(message, PaperAccountingWarning, stacklevel=3)


def paper_dpdfd_epsilon(*, noise_multiplier: float, l2_clip_norm: float | None = None,
                        steps: int, delta: float, l2_norm_bound: float | None = None) -> float:
  """DPDFD (Liu et al., IJCAI 2023) Theorem 3 — RECONSTRUCTION.

  The exact text of Theorem 3 of "Model Conversion via Differentially Private
  Data-Free Distillation" was not available to us: the stored copies we could
  search returned only the abstract and introduction, and the authors' public
  code snippet (github.com/llbbcc/DPDFD, utils.py) has no accounting. This
  reconstructs the theorem's known shape (ε grows with C²/σ², per-row
  sensitivity): an RDP Gaussian bound with sensitivity C (one row, as if rows
  were independent private records) and noise std σ per step, composed over T
  steps and converted with the standard RDP -> (ε, δ) bound (Mironov 2017):

      ε = min_{α > 1} [T·α·C² / (2σ²) + log(1/δ) / (α − 1)]
        = ρ + 2·sqrt(ρ·log(1/δ)),   ρ = T·C² / (2σ²).

  When it is NOT a guarantee (always, for our mechanism): the teacher is not
  private, so one record can move all B rows, each by 2C (sensitivity 2C·√B,
  not C); and Algorithm 1 adds noise of std σ·C, not σ, so the true ε does not
  depend on C while this figure scales with C². The sound figure is
  `accounting.epsilon(accounting.dpdfd_event(...))`.

  Args:
    noise_multiplier: σ as in the paper (> 0).
    l2_clip_norm: C, the normalization/clipping bound (> 0).
    steps: T (>= 0).
    delta: δ in (0, 1).
    l2_norm_bound: the old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`).

  Returns:
    The reconstructed paper ε.
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=True)
  l2_clip_norm = validation.renamed_keyword(
      "paper_dpdfd_epsilon", new="l2_clip_norm", new_value=l2_clip_norm, old="l2_norm_bound",
      old_value=l2_norm_bound)
  bound = validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  steps = validation.check_int("steps", steps, minimum=0)
  delta = validation.check_delta(delta)
  _warn("paper_dpdfd_epsilon is a reconstruction of DPDFD's Theorem 3 and is "
        "not a valid guarantee for the implemented mechanism (sensitivity "
        "2C·sqrt(B), noise std σC); use accounting.epsilon(dpdfd_event(...)).")
  return gaussian_rdp_epsilon(steps * bound**2 / (2.0 * sigma**2), delta)


def paper_srr_label_epsilon(epsilon_per_query: float) -> float:
  """SRR paper (Liu et al., 2024) per-query label-DP figure: ε itself.

  Valid: each teacher-label query (k-ary RR over the candidate set, the true
  label kept w.p. e^ε/(e^ε + k − 1)) is ε-label-DP for that one label, given
  the public prior. Not valid as a record-level guarantee for the teacher's
  private training set: one private record can change every teacher label, so
  n queries compose to `accounting.epsilon(accounting.srr_event(...))`.

  Args:
    epsilon_per_query: ε of one query (> 0).

  Returns:
    ε per query.
  """
  eps = validation.check_float("epsilon_per_query", epsilon_per_query, positive=True)
  _warn("paper_srr_label_epsilon is per-query label DP, not record-level DP "
        "of the private training set; use accounting.srr_event.")
  return eps


def paper_rona_epsilon(*, noise_multiplier: float, delta: float) -> float:
  """RONA (Wang et al., AAAI 2019) per-query Gaussian figure.

  RONA bounds the batch knowledge to L2 norm B and adds N(0, σ²B²); with the
  paper's sensitivity B the classic Gaussian mechanism (Dwork & Roth, Thm
  A.1) σ = sqrt(2·ln(1.25/δ))/ε gives ε = sqrt(2·ln(1.25/δ))/σ per query.

  Valid only if ε < 1 (the classic theorem's premise) and the sensitivity is
  really B. It is not for us: the teacher is not private, so under
  replace-one the whole batch can change (sensitivity 2B, `rona_event` uses
  noise multiplier σ/2). RONA's composed figure over all queries (e.g.
  (9.83, 1e-6) on SVHN) relies on a moments-accountant composition whose exact
  statement was not available to us; it is not reproduced. Compose with
  `accounting.epsilon(accounting.rona_event(...))` instead.

  Args:
    noise_multiplier: σ (noise std σ·B, > 0).
    delta: δ in (0, 1) of one query.

  Returns:
    The paper's per-query ε.
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=True)
  delta = validation.check_delta(delta)
  eps = math.sqrt(2.0 * math.log(1.25 / delta)) / sigma
  premise = "; ε >= 1 violates its premise" if eps >= 1 else ""
  _warn("paper_rona_epsilon: per-query classic Gaussian bound with sensitivity "
        f"B (ours is 2B){premise}; use accounting.rona_event for a guarantee.")
  return eps


def gaussian_rdp_epsilon(rho: float, delta: float) -> float:
  """ε = ρ + 2·sqrt(ρ·log(1/δ)): the RDP -> (ε, δ) bound (Mironov 2017) of a composition of
  Gaussian mechanisms with total zCDP-style parameter ρ = Σ sensitivity² / (2·std²)."""
  return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def gaussian_rdp_rho(target_epsilon: float, delta: float) -> float:
  """The ρ at which `gaussian_rdp_epsilon(ρ, δ)` equals `target_epsilon`:
  sqrt(ρ) = sqrt(log(1/δ) + ε) − sqrt(log(1/δ))."""
  log_inv_delta = math.log(1.0 / delta)
  return (math.sqrt(log_inv_delta + target_epsilon) - math.sqrt(log_inv_delta)) ** 2


def paper_rona_composed_epsilon(*, noise_multiplier: float, num_queries: int,
                                delta: float) -> float:
  """RONA (Wang et al., AAAI 2019) Theorem 2, the ε of all T queries — RECONSTRUCTION.

  The paper composes its T = (Th + R·Td)·|x_q|/S batch queries with the moments accountant
  (Abadi et al. 2016) and states only the shape of the result (σ = c2·sqrt(T·log(1/δ))/ε for
  ε < c1·T; the constants and the proof are omitted). This reconstructs it with the
  moments-accountant (RDP) bound of T unsampled Gaussian queries at the paper's sensitivity
  B and noise std σ·B (no subsampling: every query reads the whole teacher):

      ε = ρ + 2·sqrt(ρ·log(1/δ)),   ρ = T / (2σ²).

  When it is NOT a guarantee (always, for our mechanism): the teacher is not private, so
  under replace-one the whole bounded batch may change (sensitivity 2B, i.e. ρ four times
  larger). The sound figure is `accounting.epsilon(accounting.rona_event(...))`.

  Args:
    noise_multiplier: σ (noise std σ·B, > 0).
    num_queries: T (>= 0).
    delta: δ in (0, 1).

  Returns:
    The reconstructed paper ε of the T queries.
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=True)
  num_queries = validation.check_int("num_queries", num_queries, minimum=0)
  delta = validation.check_delta(delta)
  _warn("paper_rona_composed_epsilon is a reconstruction of RONA's Theorem 2 (sensitivity "
        "B; ours is 2B) and is not a valid guarantee; use accounting.rona_event.")
  return gaussian_rdp_epsilon(num_queries / (2.0 * sigma**2), delta)


def paper_rona_noise_multiplier(*, target_epsilon: float, num_queries: int,
                                delta: float) -> float:
  """σ at which `paper_rona_composed_epsilon` of `num_queries` queries is `target_epsilon`."""
  target_epsilon = validation.check_float("target_epsilon", target_epsilon, positive=True)
  num_queries = validation.check_int("num_queries", num_queries, minimum=1)
  delta = validation.check_delta(delta)
  return math.sqrt(num_queries / (2.0 * gaussian_rdp_rho(target_epsilon, delta)))
