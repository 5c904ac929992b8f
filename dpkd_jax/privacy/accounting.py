"""Privacy accounting: one dp_accounting `DpEvent` per private run, and its ε.

Conventions (read them before adding a builder):

* Every builder returns a `TaggedDpEvent` (`neighbouring.py`): a `SelfComposedDpEvent` that
  also names the neighbouring relation its sensitivity was derived under. All of them are
  replace-one except `dpsgd_event`, which requires the relation as an argument (no default).
  Trees whose parts disagree are refused by `epsilon` (and by the ledger): a replace-one ε
  composed with an add/remove one is neither.
* The `noise_multiplier` of every non-subsampled Gaussian/Laplace event built here is the
  noise std (Laplace scale) divided by the distance between the released query values on
  two neighbouring datasets (L2 for Gaussian, L1 for Laplace), under the event's relation.
  A unit-shift analysis (dp_accounting's ADD_OR_REMOVE_ONE one) is then exact for it; its
  REPLACE_ONE analysis would double the distance a second time.
* Randomized response (RR) is analysed under REPLACE_ONE (the true label is replaced by
  another). dp-accounting 0.6.0's `PLDAccountant` composes a `RandomizedResponseDpEvent`
  once whatever its count, so RR PLDs are built by hand (`pld_grid`).
* ε itself is computed in `evaluation.py` (re-exported here): exact closed form for pure
  Gaussian trees, exact lattice for RR of one ε0, a bounded self-refining PLD grid otherwise.
"""

import fractions
import math

from dp_accounting import dp_event

from dpkd_jax.privacy import discrete_laplace
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import secure_gaussian
from dpkd_jax.privacy import validation
from dpkd_jax.privacy.evaluation import (  # noqa: F401  (re-exported API)
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    AccountantName,
    NeighborRel,
    check_accountant,
    delta_for_epsilon,
    epsilon,
)
from dpkd_jax.privacy.neighbouring import (  # noqa: F401  (re-exported API)
    ADD_REMOVE,
    REPLACE_ONE,
    TaggedDpEvent,
    relation_of,
)


def _repeat(event: dp_event.DpEvent, count: int,
            relation: str = REPLACE_ONE) -> dp_event.DpEvent:
  # NoOp for count 0: SelfComposed(count=0) would divide by zero in PLDAccountant.
  return neighbouring.tag(event, relation, count)


def dpdfd_event(*, noise_multiplier: float, batch_size: int, steps: int,
                num_teachers: int = 1, teachers_per_record: int = 1,
                secure_noise: bool = False, num_outputs: int | None = None,
                grid_bits: int | None = None) -> dp_event.DpEvent:
  """DPDFD data-free output-gradient mechanism over a whole run.

  Relation: replace one private record. The teacher is trained on private data and is
  not private, so one record may change it arbitrarily: each of the B released rows (B, K), normalized/clipped to L2 norm <= C,
  moves by <= 2C and the concatenated release by <= 2C·sqrt(B). Noise N(0, σ²C²) per
  coordinate gives noise multiplier σC / (2C·sqrt(B)) = σ / (2·sqrt(B)) per step; synthetic
  batches are not subsamples of private data, so no amplification: T Gaussians composed.
  Multi-teacher (rows summed over n teachers, one N(0, σ²C²) draw per summed row): a record
  that can reach m teachers moves each summed row by <= 2Cm, so the multiplier is
  σ / (2m·sqrt(B)). m = 1 needs disjoint shards of ONE partition (`teacher_partition` checks
  the cards; replace-one only, since removing a record re-deals every shard); unproven
  overlap must pass m = n. Direct mode (mechanism on private inputs) has no event
  (docs/privacy.md).

  Args:
    noise_multiplier: σ of Algorithm 1 (noise std σ·C); 0 means no privacy.
    batch_size: B, rows released per step.
    steps: T, number of releases.
    num_teachers: n >= 1 teachers whose rows are summed.
    teachers_per_record: m in [1, n], the most teachers one private record can reach.
    secure_noise: the release on an integer grid plus discrete Gaussian noise
      (`mechanisms.multi_teacher_output_gradients(..., secure_noise=True)`): see
      `dpdfd_secure_event`.
    num_outputs: K, the row length (needed with `secure_noise`: rounding adds √(B·K)).
    grid_bits: the secure grid's k (None: automatic, as in the mechanism).

  Returns:
    `TaggedDpEvent(GaussianDpEvent(σ / (2m·sqrt(B))), T, REPLACE_ONE)` (NoOp if T = 0).
  """
  if secure_noise:
    return dpdfd_secure_event(noise_multiplier=noise_multiplier, batch_size=batch_size,
                              steps=steps, num_teachers=num_teachers,
                              teachers_per_record=teachers_per_record,
                              num_outputs=num_outputs, grid_bits=grid_bits)
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  batch_size = validation.check_int("batch_size", batch_size, minimum=1)
  steps = validation.check_int("steps", steps, minimum=0)
  num_teachers = validation.check_int("num_teachers", num_teachers, minimum=1)
  m = validation.check_int("teachers_per_record", teachers_per_record, minimum=1)
  if m > num_teachers:
    raise ValueError(f"teachers_per_record={m} exceeds num_teachers={num_teachers}")
  return _repeat(
      dp_event.GaussianDpEvent(sigma / (2.0 * m * math.sqrt(batch_size))), steps)


def dpdfd_secure_event(*, noise_multiplier: float, batch_size: int, steps: int,
                       num_teachers: int, teachers_per_record: int, num_outputs: int | None,
                       grid_bits: int | None) -> dp_event.DpEvent:
  """DPDFD with secure noise: T releases, each ρ-zCDP (`secure_gaussian`).

  Relation: replace one private record, as `dpdfd_event`. The summed (B, K) rows (each
  coordinate <= n·C, L2 norm <= n·C·√B, sensitivity Δ = 2C·m·√B) go to the grid of
  `secure_gaussian.choose_grid(σ, C, max_abs=n)`, step γ = σC/g; after rounding the grid
  sensitivity is Δ_grid = Δ/γ + √(B·K) + 2^-20·(Δ + 2n·C·√B)/γ, and discrete Gaussian noise
  N_Z(0, g²) per coordinate makes each release ρ-zCDP, ρ = Δ_grid²/(2g²) (CKS 2020,
  multivariate discrete Gaussian). C cancels: everything is computed with C = 1.
  ρ >= 1/(2z²) of the continuous event (z = σ/(2m·√B)), so ε is never below the default
  mode's.

  Returns:
    `TaggedDpEvent(ZCDpEvent(ρ), T, REPLACE_ONE)` (NoOp if T = 0).
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=True)
  batch_size = validation.check_int("batch_size", batch_size, minimum=1)
  steps = validation.check_int("steps", steps, minimum=0)
  n = validation.check_int("num_teachers", num_teachers, minimum=1)
  m = validation.check_int("teachers_per_record", teachers_per_record, minimum=1)
  if num_outputs is None:
    raise ValueError("secure noise needs num_outputs (K): rounding adds sqrt(B*K) to the "
                     "sensitivity")
  k = validation.check_int("num_outputs", num_outputs, minimum=1)
  if m > n:
    raise ValueError(f"teachers_per_record={m} exceeds num_teachers={n}")
  rho = secure_gaussian.release_rho(
      noise_multiplier=sigma, max_abs=float(n), l2_sensitivity=2.0 * m * math.sqrt(batch_size),
      l2_bound=n * math.sqrt(batch_size), dims=batch_size * k, grid_bits=grid_bits)
  return _repeat(dp_event.ZCDpEvent(rho), steps)


def srr_event(*, epsilon_per_query: float, num_queries: int,
              num_classes: int | None = None) -> dp_event.DpEvent:
  """Selective randomized response teacher labels over a whole run.

  Relation: replace one private record. It may change the teacher's label on
  every query, so n queries are n ε-DP RR mechanisms composed. Binary RR with ε
  dominates every ε-DP mechanism (Kairouz et al. 2015), so `num_classes=None`
  (k = 2, p = 2/(e^ε + 1)) is sound whatever the candidate-set sizes. Pass
  `num_classes=k` only if every query is k-ary RR over the same k outputs
  (tighter): p = k / (e^ε + k − 1), i.e. ε = log(1 + k(1 − p)/p).

  Args:
    epsilon_per_query: ε of one label query (> 0).
    num_queries: n, number of teacher-label queries.
    num_classes: constant candidate-set size k >= 2, or None for binary RR.

  Returns:
    `TaggedDpEvent(RandomizedResponseDpEvent(p, k), n, REPLACE_ONE)` (NoOp if n = 0).
  """
  eps = validation.check_float("epsilon_per_query", epsilon_per_query, positive=True)
  num_queries = validation.check_int("num_queries", num_queries, minimum=0)
  k = 2 if num_classes is None else validation.check_int("num_classes", num_classes,
                                               minimum=2)
  # k / (e^ε + k − 1), written with e^-ε so that a large ε cannot overflow.
  noise_parameter = k * math.exp(-eps) / (1.0 + (k - 1) * math.exp(-eps))
  return _repeat(dp_event.RandomizedResponseDpEvent(
      noise_parameter=noise_parameter, num_buckets=k), num_queries)


def laplace_counts_event(*, epsilon_per_round: float,
                         rounds: int) -> dp_event.DpEvent:
  """Continuous Laplace(b = Δ₁/ε) on a count matrix, per round (ledgers written before the
  counts were noised with integers; new releases use `discrete_laplace_counts_event`).

  Relation: replace one private record; Δ₁ is the L1 change of the count matrix
  it causes (2·k·r in the reverse k-NN paper). b/Δ₁ = 1/ε: each round is pure
  ε-DP; R rounds are composed.

  Args:
    epsilon_per_round: ε of one labelling round (> 0).
    rounds: R, number of rounds.

  Returns:
    `TaggedDpEvent(LaplaceDpEvent(1/ε), R, REPLACE_ONE)` (NoOp if R = 0).
  """
  eps = validation.check_float("epsilon_per_round", epsilon_per_round, positive=True)
  rounds = validation.check_int("rounds", rounds, minimum=0)
  return _repeat(dp_event.LaplaceDpEvent(1.0 / eps), rounds)


def discrete_laplace_counts_event(*, scale: fractions.Fraction, l1_sensitivity: int,
                                  rounds: int) -> dp_event.DpEvent:
  """Integer counts + exact discrete Laplace DLap(t) noise per cell, per round.

  Relation: replace one private record; Δ₁ (an integer) is the L1 change of the count matrix
  it causes (2·k·r for reverse k-NN). Unlike the continuous Laplace, a discrete Laplace on
  Δ₁ is not one on Δ₁ = 1 rescaled, so the event keeps both: a = 1/t (rounded up,
  `discrete_laplace.noise_parameter`) and Δ₁. Each round is pure a·Δ₁-DP; R rounds compose.

  Args:
    scale: t, the exact rational scale the mechanism executes (`discrete_laplace`).
    l1_sensitivity: Δ₁ >= 1, a whole number.
    rounds: R, number of rounds.

  Returns:
    `TaggedDpEvent(DiscreteLaplaceDpEvent(a, Δ₁), R, REPLACE_ONE)` (NoOp if R = 0).
  """
  sensitivity = discrete_laplace.check_integer_sensitivity(l1_sensitivity)
  rounds = validation.check_int("rounds", rounds, minimum=0)
  return _repeat(dp_event.DiscreteLaplaceDpEvent(
      noise_parameter=discrete_laplace.noise_parameter(scale), sensitivity=sensitivity), rounds)


def rona_event(*, noise_multiplier: float,
               num_queries: int) -> dp_event.DpEvent:
  """RONA sanitize: batch knowledge bounded to L2 norm B, N(0, σ²B²) noise.

  Relation: replace one private record. The teacher is not private, so the
  whole bounded batch may change: L2 sensitivity 2B, noise multiplier σ/2 per
  query; T queries composed, T = (Th + R·Td)·|x_q|/S (`rona_num_queries`).

  Args:
    noise_multiplier: σ (noise std σ·B); 0 means no privacy.
    num_queries: T, number of sanitized releases.

  Returns:
    `TaggedDpEvent(GaussianDpEvent(σ/2), T, REPLACE_ONE)` (NoOp if T = 0).
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  num_queries = validation.check_int("num_queries", num_queries, minimum=0)
  return _repeat(dp_event.GaussianDpEvent(sigma / 2.0), num_queries)


def rona_num_queries(*, hint_epochs: int, distillation_epochs: int,
                     rounds: int, num_query_samples: int,
                     batch_size: int) -> int:
  """RONA's query count (Th + R·Td)·ceil(|x_q|/S); a partial batch counts.

  Args:
    hint_epochs: Th; distillation_epochs: Td (per round); rounds: R;
    num_query_samples: |x_q|; batch_size: S (samples per release).

  Returns:
    The number of sanitized releases.
  """
  hint = validation.check_int("hint_epochs", hint_epochs, minimum=0)
  distill = validation.check_int("distillation_epochs", distillation_epochs, minimum=0)
  rounds = validation.check_int("rounds", rounds, minimum=0)
  samples = validation.check_int("num_query_samples", num_query_samples, minimum=0)
  batch_size = validation.check_int("batch_size", batch_size, minimum=1)
  return (hint + rounds * distill) * -(-samples // batch_size)


def dpsgd_event(*, noise_multiplier: float, sampling_rate: float, steps: int,
                relation: str) -> dp_event.DpEvent:
  """DP-SGD: Poisson rate q, per-example clip C, noise N(0, z²C²), T steps.

  Relation (required, no default: the two figures differ, e.g. 1.10 vs 1.76 for
  q = 256/60000, z = 1, T = 2344):
  * `ADD_REMOVE` (the DP-SGD literature's and Opacus' figure): a record joins or leaves the
    Poisson sample; the clipped sum moves by <= C.
  * `REPLACE_ONE` (the relation of every other method here, so of the comparison tables):
    the record in one sample slot changes; its clipped gradient moves from g to g',
    ||g − g'|| <= 2C, and the worst case is the mixture pair (1 − q)N(0) + qN(∓C)
    (dp_accounting's REPLACE_ONE PLD; there is no RDP for it in dp-accounting 0.6.0).
  z stays std / C under both: the relation decides how the event is evaluated.

  Args:
    noise_multiplier: z; 0 means no privacy.
    sampling_rate: q in (0, 1].
    steps: T.
    relation: `ADD_REMOVE` ("add-remove") or `REPLACE_ONE` ("replace-one").

  Returns:
    `TaggedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T, relation)` (NoOp if T = 0).
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  if not 0 < float(sampling_rate) <= 1:
    raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
  steps = validation.check_int("steps", steps, minimum=0)
  neighbouring.check_relation(relation)
  return _repeat(dp_event.PoissonSampledDpEvent(
      float(sampling_rate), dp_event.GaussianDpEvent(sigma)), steps, relation)


def pate_event(*, noise_std: float, num_queries: int, secure_noise: bool = False,
               num_teachers: int | None = None,
               num_classes: int | None = None) -> dp_event.DpEvent:
  """Data-free PATE: Gaussian-noised vote histograms of a disjoint-shard ensemble.

  Relation: replace one private record. The n teachers are trained on disjoint shards, so a
  record lies in exactly one shard and a neighbouring dataset changes at most ONE teacher
  (arbitrarily). Per query the released value is the (K,) histogram of the teachers' votes:
  hard votes (one-hot argmax) or soft votes (probability vectors). One teacher's hard vote
  leaves one bin (−1) for another (+1): L2 distance √2; its probability vector p moves to p'
  with ||p − p'||₂ <= √(||p||₂² + ||p'||₂²) <= √2 (non-negative entries, L1 norm 1). Noise
  N(0, σ² I_K) per query therefore gives noise multiplier σ/√2 (the module's convention: std
  ÷ the L2 distance of the released values; evaluated with ADD_OR_REMOVE_ONE's unit shift).
  Queries are procedural images (public randomness) or chosen from them by the DP student
  (post-processing of earlier releases): Q adaptively chosen Gaussians compose. The whole
  noisy histogram is released, so its argmax and margin (GNMax label and confidence) are free.

  Args:
    noise_std: σ, std of the Gaussian noise per histogram bin; 0 means no privacy.
    num_queries: Q, number of released histograms.
    secure_noise: histograms on an integer grid plus discrete Gaussian noise
      (`aggregation.noisy_histogram(..., secure_noise=True)`): each is ρ-zCDP with the grid
      sensitivity √2/γ + √K + 2^-20·(√2 + 2n)/γ (`secure_gaussian`; ||h||₂ <= n).
    num_teachers, num_classes: n and K, needed with `secure_noise`.

  Returns:
    `TaggedDpEvent(GaussianDpEvent(σ/√2), Q, REPLACE_ONE)`, or `ZCDpEvent(ρ)` per histogram
    with `secure_noise` (NoOp if Q = 0).
  """
  sigma = validation.check_float("noise_std", noise_std, positive=False)
  num_queries = validation.check_int("num_queries", num_queries, minimum=0)
  if not secure_noise:
    return _repeat(dp_event.GaussianDpEvent(sigma / math.sqrt(2.0)), num_queries)
  if num_teachers is None or num_classes is None:
    raise ValueError("secure noise needs num_teachers and num_classes")
  n = validation.check_int("num_teachers", num_teachers, minimum=1)
  k = validation.check_int("num_classes", num_classes, minimum=2)
  rho = secure_gaussian.release_rho(noise_multiplier=sigma, max_abs=float(n),
                                    l2_sensitivity=math.sqrt(2.0), l2_bound=float(n), dims=k)
  return _repeat(dp_event.ZCDpEvent(rho), num_queries)
