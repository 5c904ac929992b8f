"""Empirical ε lower bounds (privacy/audit.py) next to the accountant's ε.

    PYTHONPATH=. python benchmarks/audit_figures.py

Worst-case neighbouring pair for the output-gradient mechanism: every row bounded to norm C in
opposite directions (the teacher flipped by one record). A sound mechanism's lower bound must
stay below the accountant's ε; the deliberately broken one (noise 10× too small) must exceed it.
"""

import math

import jax
import jax.numpy as jnp

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import audit
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import randomized_response as rr

B, K, DELTA, N = 4, 3, 1e-5, 40_000


def main() -> None:
  sigma = 2.0 * 2 * math.sqrt(B)  # accounting multiplier sigma / (2 sqrt(B)) = 2
  claimed = accounting.epsilon(accounting.dpdfd_event(noise_multiplier=sigma, batch_size=B, steps=1),
                               delta=DELTA)
  rows = 10.0 * jnp.ones((B, K))
  print(f"| mechanism | accountant ε (δ={DELTA}) | audit ε lower bound (95%, N={N}) |")
  print("|---|---|---|")
  for name, s in (("output-gradient A_{C,σ}, σ as accounted", sigma),
                  ("same, noise 10× too small (broken)", sigma / 10)):
    mech = lambda key, g, s=s: mechanisms.output_gradient_mechanism(  # noqa: E731
        key, g, l2_clip_norm=1.0, noise_multiplier=s).noisy
    result = audit.audit_mechanism(jax.random.key(0), mech, rows, -rows, num_samples=N, delta=DELTA)
    print(f"| {name} | {claimed:.3f} | {result.epsilon_lower_bound:.3f} |")
  labels, other = jnp.zeros((1,), jnp.int32), jnp.ones((1,), jnp.int32)
  for name, eps in (("k-ary RR, ε = 1", 1.0), ("RR claimed ε = 1 but run at ε = 10 (broken)", 10.0)):
    mech = lambda key, y, eps=eps: rr.randomized_response(key, y, num_classes=4, epsilon=eps)  # noqa: E731
    stat = lambda out: (out[0] == 1).astype(jnp.float32)  # noqa: E731  (high = "input was 1")
    result = audit.audit_mechanism(jax.random.key(1), mech, labels, other, num_samples=N,
                                   statistic=stat)
    print(f"| {name} | 1.000 | {result.epsilon_lower_bound:.3f} |")


if __name__ == "__main__":
  main()
