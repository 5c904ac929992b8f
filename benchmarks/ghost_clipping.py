"""DP-SGD's clipped sum: ghost clipping vs vmap per-example gradients vs the plain batch gradient.

    PYTHONPATH=. python benchmarks/ghost_clipping.py [--models=lenet5,small_cnn]
        [--batches=256,4096] [--norm=group] [--memory_limit_gb=8] [--repeats=5]
        [--idle_wait=<s>] [--allow_busy]

Per model and batch size B, three jitted functions of (params, images, labels, mask):
  * batch: `grad` of the summed cross-entropy (non-private, the floor);
  * ghost: `models.ghost.ghost_clip_and_sum` (ghost norms + book-keeping);
  * vmap: `vmap(grad)` then `privacy.dpsgd_mechanism.dpsgd_clip_and_sum` (DP-SGD's path).
First each one runs alone in a child process under an address-space limit of
`--memory_limit_gb` (RLIMIT_AS) to measure its peak RSS; a variant that runs out of memory
there is reported as such and not timed. The ones that fit are then timed in this process,
interleaved, until the 95% intervals of the ratios to `batch` are within 5%
(`protocol.time_until_tight`). The protocol's idle and peak checks frame the run; with
`--allow_busy` (or DPKD_ALLOW_BUSY=1) it runs anyway and the table says INVALID.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import protocol  # noqa: E402  (idle check, peak check, repeat until the intervals are tight)

from dpkd_jax.models import core, ghost, registry  # noqa: E402
from dpkd_jax.privacy import dpsgd_mechanism  # noqa: E402

VARIANTS = ("batch", "ghost", "vmap")
CLIP = 1.0
INPUT_SHAPE = (28, 28, 1)


def _cross_entropy(out, label):
  return optax.softmax_cross_entropy_with_integer_labels(out.logits, label)


def build(variant: str, model: str, norm: str):
  """(jitted fn(params, x, labels, mask), params) of one variant."""
  parts = core.split(registry.create_classifier(model, num_classes=10, input_shape=INPUT_SHAPE,
                                                norm=norm, seed=0))
  graphdef, stats = parts.graphdef, parts.batch_stats

  def batch(params, x, labels, mask):
    def total(p):
      out, _ = core.apply(graphdef, p, stats, x, train=True)
      per_example = optax.softmax_cross_entropy_with_integer_labels(out.logits, labels)
      return jnp.sum(jnp.where(mask, per_example, 0.0))
    return jax.grad(total)(params)

  def ghost_sum(params, x, labels, mask):
    # allow_gram=False: what the DP-SGD step runs (methods/dpsgd/step.py).
    return ghost.ghost_clip_and_sum(graphdef, params, stats, x, labels, mask,
                                    loss_fn=_cross_entropy, l2_clip_norm=CLIP, allow_gram=False)

  def vmap_sum(params, x, labels, mask):
    def example(p, xi, label):
      out, _ = core.apply(graphdef, p, stats, xi[None], train=True)
      return _cross_entropy(jax.tree.map(lambda v: v[0], out), label)
    grads = jax.vmap(jax.grad(example), in_axes=(None, 0, 0))(params, x, labels)
    return dpsgd_mechanism.dpsgd_clip_and_sum(grads, mask, l2_clip_norm=CLIP)

  fn = {"batch": batch, "ghost": ghost_sum, "vmap": vmap_sum}[variant]
  return jax.jit(fn), parts.params


def inputs(batch_size: int, seed: int = 0):
  key_x, key_y = jax.random.split(jax.random.key(seed))
  return (jax.random.normal(key_x, (batch_size,) + INPUT_SHAPE),
          jax.random.randint(key_y, (batch_size,), 0, 10), jnp.ones(batch_size, bool))


def child(args) -> None:
  """One variant alone (a child process): compile, two calls, then print peak RSS as JSON."""
  limit = int(args.memory_limit_gb * (1 << 30))
  resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  fn, params = build(args.child, args.model, args.norm)
  data = inputs(args.batch)
  seconds = []  # the first call includes the compilation
  try:
    for _ in range(2):
      start = time.perf_counter()
      jax.block_until_ready(fn(params, *data))
      seconds.append(time.perf_counter() - start)
    status = "ok"
  except Exception as error:  # pylint: disable=broad-except  (reported as a table cell)
    status = ("out of memory" if "RESOURCE_EXHAUSTED" in str(error)
              or isinstance(error, MemoryError) else f"failed: {type(error).__name__}")
  # ru_maxrss is in KiB on Linux: the process's peak, compilation included.
  print(json.dumps({"status": status, "call_seconds": seconds,
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def peak_rss(variant: str, model: str, batch: int, args) -> dict:
  """Runs `child` for one variant; a crash (e.g. killed for memory) is reported as a status."""
  command = [sys.executable, __file__, f"--child={variant}", f"--model={model}",
             f"--batch={batch}", f"--norm={args.norm}",
             f"--memory_limit_gb={args.memory_limit_gb}"]
  done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(),
                        check=False)
  lines = done.stdout.strip().splitlines()
  if done.returncode != 0 or not lines:
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": f"exit {done.returncode}: {last[:80]}", "peak_rss_mb": float("nan")}
  return json.loads(lines[-1])


def time_fitting(model: str, batch: int, fitting: list[str], args) -> tuple[dict, bool]:
  """Interleaved timing (seconds per call) of the variants that fit in memory."""
  data = inputs(batch)
  steps = {}
  for variant in fitting:
    fn, params = build(variant, model, args.norm)
    steps[variant] = lambda i, fn=fn, params=params: jax.block_until_ready(fn(params, *data))
  pairs = [("batch", v) for v in fitting if v != "batch" and "batch" in fitting]
  return protocol.time_until_tight(steps, pairs, warmup=1, min_rounds=args.repeats,
                                   max_rounds=max(args.repeats, args.max_rounds))


def table_rows(model: str, batch: int, args) -> list[str]:
  memory = {v: peak_rss(v, model, batch, args) for v in VARIANTS}
  fitting = [v for v in VARIANTS if memory[v]["status"] == "ok"]
  times, tight = time_fitting(model, batch, fitting, args) if fitting else ({}, True)
  rows = []
  for variant in VARIANTS:
    rss = memory[variant]["peak_rss_mb"]
    if variant not in times:
      rows.append(f"| {model} | {batch} | {variant} | {memory[variant]['status']} | | "
                  f"{rss:.0f} |")
      continue
    ms = statistics.median(times[variant]) * 1e3
    ratio = "1" if variant == "batch" or "batch" not in times else "{:.2f} [{:.2f}, {:.2f}]".format(
        *protocol.ratio_interval(times["batch"], times[variant]))
    rows.append(f"| {model} | {batch} | {variant} | {ms:.1f} | {ratio}"
                f"{'' if tight else ' (not tight)'} | {rss:.0f} |")
  return rows


def peak_flops(size: int = 1024, repeats: int = 3) -> float:
  """Best FLOP/s of a float32 matmul (the protocol's measure of a busy machine)."""
  a = jnp.ones((size, size))
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, a))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(matmul(a, a))
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="lenet5,small_cnn")
  parser.add_argument("--batches", default="256,4096")
  parser.add_argument("--norm", default="group", choices=("group", "none"))
  parser.add_argument("--memory_limit_gb", type=float, default=8.0)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--max_rounds", type=int, default=30)
  parser.add_argument("--idle_wait", type=float, default=0.0)
  parser.add_argument("--allow_busy", action="store_true",
                      default=os.environ.get("DPKD_ALLOW_BUSY") == "1")
  parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
  parser.add_argument("--model", help=argparse.SUPPRESS)
  parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args)
    return
  conditions = protocol.start_conditions(peak_flops, max_wait_s=args.idle_wait,
                                         allow_busy=args.allow_busy)
  print(f"# DP-SGD clipped sum, {INPUT_SHAPE} inputs, norm={args.norm}, C={CLIP}, "
        f"{jax.devices()[0].platform}, memory limit {args.memory_limit_gb} GB per variant")
  print("| model | B | variant | median ms | time / batch [95%] | peak RSS MB |")
  print("|---|---|---|---|---|---|")
  for model in args.models.split(","):
    for batch in (int(b) for b in args.batches.split(",")):
      print("\n".join(table_rows(model, batch, args)), flush=True)
  conditions.finish(protocol.load1(), peak_flops())
  print(conditions.line())


if __name__ == "__main__":
  main()
