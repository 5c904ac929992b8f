"""Label-DP randomized response: k-ary RR and selective RR over a prior's candidate set.

Both mechanisms release one noisy label per query and are pure functions of
`(key, labels, ...)` (key first and required, never reused: it is split once per draw), fully
vectorized with fixed shapes, safe under `jax.jit`, `jax.vmap` and `lax.scan`. Static
parameters (`num_classes`, `epsilon`, `threshold`) are validated in Python when concrete.

Privacy unit: one query's label (label-DP). Each released label is `epsilon`-DP with respect to
that query's true label, *for a fixed public prior*: for any two true labels y, y' and any
output o, P(o | y) <= e^epsilon P(o | y'). Releases over different queries compose (each
query's label is used once per release).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from dpkd_jax.privacy import validation


class SelectiveRRResult(NamedTuple):
  """Output of `selective_randomized_response`.

  Attributes:
    noisy_labels: (B,) released labels, always members of the row's candidate set.
    candidate_mask: (B, K) bool, the candidate set of each row (a function of the prior only).
    set_sizes: (B,) int32, number of candidates per row (>= 2); public like the mask, so it
      may be handed to an accountant or a debiasing step. Whether the true label was in the
      set is private and deliberately not returned.
  """

  noisy_labels: jax.Array
  candidate_mask: jax.Array
  set_sizes: jax.Array


def keep_probability(epsilon: float | jax.Array, set_size: int | jax.Array) -> jax.Array:
  """Probability that k-ary RR returns the true label: e^eps / (e^eps + k - 1).

  Written as 1 / (1 + (k - 1) e^-eps) so that large eps (e^eps overflows float32 at ~88)
  and eps = inf give 1 instead of inf / inf = NaN.

  Args:
    epsilon: eps > 0 (scalar or array, broadcast with `set_size`).
    set_size: k >= 2, the number of possible outputs.

  Returns:
    float32 array of keep probabilities with the broadcast shape of the inputs.
  """
  epsilon = jnp.asarray(epsilon, jnp.float32)
  set_size = jnp.asarray(set_size, jnp.float32)
  return 1.0 / (1.0 + (set_size - 1.0) * jnp.exp(-epsilon))


def randomized_response(
    key: jax.Array,
    labels: jax.Array,
    *,
    num_classes: int,
    epsilon: float,
) -> jax.Array:
  """k-ary randomized response on a batch of labels.

  Each label is kept with probability e^eps / (e^eps + k - 1) and otherwise replaced by one
  of the other k - 1 labels chosen uniformly, i.e. every other label has probability
  1 / (e^eps + k - 1). The output ratio for two true labels is at most e^eps (eps-label-DP).
  A label outside [0, k) (which cannot be checked under jit) is answered with a uniform label,
  which is also within the e^eps ratio of every valid label.

  Args:
    key: a `jax.random.key`; split into three independent draws.
    labels: (B,) integer labels in [0, num_classes).
    num_classes: k >= 2 (Python int).
    epsilon: eps > 0 per label; `math.inf` keeps every label (no privacy).

  Returns:
    (B,) noisy labels in [0, num_classes), same dtype as `labels`.
  """
  validation.check_int("num_classes", num_classes, minimum=2)
  validation.check_float("epsilon", epsilon, positive=True, allow_inf=True)  # inf: no privacy
  chex.assert_rank(labels, 1)
  chex.assert_type(labels, int)
  keep_key, offset_key, uniform_key = jax.random.split(key, 3)
  keep = jax.random.bernoulli(keep_key, keep_probability(epsilon, num_classes), labels.shape)
  # An offset uniform on {1, ..., k-1} added mod k is a uniform draw over the other labels.
  offsets = jax.random.randint(offset_key, labels.shape, 1, num_classes, labels.dtype)
  other_labels = (labels + offsets) % num_classes  # (B,)
  uniform_labels = jax.random.randint(uniform_key, labels.shape, 0, num_classes, labels.dtype)
  in_range = (labels >= 0) & (labels < num_classes)
  noisy = jnp.where(in_range, jnp.where(keep, labels, other_labels), uniform_labels)
  chex.assert_equal_shape((noisy, labels))
  return noisy


def candidate_set_mask(prior_probs: jax.Array, threshold: float) -> jax.Array:
  """(B, K) prior -> (B, K) bool: classes with prior >= threshold, plus the top-2 always.

  Ties for the top-2 are broken towards the lower class index (`lax.top_k`), so the mask is a
  deterministic function of the prior.

  Args:
    prior_probs: (B, K) public prior over K >= 2 classes for each query.
    threshold: tau in [0, 1].

  Returns:
    (B, K) bool candidate mask with at least two True entries per row.
  """
  chex.assert_rank(prior_probs, 2)
  num_classes = prior_probs.shape[1]
  if num_classes < 2:
    raise ValueError(f"prior_probs must have >= 2 classes, got shape {prior_probs.shape}")
  _, top2 = jax.lax.top_k(prior_probs, 2)  # (B, 2)
  class_ids = jnp.arange(num_classes)
  top2_mask = jnp.any(top2[:, :, None] == class_ids[None, None, :], axis=1)  # (B, K)
  return (prior_probs >= threshold) | top2_mask


def selective_randomized_response(
    key: jax.Array,
    labels: jax.Array,
    prior_probs: jax.Array,
    *,
    epsilon: float,
    threshold: float,
) -> SelectiveRRResult:
  """Selective randomized response: RR restricted to the prior's candidate set.

  Per row, the candidate set S = {c : prior[c] >= tau} together with the two classes of
  highest prior (always kept), k = |S| >= 2. If the true label y is in S it is kept with
  probability e^eps / (e^eps + k - 1) and each other member of S is returned with
  probability 1 / (e^eps + k - 1); if y is not in S the output is uniform over S.

  Why this is eps-label-DP per query (the prior must not depend on the private label, e.g.
  the student's prediction on a public query, or an earlier DP release): S, hence k, is then
  fixed independently of y, and every output probability lies in
  [1/(e^eps + k - 1), e^eps/(e^eps + k - 1)]; the uniform case 1/k lies in between because
  k <= e^eps + k - 1 <= k e^eps. So for any two true labels y, y' and any output o,
  P(o | y) / P(o | y') <= e^eps.

  Args:
    key: a `jax.random.key`, used once for a (B, K) Gumbel draw.
    labels: (B,) integer true labels in [0, K) (an out-of-range label is "not in S").
    prior_probs: (B, K) public prior for each query (K >= 2).
    epsilon: eps > 0 per query; `math.inf` keeps labels that are in S.
    threshold: tau in [0, 1]; tau = 0 makes S all K classes (plain k-ary RR).

  Returns:
    SelectiveRRResult(noisy_labels (B,) int32, candidate_mask (B, K), set_sizes (B,) int32).
  """
  validation.check_float("epsilon", epsilon, positive=True, allow_inf=True)  # inf: no privacy
  if not isinstance(threshold, jax.core.Tracer) and not 0.0 <= float(threshold) <= 1.0:
    raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
  chex.assert_rank([labels, prior_probs], [1, 2])
  chex.assert_type(labels, int)
  chex.assert_equal_shape_prefix((labels, prior_probs), 1)
  mask = candidate_set_mask(prior_probs, threshold)  # (B, K)
  set_sizes = jnp.sum(mask, axis=1, dtype=jnp.int32)  # (B,)
  class_ids = jnp.arange(prior_probs.shape[1])
  is_true_member = (class_ids[None, :] == labels[:, None]) & mask  # (B, K), <= 1 True per row
  # Unnormalised log-probabilities: members 0, the true label (if a member) eps, others -inf.
  # Softmax gives exactly e^eps/(e^eps+k-1) and 1/(e^eps+k-1), or 1/k if y is not in S.
  log_weights = jnp.where(mask, 0.0, -jnp.inf) + jnp.where(is_true_member, epsilon, 0.0)
  noisy_labels = jax.random.categorical(key, log_weights, axis=1).astype(jnp.int32)  # (B,)
  chex.assert_equal_shape((noisy_labels, labels))
  return SelectiveRRResult(noisy_labels=noisy_labels, candidate_mask=mask, set_sizes=set_sizes)


def selective_rr_log_likelihood(released_labels: jax.Array, candidate_mask: jax.Array,
                                epsilon: float | jax.Array) -> jax.Array:
  """log P(selective RR releases y~ | true label y), for every class y: the mechanism's channel.

  With the row's candidate set S (k = |S|) and a released member y~, the channel of
  `selective_randomized_response` is T(y, y~) = `keep_probability(eps, k)` =
  e^eps/(e^eps+k-1) if y = y~, 1/(e^eps+k-1) if y is another member of S, 1/k if y is not in
  S. Functions of released labels and public sets only (post-processing): e.g. the likelihood
  sum_y p_y T(y, y~) of a release under a belief p over the true label.

  Args:
    released_labels: (B,) released labels, members of their rows' candidate sets.
    candidate_mask: (B, K) bool, the public candidate sets of the release (k >= 2 per row).
    epsilon: eps > 0 per query of the release (`math.inf`: members pass unchanged).

  Returns:
    (B, K) float32 log T(y, y~[b]) for each true class y (-inf where impossible).
  """
  chex.assert_rank([released_labels, candidate_mask], [1, 2])
  chex.assert_equal_shape_prefix((released_labels, candidate_mask), 1)
  k = jnp.sum(candidate_mask, axis=-1, keepdims=True).astype(jnp.float32)  # (B, 1)
  log_keep = jnp.log(keep_probability(epsilon, k))  # (B, 1); 0 for eps = inf
  log_other = log_keep - epsilon  # 1/(e^eps+k-1) = keep e^-eps; -inf for eps = inf
  is_label = jax.nn.one_hot(released_labels, candidate_mask.shape[-1], dtype=bool)  # (B, K)
  return jnp.where(candidate_mask, jnp.where(is_label, log_keep, log_other), -jnp.log(k))
