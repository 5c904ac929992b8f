"""A DPDFD run at paper scale, on paper: `python -m experiments.dpdfd --dataset=cifar10 --dry_run`.

`dry_run(config, teacher_model)` builds the step `train_dpdfd` would run for `config` from
shapes alone (`jax.eval_shape` state, a teacher of `teacher_model` whose weights are never
read, no data set), and returns a record: XLA's FLOPs, bytes and memory per step
(`train.dry_run.step_cost`), the plan's step count, and the estimated wall time of the run on
one NVIDIA H100 and one TPU v5e chip (`train.dry_run.estimate`). Nothing private is read,
nothing is charged to a ledger and nothing is written: the plan is made (σ calibrated for a
target ε if one is given, which is public arithmetic) but no release happens. The teacher is
the paper's for every data set but ImageNet (ResNet-34, `PAPER_TEACHER`), its student the
config's (DataLens' CNN, as the paper's).
"""

from __future__ import annotations

import math
from typing import Any

import jax
from flax import nnx

from dpkd_jax import kernels
from dpkd_jax import models
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.methods.dpdfd import privacy
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.train import dry_run as dry_run_lib

PAPER_TEACHER = "resnet34"


def _count(tree: Any) -> int:
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


def abstract_step(config: config_lib.DPDFDConfig, teacher_model: str,
                  plan: privacy.DPDFDPlan) -> tuple[Any, tuple[Any, ...], dict[str, int]]:
  """(the jitted step, its shape-only arguments, parameter counts per network)."""
  info = config.info
  teacher = core.split(nnx.eval_shape(lambda: models.create_classifier(
      teacher_model, num_classes=info.num_classes, input_shape=info.image_shape,
      rngs=nnx.Rngs(0))))
  n = plan.num_teachers  # stacked on a leading axis, as `TeacherEnsemble` holds them
  stack = lambda tree: jax.tree.map(  # noqa: E731
      lambda x: jax.ShapeDtypeStruct((n, *x.shape), x.dtype), tree)
  state = jax.eval_shape(lambda: step_lib.init_state(config, jax.random.key(0)))
  key = jax.eval_shape(lambda: jax.random.key(0))
  step = step_lib.make_train_step(plan, config, teacher.graphdef)
  params = {"teacher": _count(teacher.params), "student": _count(state.student.params),
            "generator": _count(state.generator.params)}
  return step, (state, stack(teacher.params), stack(teacher.batch_stats), key), params


def dry_run(config: config_lib.DPDFDConfig, teacher_model: str = PAPER_TEACHER, *,
            num_teachers: int = 1,
            utilisation: float = dry_run_lib.DEFAULT_UTILISATION) -> dict[str, Any]:
  """The record of `config`'s run on paper (module docstring); `num_teachers` stacked teachers
  of `teacher_model`, each reached by one record."""
  plan = privacy.make_plan(config, num_teachers=num_teachers)
  # The accelerator's program: the reference ops, whatever kernels this process chose for CPU.
  with kernels.using(kernels.REFERENCE):
    step, args, params = abstract_step(config, teacher_model, plan)
    cost = dry_run_lib.step_cost(step, *args)
  steps = plan.releases
  chips = []
  for chip in dry_run_lib.CHIPS:
    estimate = dry_run_lib.estimate(cost.flops, cost.bytes_accessed, chip, utilisation)
    chips.append({**dry_run_lib.chip_record(chip), **estimate,
                  "run_s": estimate["step_s"] * steps})
  return {
      "dataset": config.dataset, "image_shape": list(config.info.image_shape),
      "teacher_model": teacher_model, "num_teachers": plan.num_teachers,
      "student_model": config.student_model, "generator_model": config.generator_model,
      "generator_channels": config.generator_channels, "batch_size": plan.batch_size,
      "rows_per_step": plan.rows_per_step, "steps": steps, "parameters": params,
      "noise_multiplier": plan.noise_multiplier,
      "flops_per_step": cost.flops, "transcendentals_per_step": cost.transcendentals,
      "bytes_accessed_per_step": cost.bytes_accessed,
      "bytes_accessed_unfused_per_step": cost.bytes_accessed_unfused,
      "flops_lowered_for": dry_run_lib.ACCELERATOR_PLATFORM, "compiled_for": cost.backend,
      "memory": dict(cost.memory), "peak_memory_bytes": cost.peak_memory_bytes,
      "utilisation": utilisation, "chips": chips, "jax": jax.__version__}


def summary_lines(record: dict[str, Any]) -> list[str]:
  """What `--dry_run` prints: the run, its cost per step and its estimated wall time."""
  p, gib = record["parameters"], 2.0**30
  lines = [
      f"DPDFD dry run on {record['dataset']} {tuple(record['image_shape'])}: teacher "
      f"{record['teacher_model']} ({p['teacher'] / 1e6:.2f}M params) x{record['num_teachers']}, "
      f"student {record['student_model']} ({p['student'] / 1e6:.2f}M), generator "
      f"{record['generator_model']} width {record['generator_channels']} "
      f"({p['generator'] / 1e6:.2f}M)",
      f"batch {record['batch_size']} ({record['rows_per_step']} released rows per step), "
      f"{record['steps']:,} steps; shapes only: no data read, nothing charged, no run directory",
      f"FLOPs per step: {record['flops_per_step'] / 1e9:,.1f} GFLOP (XLA cost analysis of the "
      f"step lowered for {record['flops_lowered_for']})",
      f"bytes accessed per step: {record['bytes_accessed_per_step'] / 1e9:,.2f} GB (compiled "
      f"for {record['compiled_for']}, after fusion; "
      f"{record['bytes_accessed_unfused_per_step'] / 1e9:,.1f} GB unfused)",
      f"memory per step ({record['compiled_for']} compile): "
      f"{record['peak_memory_bytes'] / gib:.2f} GiB (arguments "
      f"{record['memory']['argument_size_in_bytes'] / gib:.2f}, temporaries "
      f"{record['memory']['temp_size_in_bytes'] / gib:.2f})",
  ]
  utilisation = record["utilisation"]
  for chip in record["chips"]:
    peaks = ", ".join(f"{name} {value / 1e12:g}" for name, value in chip["peaks"].items())
    lines += [
        f"{chip['name']}: peaks {peaks} TFLOP/s, HBM {chip['hbm_bytes_per_s'] / 1e12:g} TB/s; "
        f"float32 runs as {chip['precision']}",
        f"  per step {chip['compute_bound_s'] * 1e3:.3g} ms compute-bound, "
        f"{chip['memory_bound_s'] * 1e3:.3g} ms memory-bound ({chip['bound']}-bound); at "
        f"{utilisation:.0%} of both peaks {chip['step_s'] * 1e3:.3g} ms per step, "
        f"{dry_run_lib.duration(chip['run_s'])} for {record['steps']:,} steps"]
  return lines
