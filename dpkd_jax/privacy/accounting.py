"""Privacy accounting: one dp_accounting `DpEvent` per private run, and its ε.

Conventions (read them before adding a builder):

* The `noise_multiplier` of every Gaussian/Laplace event built here is the noise
  std (Laplace scale) divided by the distance between the released query values
  on two neighbouring datasets (L2 for Gaussian, L1 for Laplace), under the
  method's own neighbouring relation. dp_accounting's ADD_OR_REMOVE_ONE analysis
  shifts the mean by exactly one such distance, so it is exact for these events;
  its REPLACE_ONE analysis would double the distance a second time.
* Randomized response (RR) is analysed under REPLACE_ONE (the true label is
  replaced by another). dp-accounting 0.6.0's `PLDAccountant` composes a
  `RandomizedResponseDpEvent` once whatever its count, so RR PLDs are built here
  with `from_randomized_response(...).self_compose(n)`.
* A tree holding both RR and Poisson subsampling (add/remove) mixes neighbouring
  relations and is rejected.
* A tree of RR queries that share one ε0 is evaluated exactly on its loss
  lattice (`rr_composition`): PLD's pessimistic grid would charge small ε0 up
  to one grid step per query (ε 13.07 instead of 0.57 for 25,600 queries of
  ε0 = 1e-3).
* Composition does not depend on order, so identical leaves are merged into one
  `SelfComposedDpEvent` first: a ledger of 10⁴ equal steps costs a single PLD.
"""

import math
from typing import Literal

from dp_accounting import dp_event
from dp_accounting import privacy_accountant
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from dpkd_jax.privacy import rr_composition
from dpkd_jax.privacy import validation

AccountantName = Literal["pld", "rdp"]
# 1e-3 is several times faster than dp_accounting's 1e-4 default and moves ε
# by < 1e-2 in our regimes (docs/privacy.md); the estimate stays pessimistic.
DEFAULT_VALUE_DISCRETIZATION_INTERVAL = 1e-3
NeighborRel = privacy_accountant.NeighboringRelation


def check_accountant(accountant: str, interval: float) -> None:
  if accountant not in ("pld", "rdp"):
    raise ValueError(f"accountant must be 'pld' or 'rdp', got {accountant!r}")
  validation.check_float("value_discretization_interval", interval, positive=True)


def _repeat(event: dp_event.DpEvent, count: int) -> dp_event.DpEvent:
  # SelfComposed(count=0) would divide by zero in PLDAccountant's Gaussian path.
  if count == 0:
    return dp_event.NoOpDpEvent()
  return dp_event.SelfComposedDpEvent(event, count)


def dpdfd_event(*, noise_multiplier: float, batch_size: int, steps: int,
                num_teachers: int = 1, teachers_per_record: int = 1) -> dp_event.DpEvent:
  """DPDFD data-free output-gradient mechanism over a whole run.

  Relation: replace one private record (one teacher trained on all the data: add/remove
  too). The teacher is trained on private data and is not private, so one record may change
  it arbitrarily: each of the B released rows (B, K), normalized/clipped to L2 norm <= C,
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

  Returns:
    `SelfComposedDpEvent(GaussianDpEvent(σ / (2m·sqrt(B))), T)` (NoOp if T = 0).
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  batch_size = validation.check_int("batch_size", batch_size, minimum=1)
  steps = validation.check_int("steps", steps, minimum=0)
  num_teachers = validation.check_int("num_teachers", num_teachers, minimum=1)
  m = validation.check_int("teachers_per_record", teachers_per_record, minimum=1)
  if m > num_teachers:
    raise ValueError(f"teachers_per_record={m} exceeds num_teachers={num_teachers}")
  return _repeat(
      dp_event.GaussianDpEvent(sigma / (2.0 * m * math.sqrt(batch_size))), steps)


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
    `SelfComposedDpEvent(RandomizedResponseDpEvent(p, k), n)` (NoOp if n = 0).
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
  """Reverse k-NN counts: Laplace(b = Δ₁/ε) on the count matrix, per round.

  Relation: replace one private record; Δ₁ is the L1 change of the count matrix
  it causes (2·k·r in the reverse k-NN paper). b/Δ₁ = 1/ε: each round is pure
  ε-DP; R rounds are composed.

  Args:
    epsilon_per_round: ε of one labelling round (> 0).
    rounds: R, number of rounds.

  Returns:
    `SelfComposedDpEvent(LaplaceDpEvent(1/ε), R)` (NoOp if R = 0).
  """
  eps = validation.check_float("epsilon_per_round", epsilon_per_round, positive=True)
  rounds = validation.check_int("rounds", rounds, minimum=0)
  return _repeat(dp_event.LaplaceDpEvent(1.0 / eps), rounds)


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
    `SelfComposedDpEvent(GaussianDpEvent(σ/2), T)` (NoOp if T = 0).
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


def dpsgd_event(*, noise_multiplier: float, sampling_rate: float,
                steps: int) -> dp_event.DpEvent:
  """DP-SGD: Poisson rate q, per-example clip C, noise N(0, z²C²), T steps.

  Relation: add or remove one record (the clipped sum moves by <= C).

  Args:
    noise_multiplier: z; 0 means no privacy.
    sampling_rate: q in (0, 1].
    steps: T.

  Returns:
    `SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T)`.
  """
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  if not 0 < float(sampling_rate) <= 1:
    raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
  steps = validation.check_int("steps", steps, minimum=0)
  return _repeat(dp_event.PoissonSampledDpEvent(
      float(sampling_rate), dp_event.GaussianDpEvent(sigma)), steps)


def _collect_leaves(event: dp_event.DpEvent, count: int,
                    leaves: list[list]) -> None:
  """Flattens Composed/SelfComposed trees into merged [leaf, count] pairs."""
  if count == 0 or isinstance(event, dp_event.NoOpDpEvent):
    return
  if isinstance(event, dp_event.SelfComposedDpEvent):
    _collect_leaves(event.event, count * event.count, leaves)
  elif isinstance(event, dp_event.ComposedDpEvent):
    for sub_event in event.events:
      _collect_leaves(sub_event, count, leaves)
  else:
    for pair in leaves:
      if pair[0] == event:
        pair[1] += count
        return
    leaves.append([event, count])


class _NoGuarantee(Exception):
  """A leaf releases without noise: ε = ∞."""


def _leaf_pld(leaf: dp_event.DpEvent, count: int, interval: float):
  """PLD of `count` repetitions of a leaf of an RR tree (None: no-op)."""
  pld = privacy_loss_distribution
  if isinstance(leaf, dp_event.NonPrivateDpEvent):
    raise _NoGuarantee()
  if isinstance(leaf, dp_event.RandomizedResponseDpEvent):
    if leaf.num_buckets == 1 or leaf.noise_parameter == 1:
      return None  # The output does not depend on the input.
    if leaf.noise_parameter == 0:
      raise _NoGuarantee()
    return pld.from_randomized_response(
        noise_parameter=leaf.noise_parameter, num_buckets=leaf.num_buckets,
        value_discretization_interval=interval,
        neighboring_relation=NeighborRel.REPLACE_ONE).self_compose(count)
  if isinstance(leaf, (dp_event.GaussianDpEvent, dp_event.LaplaceDpEvent)):
    if leaf.noise_multiplier == 0:
      raise _NoGuarantee()
    if isinstance(leaf, dp_event.LaplaceDpEvent):
      return pld.from_laplace_mechanism(
          parameter=leaf.noise_multiplier,
          value_discretization_interval=interval).self_compose(count)
    # T unit-sensitivity Gaussians == one with std z/sqrt(T), as PLDAccountant.
    return pld.from_gaussian_mechanism(
        standard_deviation=leaf.noise_multiplier / math.sqrt(count),
        value_discretization_interval=interval)
  raise ValueError(
      f"{type(leaf).__name__} cannot be composed with randomized response: RR "
      "is analysed under REPLACE_ONE, this event (e.g. Poisson sampling, "
      "ADD_OR_REMOVE_ONE) is not; account for them separately.")


def _exact_rr(leaves: list[list], *, delta: float | None,
              target_epsilon: float | None) -> float | None:
  """ε (or δ) of an RR-only tree whose queries share one ε0, without rounding.

  None when the tree holds other events or several ε0 (then PLD is used). See
  `rr_composition` for why PLD's pessimistic grid overcharges small ε0.
  """
  rr_leaves = []
  for leaf, count in leaves:
    if not isinstance(leaf, dp_event.RandomizedResponseDpEvent):
      return None
    if leaf.num_buckets == 1 or leaf.noise_parameter == 1:
      continue  # The output does not depend on the input.
    if leaf.noise_parameter == 0:
      return math.inf if delta is not None else 1.0
    rr_leaves.append((leaf.noise_parameter, leaf.num_buckets, count))
  if not rr_leaves:
    return 0.0
  if rr_composition.common_epsilon0(rr_leaves) is None:
    return None
  if delta is not None:
    return rr_composition.composed_epsilon(delta, rr_leaves)
  return rr_composition.composed_delta(target_epsilon, rr_leaves)


def _evaluate(event: dp_event.DpEvent, accountant: str, interval: float, *,
              delta: float | None = None,
              target_epsilon: float | None = None) -> float:
  """ε at `delta`, or δ at `target_epsilon`, of an event tree."""
  if not isinstance(event, dp_event.DpEvent):
    raise TypeError(f"event must be a dp_accounting DpEvent, got {event!r}")
  check_accountant(accountant, interval)
  leaves = []
  _collect_leaves(event, 1, leaves)
  has_rr = any(isinstance(leaf, dp_event.RandomizedResponseDpEvent)
               for leaf, _ in leaves)
  if accountant == "pld" and has_rr:
    exact = _exact_rr(leaves, delta=delta, target_epsilon=target_epsilon)
    if exact is not None:
      return exact
    total = None
    try:
      for leaf, count in leaves:
        leaf_pld = _leaf_pld(leaf, count, interval)
        if leaf_pld is not None:
          total = leaf_pld if total is None else total.compose(leaf_pld)
    except _NoGuarantee:
      return math.inf if delta is not None else 1.0
    if total is None:
      return 0.0
    if delta is not None:
      return float(total.get_epsilon_for_delta(delta))
    return float(total.get_delta_for_epsilon(target_epsilon))
  if accountant == "rdp":
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=(
        NeighborRel.REPLACE_ONE if has_rr else NeighborRel.ADD_OR_REMOVE_ONE))
  else:
    acc = pld_privacy_accountant.PLDAccountant(
        NeighborRel.ADD_OR_REMOVE_ONE, value_discretization_interval=interval)
  try:
    acc.compose(dp_event.ComposedDpEvent(
        [dp_event.SelfComposedDpEvent(leaf, count) for leaf, count in leaves]))
  except privacy_accountant.UnsupportedEventError as err:
    raise ValueError(f"cannot account for this event: {err}") from err
  if delta is not None:
    return float(acc.get_epsilon(delta))
  return float(acc.get_delta(target_epsilon))


def epsilon(event: dp_event.DpEvent, *, delta: float,
            accountant: AccountantName = "pld",
            value_discretization_interval: float = (
                DEFAULT_VALUE_DISCRETIZATION_INTERVAL)) -> float:
  """ε spent by `event` at `delta`; `math.inf` if some part has no noise.

  Args:
    event: any tree of the events built in this module.
    delta: δ in (0, 1).
    accountant: "pld" (tight, pessimistic discretization) or "rdp" (looser;
      dp_accounting's RR RDP under REPLACE_ONE is exact and used as is).
    value_discretization_interval: PLD grid step.

  Returns:
    ε as a float.
  """
  return _evaluate(event, accountant, value_discretization_interval,
                   delta=validation.check_delta(delta))


def delta_for_epsilon(event: dp_event.DpEvent, *, epsilon: float,
                      accountant: AccountantName = "pld",
                      value_discretization_interval: float = (
                          DEFAULT_VALUE_DISCRETIZATION_INTERVAL)) -> float:
  """δ of `event` at ε >= 0; 1.0 if some part has no noise.

  Args:
    event: any tree of the events built in this module.
    epsilon: ε >= 0.
    accountant: "pld" or "rdp".
    value_discretization_interval: PLD grid step.

  Returns:
    δ as a float.
  """
  eps = validation.check_float("epsilon", epsilon, positive=False)
  return _evaluate(event, accountant, value_discretization_interval,
                   target_epsilon=eps)


def pate_event(*, noise_std: float, num_queries: int) -> dp_event.DpEvent:
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

  Returns:
    `SelfComposedDpEvent(GaussianDpEvent(σ/√2), Q)` (NoOp if Q = 0).
  """
  sigma = validation.check_float("noise_std", noise_std, positive=False)
  num_queries = validation.check_int("num_queries", num_queries, minimum=0)
  return _repeat(dp_event.GaussianDpEvent(sigma / math.sqrt(2.0)), num_queries)
