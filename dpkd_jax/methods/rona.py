"""RONA private model compression (Wang et al., AAAI 2019): config, schedule, training loop.

Data: the training split is divided (seeded) into a labelled *public* part (40% for privacy
runs, 80% for compression runs) and a *sensitive* part. The cumbersome teacher is trained on
both (the whole training split, `dpkd_jax.teacher`); an auxiliary teacher of the same
architecture on the public part only. The compact student (with an adaptation layer on its
hint, `rona_step.HintedStudent`) then sees only public data and sanitized teacher knowledge:

  stage 1, Th hint epochs: each epoch |x_q| random public samples in query batches of S; the
    adapted student hint regresses the sanitized teacher hint;
  stage 2, R rounds of: Ts self-learning epochs (cross-entropy on the public labels, no
    teacher, no privacy cost); selection of |x_q| query samples (`query_selection`, k-center
    over the student's outputs by default); Td distillation epochs on them in batches of S
    against the sanitized softened teacher probabilities (temperature τ).

One Adam learning rate serves all stages, but each stage keeps its own moment estimates.
After every private epoch the student's BatchNorm running statistics are re-estimated on
uniformly drawn public batches (`rona_step.build_batch_stats_step`: selected queries are
atypical by design).

The config is in `rona_config.py`.

Privacy (replace-one record of the *sensitive* split; docstrings of `rona_step` and
`rona_privacy`): the teacher is not private, so each query bounds the whole (S, ...) knowledge
batch to Frobenius norm B and adds N(0, σ²B²): sensitivity 2B, noise multiplier σ/2 per query
(`accounting.rona_event`), for any B independent of sensitive data. The adaptive B comes from
an auxiliary teacher whose card must name this very public split; the query choice reads only
the student (post-processing); self learning uses public labels. T = (Th + R·Td)·ceil(|x_q|/S)
queries are composed with dp_accounting (PLD) and checked against a ledger; the paper's
per-query figure is reported beside the sound ε, never instead of it. The teacher's accuracy
and teacher/ are private diagnostics (not covered by ε, `train.outputs`).

Workdir: teacher/ and aux_teacher/ (when trained here), checkpoints/ (Orbax, after every
epoch-sized unit of the schedule; config, plan and ledger as metadata), privacy_ledger.json,
results.json, record.json, metrics.csv and tb/.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from typing import Any

import jax
import numpy as np
import tqdm
from jax.sharding import Mesh

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.methods import compression_report
from dpkd_jax.methods import query_selection
from dpkd_jax.methods import rona_privacy
from dpkd_jax.methods import rona_step
from dpkd_jax.methods import rona_teachers
from dpkd_jax.methods.rona_config import RONAConfig  # Re-exported: rona.RONAConfig.
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib

_TRAINING_PHASES = ("hint", "self", "distill")
# Forward passes that re-estimate BatchNorm statistics after a private epoch: with momentum 0.9
# the statistics of the epoch's last (possibly atypical) query batch weigh 0.9**50 < 1% after.
_BATCH_STATS_BATCHES = 50


def schedule(config: RONAConfig) -> list[tuple[str, int, int]]:
  """The run as epoch-sized units (phase, round, epoch); a checkpoint follows every unit."""
  units = [("hint", 0, e) for e in range(config.hint_epochs)]
  for r in range(config.rounds):
    units += [("self", r, e) for e in range(config.self_learning_epochs)]
    if config.distillation_epochs:
      units += [("select", r, 0)] + [("distill", r, e) for e in range(config.distillation_epochs)]
  return units


def public_split_card(config: RONAConfig, num_public: int) -> dict[str, Any]:
  """What an auxiliary teacher's card must record to prove it saw only this public split."""
  return {"dataset": config.dataset, "public_fraction": config.public_fraction,
          "split_seed": config.split_seed, "num_examples": num_public}


def _query_batches(key: jax.Array, indices: np.ndarray, batch_size: int):
  """Shuffled (S,) index batches over `indices`; the last is padded (mask False) with real
  public rows so that BatchNorm statistics and shapes stay ordinary."""
  order = indices[np.asarray(jax.random.permutation(key, len(indices)))]
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    mask = np.arange(batch_size) < len(chunk)
    yield np.resize(chunk, batch_size), mask


@workdir_lib.run_scope
def train_rona(config: RONAConfig, workdir: str, *, resume: bool = False,
               stop_after_units: int | None = None, progress: bool = True,
               mesh: Mesh | None = None, latency_seconds: float = 1.0) -> dict[str, Any]:
  """Runs RONA, keeps the privacy ledger, writes the compression report.

  The ledger checks and records each epoch's queries before they are released (a crash never
  under-counts; privacy_ledger.json is written first); a resumed run continues the most-spent
  ledger on disk and replays the same keys, so replayed releases equal the lost ones and reuse
  their charges (`train.ledger_file`). The workdir is locked for the whole run.

  Args:
    config: the validated configuration.
    workdir: output directory (created).
    resume: continue the checkpoint in `workdir` (same config required); without it a
      workdir holding a checkpoint is refused.
    stop_after_units: end this invocation (checkpointed) after this many schedule units.
    progress: show a tqdm progress bar.
    mesh: mesh with a 'data' axis (default: all devices); S and the self-learning batch must
      divide by its size.
    latency_seconds: minimum timing of each latency figure of the compression report.

  Returns:
    The results (also `<workdir>/results.json`).
  """
  start_time, start_cpu, clock = time.time(), time.process_time(), outputs.RunClock()
  config_json = dataclasses.asdict(config)
  run = workdir_lib.open_run(workdir, kind="RONA", config=config_json, resume=resume)
  mesh = sharding.data_mesh() if mesh is None else mesh
  for size in (config.batch_size, config.self_learning_batch_size):
    sharding.check_divisible(size, mesh)
  info = config.info
  train = data.load(config.dataset, "train", data_dir=config.data_dir, download=config.download)
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  _, public = data.private_public_split(train, config.public_fraction, seed=config.split_seed)
  if config.num_query_samples > len(public):
    raise errors.UserError(f"num_query_samples={config.num_query_samples} exceeds the "
                           f"{len(public)} public samples")
  plan = rona_privacy.make_plan(config)
  big, aux = rona_teachers.teachers(config, public_split_card(config, len(public)), public,
                                    workdir, progress=progress, mesh=mesh)
  teacher_hint_shape = rona_teachers.hint_shape(big.parts, info)

  root_seed = seeds.resolve_seed(config.seed)  # a resumed run restores its key below
  root_key = seeds.root_key(root_seed)
  state, student_graphdef = rona_step.init_student(
      config.student_model, info=info, norm=config.student_norm,
      learning_rate=config.learning_rate, teacher_hint_shape=teacher_hint_shape,
      key=jax.random.fold_in(root_key, 0))
  private = plan.noise_multiplier > 0 and plan.num_queries > 0
  bounds = {kind: rona_step.BoundState.zeros() for kind in ("hint", "distill")}
  # Each stage keeps its own Adam moments: the second moments of a noisy stage are orders of
  # magnitude above those of self learning and would otherwise freeze its updates for
  # ~1/(1 - b2) = 1000 steps.
  opt_states = {phase: state.tx.init(state.params) for phase in _TRAINING_PHASES}
  selected = np.zeros((config.num_query_samples,), np.int32)
  unit, executed = 0, 0

  def checkpoint_arrays() -> dict[str, Any]:
    return {"state": state.arrays(), "rng": jax.random.key_data(root_key), "selected": selected,
            "bounds": {k: b._asdict() for k, b in bounds.items()}, "opt_states": opt_states}

  if run.resuming:
    arrays, meta = run.restore(checkpoint_arrays())
    state, root_key = state.with_arrays(arrays["state"]), jax.random.wrap_key_data(arrays["rng"])
    bounds = {k: rona_step.BoundState(**b) for k, b in arrays["bounds"].items()}
    opt_states = arrays["opt_states"]
    selected, unit, executed = np.asarray(arrays["selected"]), meta["unit"], meta["executed"]
  ledger = run.ledger(ledger_lib.PrivacyLedger(target_epsilon=plan.budget_epsilon,
                                               delta=config.delta) if private else None)
  # Named streams, each used with fold_in(unit) then fold_in(batch): no key is reused.
  order_key, noise_key, select_key = (jax.random.fold_in(root_key, i) for i in (1, 2, 3))

  state, bounds, opt_states = sharding.replicate((state, bounds, opt_states), mesh)
  frozen = sharding.replicate(tuple(
      None if t is None else rona_step.FrozenModel(t.parts.params, t.parts.batch_stats)
      for t in (big, aux)), mesh)
  sanitize = config.sanitize_configs(plan.noise_multiplier)
  private_steps = {kind: rona_step.make_private_step(
      kind, sanitize[kind], temperature=config.temperature, info=info,
      teacher_graphdef=big.parts.graphdef,
      aux_graphdef=None if aux is None else aux.parts.graphdef, mesh=mesh)
      for kind in ("hint", "distill")}
  self_step = rona_step.make_self_learning_step(info, mesh)
  batch_stats_step = rona_step.make_batch_stats_step(info, mesh)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=unit)
  units = schedule(config)
  stop = len(units) if stop_after_units is None else min(len(units), unit + stop_after_units)
  bar = tqdm.tqdm(total=len(units), initial=unit, disable=not progress,
                  desc=f"rona {config.student_model}/{config.dataset}", unit="epoch")
  test_metrics = None
  while unit < stop:
    phase, round_index, epoch = units[unit]
    unit_order = jax.random.fold_in(order_key, unit)
    if phase in _TRAINING_PHASES:
      state = state.replace(opt_state=opt_states[phase])
    if phase == "select":
      log_probs = query_selection.student_log_probs(
          rona_step.student_parts(state, student_graphdef), public.images, info)
      selected = query_selection.select_queries(
          config.query_selection, jax.random.fold_in(select_key, unit), log_probs,
          config.num_query_samples)
    elif phase == "self":
      for indices in data.epoch_batches(unit_order, len(public), config.self_learning_batch_size):
        batch = sharding.shard_batch((public.images[indices], public.labels[indices]), mesh)
        state, step_metrics = self_step(state, *batch)
    else:  # a private epoch: hint on random public samples, distill on the selected ones
      queries = (np.asarray(jax.random.permutation(unit_order, len(public)))[
          :config.num_query_samples] if phase == "hint" else selected)
      if ledger is not None:  # account before releasing: a crash never under-counts
        event = accounting.rona_event(noise_multiplier=plan.noise_multiplier,
                                      num_queries=plan.queries_per_epoch)
        run.charge(event, step=unit, note=f"{phase} round {round_index} epoch {epoch}")
      batches = _query_batches(jax.random.fold_in(unit_order, 1), queries, config.batch_size)
      for b, (indices, mask) in enumerate(batches):
        images, mask = sharding.shard_batch((public.images[indices], mask), mesh)
        key = sharding.replicate(jax.random.fold_in(jax.random.fold_in(noise_key, unit), b), mesh)
        state, bounds[phase], step_metrics = private_steps[phase](
            state, *frozen, bounds[phase], images, mask, key)
        executed += 1
      if jax.tree.leaves(state.batch_stats):  # BatchNorm statistics from uniform public batches
        for indices in itertools.islice(data.epoch_batches(
            jax.random.fold_in(unit_order, 2), len(public), config.self_learning_batch_size),
                                        _BATCH_STATS_BATCHES):
          state = batch_stats_step(state, sharding.shard_batch(public.images[indices], mesh))
    unit += 1
    bar.update(1)
    if phase in _TRAINING_PHASES:
      opt_states[phase] = state.opt_state
    host_arrays = run.seal(checkpoint_arrays())  # before any output of this unit's releases
    if phase != "select":
      test_metrics = evaluate_lib.evaluate(rona_step.student_parts(state, student_graphdef), test)
      epsilon = ledger.spent_epsilon() if ledger is not None else plan.planned_epsilon
      scalars = {f"{phase}_{k}": float(v) for k, v in jax.device_get(step_metrics).items()}
      # Non-private runs have B = ε = inf: nothing finite to plot (results.json says inf).
      scalars = {k: v for k, v in {**scalars, "epsilon": epsilon}.items() if math.isfinite(v)}
      writer.write(unit, scalars, prefix="train/")
      writer.write(unit, test_metrics, prefix="test/")
      bar.set_postfix(phase=phase, acc=f"{test_metrics['accuracy']:.4f}", eps=f"{epsilon:.3g}")
    run.save(unit, host_arrays,
             {"config": config_json, "unit": unit, "executed": executed,
              "plan": plan._asdict(),
              "ledger": None if ledger is None else ledger.to_json()})
  bar.close()
  writer.close()

  student = rona_step.student_parts(state, student_graphdef)
  if test_metrics is None:
    test_metrics = evaluate_lib.evaluate(student, test)
  report = compression_report.compression_report(
      big.parts, student, student_accuracy=test_metrics["accuracy"], info=info,
      min_seconds=latency_seconds)
  if aux is not None:  # trained on the public split only (its card says so): public
    report["aux_teacher"] = {"params": aux.card["param_count"],
                             "test_accuracy": aux.card["test_accuracy"]}
  report["teacher"]["model"], report["student"]["model"] = big.card["model"], config.student_model
  epsilon = ledger.spent_epsilon() if ledger is not None else (
      math.inf if plan.noise_multiplier == 0 and executed else 0.0)
  results = {
      "method": "rona", "dataset": config.dataset, "student_model": config.student_model,
      "test_accuracy": test_metrics["accuracy"], "test_loss": test_metrics["loss"],
      "epsilon": epsilon, "delta": config.delta,
      "accountant": "dp_accounting PLD; teacher not private (bounded batch sensitivity 2B)",
      "neighbouring_relation": "replace_one_sensitive_record", **plan._asdict(),
      "num_queries_executed": executed, "units_done": unit, "units_planned": len(units),
      "finished": unit == len(units), "bound_mode": config.bound_mode,
      "final_l2_bounds": rona_privacy.final_bounds(config, jax.device_get(bounds)),
      "num_public": len(public), "num_sensitive": len(train) - len(public),
      "compression": report, "seed": root_seed.public_description(),
      # This invocation, teachers trained here included; CPU: all threads of the process.
      "wall_seconds_this_run": round(time.time() - start_time, 1),
      "cpu_seconds_this_run": round(time.process_time() - start_cpu, 1),
      "config": config_json, "ledger": None if ledger is None else json.loads(ledger.to_json()),
      "dpkd_jax_version": dpkd_jax.__version__,
      outputs.PRIVATE_KEY: outputs.private_section(  # the teacher saw the sensitive data
          {"teacher_test_accuracy": big.card["test_accuracy"]}, workdir=workdir,
          files=("teacher",)),
  }
  return outputs.finish_run(
      workdir, results, clock=clock, dataset=config.dataset,
      test_accuracy=test_metrics["accuracy"], sound_epsilon=epsilon, delta=config.delta,
      paper_epsilon=plan.paper_epsilon_per_query, target_epsilon=config.target_epsilon,
      extra={"paper_epsilon_scope": "per query (classic Gaussian bound, sensitivity B)"})
