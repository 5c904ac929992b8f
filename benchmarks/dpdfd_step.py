"""DPDFD step throughput: private step vs its non-private twin, and a per-part breakdown.

    PYTHONPATH=. python benchmarks/dpdfd_step.py [--batch_size=128] [--generator_channels=64]

Both steps are built from the same code; the twin swaps `private_output_gradients` for the raw
mean of the per-sample output gradients (no bounding, no noise). They are timed interleaved
in one process (ratios, not absolute numbers, are what to compare). The breakdown times each
part of the step as its own jitted function on the same inputs.
"""

from __future__ import annotations

import argparse
import pathlib as _pathlib
import sys as _sys
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax import models
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import step as dpdfd_step
from dpkd_jax.models import core
from dpkd_jax.privacy import mechanisms
from dpkd_jax.train.state import TrainState
import optax


def _state(args):
  key_s, key_g, key_t = jax.random.split(jax.random.key(0), 3)
  shape = (28, 28, 1)
  student = models.create_classifier(args.student, num_classes=10, input_shape=shape, rngs=nnx.Rngs(key_s))
  generator = models.create_generator("dafl", latent_dim=100, image_shape=shape, rngs=nnx.Rngs(key_g),
                                      base_channels=args.generator_channels)
  teacher = core.split(models.create_classifier(args.teacher, num_classes=10, input_shape=shape,
                                                rngs=nnx.Rngs(key_t)))
  tx = optax.adam(1e-3)
  state = dpdfd_step.DPDFDState(TrainState.create(core.split(student), tx),
                                TrainState.create(core.split(generator), tx))
  return state, dpdfd_step.TeacherEnsemble.stack([teacher])


def _time(fn, args_fn, repeats):
  times = []
  for _ in range(repeats):
    a = args_fn()
    start = time.perf_counter()
    jax.block_until_ready(fn(*a))
    times.append(time.perf_counter() - start)
  return times


def main():
  _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parent))
  import protocol  # pylint: disable=g-import-not-at-top  (sibling script)
  protocol.guard_script()  # speed is only measured on an idle machine
  p = argparse.ArgumentParser()
  p.add_argument("--batch_size", type=int, default=128)
  p.add_argument("--generator_channels", type=int, default=64)
  p.add_argument("--student", default="datalens_cnn")
  p.add_argument("--teacher", default="small_cnn")
  p.add_argument("--repeats", type=int, default=10)
  args = p.parse_args()
  config = dpdfd.DPDFDConfig(dataset="mnist", teacher_dirs=("unused",), noise_multiplier=100.0,
                             batch_size=args.batch_size)
  plan = dpdfd.make_plan(config)
  state, ens = _state(args)

  private = jax.jit(dpdfd_step.build_train_step(plan, config, ens.graphdef))
  original = dpdfd_step.private_output_gradients
  dpdfd_step.private_output_gradients = lambda plan, key, g: mechanisms.GaussianRelease(
      g.mean(0), jnp.zeros(()), jnp.ones(()))
  twin = jax.jit(dpdfd_step.build_train_step(plan, config, ens.graphdef))
  dpdfd_step.private_output_gradients = original
  key = jax.random.key(1)
  for fn in (private, twin):  # compile + warm up
    jax.block_until_ready(fn(state, ens.params, ens.batch_stats, key))

  rows = {"private": [], "twin": []}
  for _ in range(args.repeats):  # interleaved so both see the same machine load
    for name, fn in (("private", private), ("twin", twin)):
      rows[name] += _time(fn, lambda: (state, ens.params, ens.batch_stats, key), 1)
  print(f"# DPDFD step, B={args.batch_size}, DAFL width {args.generator_channels}, "
        f"student {args.student}, teacher {args.teacher}, {jax.devices()[0].platform}")
  print("| step | min s | median s | max s | steps/s (median) |")
  print("|---|---|---|---|---|")
  for name, t in rows.items():
    print(f"| {name} | {min(t):.3f} | {statistics.median(t):.3f} | {max(t):.3f} | {1 / statistics.median(t):.2f} |")
  print(f"ratio private/twin (median time): {statistics.median(rows['private']) / statistics.median(rows['twin']):.3f}")

  # Breakdown: each part on its own.
  gen, stu = state.generator, state.student
  z = jax.random.normal(key, (args.batch_size, 100))
  x = jax.jit(lambda p, s, z: core.apply(gen.graphdef, p, s, z, train=True)[0])(gen.params, gen.batch_stats, z)
  s_logits = jax.jit(lambda p, s, x: core.apply(stu.graphdef, p, s, x, train=True)[0].logits)(stu.params, stu.batch_stats, x)
  t_logits = dpdfd_step.teacher_logits(ens.graphdef, ens.params, ens.batch_stats, x)
  grads = dpdfd_step.per_sample_output_grads(config, s_logits, t_logits)
  parts = {
      "generator forward": (jax.jit(lambda p, s, z: core.apply(gen.graphdef, p, s, z, train=True)[0]),
                            (gen.params, gen.batch_stats, z)),
      "teacher forward": (jax.jit(lambda p, s, x: dpdfd_step.teacher_logits(ens.graphdef, p, s, x)),
                          (ens.params, ens.batch_stats, x)),
      "student forward + per-sample output grads": (
          jax.jit(lambda p, s, x, t: dpdfd_step.per_sample_output_grads(
              config, core.apply(stu.graphdef, p, s, x, train=True)[0].logits, t)),
          (stu.params, stu.batch_stats, x, t_logits)),
      "mechanism A_{C,sigma}": (jax.jit(lambda k, g: dpdfd_step.private_output_gradients(plan, k, g).noisy),
                                (key, grads)),
      "student update (grad)": (jax.jit(jax.grad(lambda p: dpdfd_step.student_loss(
          config, core.apply(stu.graphdef, p, stu.batch_stats, x, train=True)[0].logits, s_logits))),
          (stu.params,)),
      "generator update (grad through student)": (jax.jit(jax.grad(lambda p: dpdfd_step.student_loss(
          config, core.apply(stu.graphdef, stu.params, stu.batch_stats,
                             core.apply(gen.graphdef, p, gen.batch_stats, z, train=True)[0],
                             train=True)[0].logits, s_logits))), (gen.params,)),
  }
  print("\n| part | median s |\n|---|---|")
  for name, (fn, a) in parts.items():
    jax.block_until_ready(fn(*a))
    print(f"| {name} | {statistics.median(_time(fn, lambda: a, args.repeats)):.4f} |")


if __name__ == "__main__":
  main()
