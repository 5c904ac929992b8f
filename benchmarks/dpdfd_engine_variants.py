"""Side-by-side variants of the data-free DPDFD engine: what makes it learn?

    DPKD_DATA_DIR=../shared/data PYTHONPATH=. python benchmarks/dpdfd_engine_variants.py \
        --dataset=mnist --teacher=runs/teacher/mnist_small_cnn_aug3 --steps=1000 \
        --variant=<name> [variant flags] --out=runs/engine/<name>

A research harness, not the library's step (`dpkd_jax.methods.dpdfd.step`): one jitted step
with the engine's parts switchable, at σ = 0 by default, so that each change is measured on the
same budget. It writes `<out>/metrics.csv` (test accuracy per evaluation) and `<out>/record.json`
(the results-record schema; `python -m experiments.results publish --run=<out>` commits it).

Variants (flags) and whether they keep DPDFD's privacy argument (the teacher reaches student and
generator only through the released rows):
  --teacher_loss dkd|ce|kl|logit|logit_centred|l1   the row dL_T/ds (released; all keep it)
  --student_norm batch|group                        student normalisation (keeps it)
  --generator_objective paper|adversarial|fixed     L_S (+) or (-) in the generator loss, or a
                                                    frozen random generator (keep it)
  --generator_objective teacher                     DAFL's L_G on the TEACHER's output: reads the
                                                    teacher without noise (epsilon = inf; a
                                                    diagnostic of what a teacher prior buys)
  --generator_from DIR                              start from an SRR generator pretrained
                                                    against the teacher (`experiments.srr
                                                    pretrain`): epsilon = inf, a diagnostic
  --generator_objective zeroth_order                the generator ascends the disagreement
                                                    D(x) = ||s(x) - y_s(x)||_1 = γ||released
                                                    row||_1, its gradient w.r.t. x estimated by
                                                    forward differences along random unit
                                                    directions (DFME, Truong et al. 2021): the
                                                    teacher is read only through the released
                                                    rows of the probes x + δu, which are extra
                                                    queries (B·(1 + zo_directions) rows on a
                                                    generator step). Needs rows whose size
                                                    carries the disagreement: --bound_method=clip.
  --tv_weight, --shift, --replay/--replay_steps, --ema, --generator_every   teacher-free extras
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from dpkd_jax import data
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.methods.dpdfd import privacy
from dpkd_jax.methods.dpdfd import run as run_lib
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import records

TEACHER_LOSSES = ("dkd", "ce", "kl", "logit", "logit_centred", "l1")
OBJECTIVES = ("paper", "adversarial", "fixed", "teacher", "zeroth_order")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
  """The switchable parts of the engine (defaults: the library's paper engine at σ = 0)."""

  teacher_loss: str = "dkd"
  generator_objective: str = "paper"
  adversarial_weight: float = 1.0
  tv_weight: float = 0.0  # total variation of generated images (a teacher-free image prior)
  shift: int = 0  # student sees x rolled by up to ±shift pixels (target of the unshifted x)
  replay: int = 0  # buffer of released (x, y_s) batches replayed to the student
  replay_steps: int = 0
  ema: float = 0.0  # also evaluate an exponential moving average of the student
  generator_every: int = 1
  zo_directions: int = 1  # "zeroth_order": random directions per generated sample
  zo_step: float = 1e-3  # "zeroth_order": finite-difference step along each unit direction
  student_steps_loss: str = "config"  # "l1": the student fits y_s in L1 (DFME), else L_S

  def __post_init__(self):
    if self.teacher_loss not in TEACHER_LOSSES:
      raise ValueError(f"teacher_loss must be one of {TEACHER_LOSSES}")
    if self.generator_objective not in OBJECTIVES:
      raise ValueError(f"generator_objective must be one of {OBJECTIVES}")

  @property
  def reads_teacher_without_noise(self) -> bool:
    return self.generator_objective == "teacher"


def rows(variant: Variant, config: config_lib.DPDFDConfig, s: jax.Array,
         t: jax.Array) -> jax.Array:
  """(B, K) released rows dL_T(t, s)/ds before the mechanism."""
  name = variant.teacher_loss
  if name == "dkd":
    return step_lib.per_sample_output_grads(config, s, t[None])[0]
  if name == "ce":  # CE against the teacher's argmax
    return jax.nn.softmax(s) - jax.nn.one_hot(jnp.argmax(t, -1), s.shape[-1])
  if name == "kl":
    return jax.nn.softmax(s) - jax.nn.softmax(t)
  if name == "logit":
    return s - t
  if name == "logit_centred":  # softmax-invariant part of the logit gap
    d = s - t
    return d - d.mean(-1, keepdims=True)
  return jnp.sign(s - t)  # l1 (DFAD's loss)


def _tv(x: jax.Array) -> jax.Array:
  return (jnp.abs(x[:, 1:] - x[:, :-1]).mean() + jnp.abs(x[:, :, 1:] - x[:, :, :-1]).mean())


def _generator_update(variant, config, state, target, z, gen_stats, teacher):
  """Generator step through the updated student (or, for "teacher", the teacher itself)."""
  gen, stu = state.generator, state.student

  def loss(params):
    x_g, _ = core.apply(gen.graphdef, params, gen.batch_stats, z, train=True)
    if variant.generator_objective == "teacher":  # epsilon = inf: the teacher without noise
      out, _ = core.apply(*teacher, x_g, train=False)
      return sum(step_lib.generator_loss_terms(config, out).values())
    out, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, x_g, train=True)
    terms = step_lib.generator_loss_terms(config, out)
    sign = -variant.adversarial_weight if variant.generator_objective == "adversarial" else 1.0
    terms["student"] = sign * step_lib.student_loss(config, out.logits, target)
    terms["tv"] = variant.tv_weight * _tv(x_g)
    return sum(terms.values())

  return gen.apply_gradients(jax.grad(loss)(gen.params), gen_stats)


def _disagreement_direction(variant, config, plan, teacher, stu, x, noisy, key):
  """(B, ...) forward-difference estimate of ∇_x D(x), D = γ||released row of x||_1.

  D(x) = ||s(x) - y_s(x)||_1 (y_s = s - γ·row) is computed from the released rows alone: the
  teacher enters only through the rows of the probes x + δ·u, each released by the same
  mechanism (own noise key) as an ordinary query. ∇D ≈ (d/m) Σ_j (D(x + δu_j) - D(x))/δ · u_j
  with u_j uniform on the unit sphere of the image space (d = its dimension), as DFME.
  """
  batch, dim = x.shape[0], math.prod(x.shape[1:])
  m = variant.zo_directions
  u = jax.random.normal(jax.random.fold_in(key, 0), (m,) + x.shape)
  u = u / jnp.linalg.norm(u.reshape(m, batch, dim), axis=-1).reshape((m, batch) + (1,) * (
      x.ndim - 1))
  probes = (x[None] + variant.zo_step * u).reshape((m * batch,) + x.shape[1:])
  t_out, _ = core.apply(*teacher, probes, train=False)
  s_out, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, probes, train=True)
  released = step_lib.release_rows(plan, jax.random.fold_in(key, 1),
                                   rows(variant, config, s_out.logits, t_out.logits))
  d_probe = config.gamma * jnp.abs(released.noisy).sum(-1).reshape(m, batch)
  d_base = config.gamma * jnp.abs(noisy).sum(-1)  # (B,)
  slope = (d_probe - d_base[None]) / variant.zo_step  # (m, B)
  grad = dim / m * jnp.sum(slope.reshape((m, batch) + (1,) * (x.ndim - 1)) * u, axis=0)
  return jax.lax.stop_gradient(grad)


def _generator_ascent(gen, z, direction, gen_stats):
  """One generator step up the estimated ∇_x D: the loss -Σ_i <direction_i, G(z_i)> / B."""
  def loss(params):
    x_g, _ = core.apply(gen.graphdef, params, gen.batch_stats, z, train=True)
    return -jnp.sum(direction * x_g) / x_g.shape[0]
  return gen.apply_gradients(jax.grad(loss)(gen.params), gen_stats)


def build_step(variant: Variant, config: config_lib.DPDFDConfig, plan: privacy.DPDFDPlan,
               teacher: tuple[Any, Any, Any]):
  """`step(state, buffer, key, i, update_generator) -> (state, buffer, student_loss)`."""
  def student_loss(stu, params, x, y):
    out, stats = core.apply(stu.graphdef, params, stu.batch_stats, x, train=True)
    if variant.student_steps_loss == "l1":  # DFME's student loss on the logits
      return jnp.abs(out.logits - y).sum(-1).mean(), stats
    return step_lib.student_loss(config, out.logits, y), stats

  def step(state, buffer, key, i, update_generator):
    z_key, noise_key, replay_key, shift_key = (jax.random.fold_in(key, j) for j in range(4))
    z = jax.random.normal(z_key, (plan.batch_size, config.latent_dim))
    gen, stu = state.generator, state.student
    state_before = stu
    x, gen_stats = core.apply(gen.graphdef, gen.params, gen.batch_stats, z, train=True)
    x = jax.lax.stop_gradient(x)
    t_out, _ = core.apply(*teacher, x, train=False)
    s_out, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, x, train=True)
    release = step_lib.release_rows(plan, noise_key,
                                    rows(variant, config, s_out.logits, t_out.logits))
    target = jax.lax.stop_gradient(s_out.logits - config.gamma * release.noisy)
    x_student = x
    if variant.shift:
      offset = jax.random.randint(shift_key, (2,), -variant.shift, variant.shift + 1)
      x_student = jnp.roll(x, (offset[0], offset[1]), axis=(1, 2))
    grad = jax.value_and_grad(lambda p, xx, yy: student_loss(stu, p, xx, yy), has_aux=True)
    (loss, stats), grads = grad(stu.params, x_student, target)
    stu = stu.apply_gradients(grads, stats)
    if variant.replay:
      bx, by = buffer
      bx, by = bx.at[i % variant.replay].set(x), by.at[i % variant.replay].set(target)
      for r in range(variant.replay_steps):
        j = jax.random.randint(jax.random.fold_in(replay_key, r), (), 0,
                               jnp.minimum(i + 1, variant.replay))
        (_, stats), grads = grad(stu.params, bx[j], by[j])
        stu = stu.apply_gradients(grads, stats)
      buffer = (bx, by)
    state = step_lib.DPDFDState(stu, gen)
    if variant.generator_objective == "zeroth_order" and update_generator:
      direction = _disagreement_direction(variant, config, plan, teacher, state_before, x,
                                          release.noisy, jax.random.fold_in(key, 4))
      gen = _generator_ascent(gen, z, direction, gen_stats)
    elif variant.generator_objective != "fixed" and update_generator:
      gen = _generator_update(variant, config, state, target, z, gen_stats, teacher)
    return step_lib.DPDFDState(stu, gen), buffer, loss

  return step


def _parse(argv: list[str]) -> tuple[argparse.Namespace, Variant, config_lib.DPDFDConfig]:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dataset", default="digits")
  p.add_argument("--teacher", default="runs/teacher/digits_small_cnn")
  p.add_argument("--out", required=True)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--eval_every", type=int, default=250)
  for field in dataclasses.fields(Variant):
    p.add_argument(f"--{field.name}", type=type(field.default), default=field.default)
  for name, default in (("steps", 1000), ("batch_size", 64), ("generator_channels", 64)):
    p.add_argument(f"--{name}", type=int, default=default)
  for name, default in (("noise_multiplier", 0.0), ("gamma", 1.0), ("l2_norm_bound", 1.0),
                        ("student_lr", 1e-3), ("generator_lr", 1e-3)):
    p.add_argument(f"--{name}", type=float, default=default)
  p.add_argument("--generator_from", default=None,
                 help="an `experiments.srr pretrain` workdir (teacher prior: epsilon = inf)")
  p.add_argument("--student_model", default="datalens_cnn")
  p.add_argument("--student_norm", default="batch")
  p.add_argument("--bound_method", default="normalize", choices=("normalize", "clip"))
  a = p.parse_args(argv)
  variant = Variant(**{f.name: getattr(a, f.name) for f in dataclasses.fields(Variant)})
  config = config_lib.DPDFDConfig(
      dataset=a.dataset, teacher_dirs=(a.teacher,), noise_multiplier=a.noise_multiplier,
      steps=a.steps, batch_size=a.batch_size, student_model=a.student_model,
      student_norm=a.student_norm, generator_channels=a.generator_channels, gamma=a.gamma,
      l2_clip_norm=a.l2_norm_bound, bound_method=a.bound_method,
      student_learning_rate=a.student_lr, generator_learning_rate=a.generator_lr,
      seed=a.seed, eval_every=a.eval_every, data_dir=os.environ.get("DPKD_DATA_DIR"))
  return a, variant, config


def _with_pretrained_generator(state, config, a, teacher):
  """The state with SRR's teacher-pretrained generator (same architecture and latent size);
  `teacher`: the loaded teacher's `ModelParts`, which the generator's identity names by hash."""
  from dpkd_jax.methods import srr  # noqa: PLC0415 (a benchmark may join two methods)
  from dpkd_jax.methods.srr import pretraining
  srr_config = srr.SRRConfig(dataset=a.dataset, teacher_dir=a.teacher, epsilon=10.0,
                             generator_channels=a.generator_channels,
                             latent_dim=config.latent_dim,
                             pretrained_generator_dir=a.generator_from)
  gen = state.generator
  parts = pretraining.load_pretrained(a.generator_from, gen.parts,
                                      config=srr_config.pretrain_config(),
                                      identity=srr_config.generator_identity(teacher),
                                      teacher_dir=a.teacher)
  generator = type(gen).create(parts, gen.tx)
  return step_lib.DPDFDState(state.student, generator)


def main(argv: list[str]) -> None:
  a, variant, config = _parse(argv)
  os.makedirs(a.out, exist_ok=True)
  clock = (time.process_time(), time.time())
  ensemble, _ = run_lib.load_teachers(config)
  teacher = (ensemble.graphdef, *(jax.tree.map(lambda v: v[0], t)
                                  for t in (ensemble.params, ensemble.batch_stats)))
  plan = privacy.make_plan(config, 1)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  init_key, train_key = jax.random.split(jax.random.key(a.seed))
  state = step_lib.init_state(config, init_key)
  if a.generator_from:
    state = _with_pretrained_generator(state, config, a, ensemble.member(0))
  slots = max(variant.replay, 1)
  buffer = (jnp.zeros((slots, a.batch_size) + config.info.image_shape),
            jnp.zeros((slots, a.batch_size, config.info.num_classes)))
  step = jax.jit(build_step(variant, config, plan, teacher), donate_argnums=(0, 1),
                 static_argnums=4)
  average = jax.jit(lambda e, p: jax.tree.map(lambda u, v: variant.ema * u + (1 - variant.ema) * v,
                                              e, p))
  ema = jax.tree.map(jnp.copy, state.student.params)
  writer = metrics_lib.MetricsWriter(a.out, resume_step=0)
  accuracy = math.nan
  for i in range(a.steps):
    state, buffer, loss = step(state, buffer, jax.random.fold_in(train_key, i), i,
                               i % variant.generator_every == 0)
    if variant.ema:
      ema = average(ema, state.student.params)
    if (i + 1) % a.eval_every == 0 or i + 1 == a.steps:
      accuracy = evaluate.evaluate(state.student.parts, test)["accuracy"]
      scores = {"accuracy": accuracy}
      if variant.ema:
        parts = state.student.parts
        scores["ema_accuracy"] = evaluate.evaluate(
            core.ModelParts(parts.graphdef, ema, parts.batch_stats), test)["accuracy"]
      writer.write(i + 1, scores, prefix="test/")
      print(f"{os.path.basename(a.out)} step {i + 1} {scores} loss {float(loss):.4f}",
            flush=True)
  writer.close()
  # The probe rows of "zeroth_order" are releases this harness's plan does not count: its ε
  # would be an under-count, so the record says inf (the library's step accounts them).
  no_guarantee = (a.noise_multiplier == 0 or variant.reads_teacher_without_noise
                  or a.generator_from or variant.generator_objective == "zeroth_order")
  sound = math.inf if no_guarantee else plan.sound_epsilon
  record = records.make_record(
      method="dpdfd", dataset=config.dataset, test_accuracy=accuracy, sound_epsilon=sound,
      delta=config.delta, neighbouring="replace-one", accounting="sound",
      cpu_seconds=time.process_time() - clock[0], wall_seconds=time.time() - clock[1],
      command="PYTHONPATH=. python benchmarks/dpdfd_engine_variants.py " + " ".join(argv),
      extra={"columns": {"variant": dataclasses.asdict(variant), "steps": a.steps,
                         "student_norm": a.student_norm}})
  records.write_record(os.path.join(a.out, "record.json"), record)
  print(json.dumps({"out": a.out, "accuracy": accuracy}))


if __name__ == "__main__":
  main(sys.argv[1:])
