"""The mechanisms tour notebook: each privacy mechanism inside user JAX code, with its event."""

from nb_common import DEVICE
from nb_common import INSTALL


def mechanisms_tour() -> list[tuple[str, str]]:
  return [
      ("md", """
# Mechanisms tour: `dpkd_jax.privacy` inside your own JAX code

Every mechanism is a pure function `f(key, inputs, *, params)`, safe under `jit`, `vmap`,
`grad` and `lax.scan`, and every one has a `dp_accounting` event whose ε you compute with
`privacy.epsilon`. The unit of privacy is one record of the teacher's private training set;
the teacher is not private, so sensitivities are those of the whole release. Full reference:
docs/MECHANISMS.md; analysis: docs/privacy.md.
"""),
      ("code", INSTALL),
      ("code", DEVICE),
      ("code", '''
import warnings

import jax.numpy as jnp
import matplotlib.pyplot as plt

from dpkd_jax import privacy
from dpkd_jax.privacy import discrete_laplace

DELTA = 1e-5
NUM_STEPS = 20 if SMALL else 500
key = jax.random.key(0)  # one root key, split for every release below (never reused)'''),
      ("md", """
## 1. DPDFD's output-gradient mechanism in a jitted `lax.scan` training loop

A toy "student" (a linear map) is trained against a fixed "teacher" on synthetic inputs. Per
step, only the teacher-side per-sample gradient rows leave, through
`output_gradient_mechanism`; the student's update (`jax.grad` of an MSE to the noisy target)
is post-processing. Event: `dpdfd_event` (noise multiplier σ/(2√B) per step, no subsampling).
"""),
      ("code", '''
batch_size, dim, num_classes, sigma = 32, 8, 4, 20.0
key, teacher_key, data_key, noise_key = jax.random.split(key, 4)
teacher_weights = jax.random.normal(teacher_key, (dim, num_classes))  # the "private" model


def student_loss(weights, inputs, noisy_target):
  return 0.5 * jnp.mean(jnp.sum((inputs @ weights - noisy_target) ** 2, axis=1))


@jax.jit
def train(weights, keys):
  def one_step(weights, step_keys):
    data_key, noise_key = jax.random.split(step_keys)
    inputs = jax.random.normal(data_key, (batch_size, dim))  # (B, dim) synthetic queries
    student_logits = inputs @ weights  # (B, K)
    teacher_probs = jax.nn.softmax(inputs @ teacher_weights)
    per_sample_grads = jax.nn.softmax(student_logits) - teacher_probs  # (B, K) dCE/ds
    release = privacy.output_gradient_mechanism(
        noise_key, per_sample_grads, l2_clip_norm=1.0, noise_multiplier=sigma)
    noisy_target = jax.lax.stop_gradient(student_logits - release.noisy)  # (B, K)
    grads = jax.grad(student_loss)(weights, inputs, noisy_target)
    agreement = jnp.mean(jnp.argmax(student_logits, 1) == jnp.argmax(teacher_probs, 1))
    return weights - 0.05 * grads, agreement
  return jax.lax.scan(one_step, weights, keys)


key, train_key = jax.random.split(key)
weights, agreement = train(jnp.zeros((dim, num_classes)), jax.random.split(train_key, NUM_STEPS))
event = privacy.dpdfd_event(noise_multiplier=sigma, batch_size=batch_size, steps=NUM_STEPS)
print(event)
print(f"{NUM_STEPS} steps: sound eps = {privacy.epsilon(event, delta=DELTA):.3f} at delta {DELTA:g}; "
      f"teacher agreement first/last step {float(agreement[0]):.2f} / {float(agreement[-1]):.2f}")'''),
      ("md", "ε grows with the number of releases; more noise buys more steps:"),
      ("code", '''
step_counts = [1, 10, 100, 1000] if SMALL else [1, 10, 100, 1000, 10000]
fig, ax = plt.subplots(figsize=(5, 3.2))
for sigma_value in (50.0, 100.0, 200.0):
  eps = [privacy.epsilon(privacy.dpdfd_event(noise_multiplier=sigma_value, batch_size=256,
                                             steps=t), delta=DELTA) for t in step_counts]
  ax.loglog(step_counts, eps, "o-", label=f"σ = {sigma_value:g}")
ax.set_xlabel("DPDFD steps T (B = 256)")
ax.set_ylabel(f"sound ε at δ = {DELTA:g}")
ax.legend()
ax.grid(True, which="both", alpha=0.3)
plt.show()
steps = privacy.calibrate_dpdfd_steps(target_epsilon=10.0, delta=DELTA, noise_multiplier=100.0,
                                      batch_size=256, max_steps=1000)
print(f"at sigma = 100, B = 256, eps <= 10 allows {steps} steps")'''),
      ("md", """
## 2. RONA's `sanitize` under `vmap`: many query batches at once

The whole (B, K) knowledge tensor is bounded to Frobenius norm B and noised with N(0, σ²B²).
Sensitivity 2B, so `rona_event` uses σ/2 per release. `vmap` over split keys releases several
batches; each is a separate release in the event.
"""),
      ("code", '''
num_batches, query_batch = 6, 16
key, data_key, noise_key = jax.random.split(key, 3)
soft_labels = jax.nn.softmax(jax.random.normal(data_key, (num_batches, query_batch, 10)))
sanitize_all = jax.jit(jax.vmap(
    lambda k, x: privacy.sanitize(k, x, l2_clip_norm=1.0, noise_multiplier=6.0)))
release = sanitize_all(jax.random.split(noise_key, num_batches), soft_labels)
print("noisy knowledge", release.noisy.shape, "noise multiplier per release",
      float(release.accounting_noise_multiplier[0]))
event = privacy.rona_event(noise_multiplier=6.0, num_queries=num_batches)
print(f"sound eps of {num_batches} releases: {privacy.epsilon(event, delta=DELTA):.3f}")
with warnings.catch_warnings():
  warnings.simplefilter("ignore", privacy.PaperAccountingWarning)
  print(f"RONA paper's per-query figure (sensitivity B, NOT ours): "
        f"{privacy.paper_rona_epsilon(noise_multiplier=6.0, delta=DELTA):.3f}")'''),
      ("md", """
## 3. Selective randomized response (label DP) and what it costs per record

Each query's label is ε-label-DP for a fixed public prior. One private record can change the
teacher's label on every query, so n queries compose: `srr_event` (binary-RR bound).
"""),
      ("code", '''
num_queries, eps_per_query = 2000, 2.0
key, label_key, prior_key, rr_key = jax.random.split(key, 4)
true_labels = jax.random.randint(label_key, (num_queries,), 0, 10)
prior = jax.nn.softmax(3.0 * jax.random.normal(prior_key, (num_queries, 10)))  # public prior
# Arrays go in as arguments (closed-over constants would be constant-folded at compile time).
result = jax.jit(lambda k, y, p: privacy.selective_randomized_response(
    k, y, p, epsilon=eps_per_query, threshold=0.1))(rr_key, true_labels, prior)
print(f"mean candidate-set size {float(result.set_sizes.mean()):.2f}; released labels equal "
      f"to the teacher's: {float(jnp.mean(result.noisy_labels == true_labels)):.2f}")
with warnings.catch_warnings():
  warnings.simplefilter("ignore", privacy.PaperAccountingWarning)
  print("paper: label-DP per query =", privacy.paper_srr_label_epsilon(eps_per_query))
event = privacy.srr_event(epsilon_per_query=eps_per_query, num_queries=num_queries)
print(f"record-level eps of all {num_queries} queries: {privacy.epsilon(event, delta=DELTA):.1f}")'''),
      ("md", """
## 4. Noisy vote counts (reverse k-NN): central discrete Laplace and local bit flipping

Central: exact integer (discrete Laplace) noise of scale Δ₁/ε per cell, Δ₁ = 2·k·r under
replace-one; `discrete_laplace_counts_event`.
Local: every record flips its own bits with p = 1/(e^{ε/(2kr)} + 1), pure ε-LDP per report.
"""),
      ("code", '''
k, r, epsilon = 1, 1, 0.5
num_records, num_queries_knn, num_classes_knn = 3000, 5, 10
key, vote_key, laplace_key, flip_key = jax.random.split(key, 4)
votes = jax.random.randint(vote_key, (num_records,), 0, num_queries_knn * num_classes_knn)
vote_bits = jax.nn.one_hot(votes, num_queries_knn * num_classes_knn, dtype=jnp.int32)
counts = vote_bits.sum(axis=0).reshape(num_queries_knn, num_classes_knn)
central = privacy.laplace_counts(laplace_key, counts, l1_sensitivity=2 * k * r, epsilon=epsilon)
local_reports = privacy.ldp_flip_bits(flip_key, vote_bits, epsilon=epsilon, k=k, r=r)
local = privacy.ldp_unbiased_counts(local_reports.sum(axis=0), num_records, epsilon=epsilon,
                                    k=k, r=r).reshape(counts.shape)
print(f"mean |error| central {float(jnp.abs(central - counts).mean()):.1f}, "
      f"local {float(jnp.abs(local - counts).mean()):.1f} (true counts ~{float(counts.mean()):.0f})")
central_event = privacy.discrete_laplace_counts_event(
    scale=discrete_laplace.rational_scale(2 * k * r, epsilon), l1_sensitivity=2 * k * r, rounds=1)
print("central eps:", privacy.epsilon(central_event, delta=DELTA))'''),
      ("md", """
## 5. A budget that refuses before it overshoots, and an empirical audit

`PrivacyLedger.check` raises `BudgetExceededError` before a release that would exceed the
target. `audit_mechanism` gives an empirical **lower** bound on ε from a neighbouring pair;
for a sound mechanism it stays below the accountant's ε.
"""),
      ("code", '''
ledger = privacy.PrivacyLedger(target_epsilon=3.0, delta=DELTA)
step_event = privacy.dpdfd_event(noise_multiplier=100.0, batch_size=256, steps=1)
step = 0
try:
  while True:
    ledger.check(step_event)
    ledger.record(step_event, step=step)  # (the release itself would happen here)
    step += 1
except privacy.BudgetExceededError as err:
  print(f"refused after {step} releases (spent eps {ledger.spent_epsilon():.3f}):", str(err)[:60], "...")

sigma_audit, rows = 4.0, 4
x = jnp.ones((rows, 2))
mechanism = lambda k, g: privacy.output_gradient_mechanism(  # noqa: E731
    k, g, l2_clip_norm=1.0, noise_multiplier=sigma_audit, method="clip").noisy
key, audit_key = jax.random.split(key)
audit = privacy.audit_mechanism(audit_key, mechanism, x, -x, delta=DELTA,
                                num_samples=4000 if SMALL else 100_000)
accountant_eps = privacy.epsilon(
    privacy.dpdfd_event(noise_multiplier=sigma_audit, batch_size=rows, steps=1), delta=DELTA)
print(f"audit: eps >= {audit.epsilon_lower_bound:.2f} (95%), accountant eps = {accountant_eps:.2f}")
assert audit.epsilon_lower_bound <= accountant_eps'''),
  ]
