"""RONA's run: `train_rona(config, workdir)`, its schedule of epoch-sized units, its results.

`train_rona` reads top to bottom in numbered sections (workdir, data and plan, teachers and
state, steps and ledger, train, results); each unit of the schedule is one of

  hint / distill   a private epoch (`_private_epoch`): charge its queries to the ledger, then
                   release the sanitized teacher knowledge batch by batch and learn from it;
                   re-estimate the BatchNorm statistics on uniform public batches after;
  self             a self-learning epoch on the public labels (no teacher, no privacy cost;
                   optionally of randomly shifted public images);
  select           the query selection of the round (reads only the student: post-processing);

and is followed by a seal of the state, the evaluation (`train.selection.Monitor`) and a
checkpoint (config, plan, ledger and root seed as metadata). Key streams: the root key's
fold_in(0) initialises the student, fold_in(1) orders the public samples, fold_in(2) draws the
noise, fold_in(3) seeds the selection and fold_in(4) the self-learning shifts, each then folded
with the unit and the batch: no key is reused. Each stage has its own Adam (`student`).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods.rona import compression_report
from dpkd_jax.methods.rona import config_migration
from dpkd_jax.methods.rona import privacy as rona_plan
from dpkd_jax.methods.rona import query_selection
from dpkd_jax.methods.rona import sanitize
from dpkd_jax.methods.rona import step as step_lib
from dpkd_jax.methods.rona import student
from dpkd_jax.methods.rona import teachers as teachers_lib
from dpkd_jax.methods.rona.config import RONAConfig
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import selection
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState
from dpkd_jax.train.progress import StepBar

_TRAINING_PHASES = ("hint", "self", "distill")
_PAPER_SCOPE = "all T queries (Theorem 2 reconstruction: moments accountant at sensitivity B)"
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


def _query_batches(key: jax.Array, indices: np.ndarray, batch_size: int):
  """Shuffled (S,) index batches over `indices`; the last is padded (mask False) with real
  public rows so that BatchNorm statistics and shapes stay ordinary."""
  order = indices[np.asarray(jax.random.permutation(key, len(indices)))]
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    mask = np.arange(batch_size) < len(chunk)
    yield np.resize(chunk, batch_size), mask


class _Carry(NamedTuple):
  """The run between two units: what a checkpoint holds besides its metadata."""

  state: TrainState  # the HintedStudent (student + adapter), replicated on the mesh
  bounds: dict[str, sanitize.BoundState]  # per private kind: running mean of aux norms
  opt_states: dict[str, Any]  # per training phase: its own Adam moments
  selected: np.ndarray  # (|x_q|,) int32 public indices of the round's distillation queries
  root_key: jax.Array
  unit: int = 0  # schedule units done
  executed: int = 0  # queries released

  def arrays(self) -> dict[str, Any]:
    return {"state": self.state.arrays(), "rng": jax.random.key_data(self.root_key),
            "selected": self.selected, "opt_states": self.opt_states,
            "bounds": {k: b._asdict() for k, b in self.bounds.items()}}


class _Context(NamedTuple):
  """What every unit reads and nothing changes during the run."""

  config: RONAConfig
  plan: rona_plan.RONAPlan
  run: workdir_lib.Run
  ledger: ledger_lib.PrivacyLedger | None
  public: data.ArrayDataset
  test: data.ArrayDataset
  mesh: Mesh
  student_graphdef: Any
  private_steps: dict[str, Callable]  # "hint"/"distill" jitted steps, σ and B from the plan
  self_step: Callable
  batch_stats_step: Callable
  frozen: tuple[step_lib.FrozenModel, step_lib.FrozenModel | None]  # teacher, aux (replicated)
  optimizers: dict[str, Any]  # per training phase: its Adam (`student.phase_optimizers`)
  keys: dict[str, jax.Array]  # named streams: "order", "noise", "select", "augment"
  monitor: selection.Monitor  # evaluates on the test split, or on the private hold-out


def _data(config: RONAConfig) -> tuple[int, data.ArrayDataset, data.ArrayDataset, Any]:
  """(training split size, its seeded public part, the test split, the hold-out or None)."""
  train = data.load(config.dataset, "train", data_dir=config.data_dir, download=config.download)
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  sensitive, public = data.private_public_split(train, config.public_fraction,
                                                seed=config.split_seed)
  if config.num_query_samples > len(public):
    raise errors.UserError(f"num_query_samples={config.num_query_samples} exceeds the "
                           f"{len(public)} public samples")
  return len(train), public, test, selection.hold_out(sensitive, config.validation_examples)[1]


def _initial_carry(config: RONAConfig, run: workdir_lib.Run, teacher: teacher_lib.Teacher,
                   root_seed: seeds.ResolvedSeed, mesh: Mesh,
                   optimizers: dict[str, Any]) -> tuple[_Carry, Any]:
  """(the fresh student, bounds and per-phase Adam moments, or the checkpoint's, replicated
  on `mesh`; the bare student's graphdef)."""
  root_key = seeds.root_key(root_seed)
  state, student_graphdef = step_lib.init_state(
      config, jax.random.fold_in(root_key, 0),
      teacher_hint_shape=teachers_lib.hint_shape(teacher.parts, config.info))
  # Each stage keeps its own Adam moments: a noisy stage's second moments are orders of
  # magnitude above self learning's and would freeze its updates for ~1/(1 - b2) = 1000 steps.
  opt_states = {phase: optimizers[phase].init(state.params) for phase in _TRAINING_PHASES}
  # Between units the state holds the self-learning optimizer (one checkpoint tree).
  state = state.replace(tx=optimizers["self"], opt_state=opt_states["self"])
  carry = _Carry(state, {kind: sanitize.BoundState.zeros() for kind in step_lib.KINDS},
                 opt_states, np.zeros((config.num_query_samples,), np.int32), root_key)
  if run.resuming:
    arrays, meta = run.restore(carry.arrays())
    carry = _Carry(state.with_arrays(arrays["state"]),
                   {k: sanitize.BoundState(**b) for k, b in arrays["bounds"].items()},
                   arrays["opt_states"], np.asarray(arrays["selected"]),
                   jax.random.wrap_key_data(arrays["rng"]), meta["unit"], meta["executed"])
  state, bounds, opt_states = sharding.replicate((carry.state, carry.bounds, carry.opt_states),
                                                 mesh)
  return carry._replace(state=state, bounds=bounds, opt_states=opt_states), student_graphdef


def _steps(config: RONAConfig, plan: rona_plan.RONAPlan, teacher: teacher_lib.Teacher,
           aux: teacher_lib.Teacher | None, mesh: Mesh) -> dict[str, Any]:
  """The jitted steps (private ones from `plan`) and frozen teachers: `_Context` fields."""
  frozen = sharding.replicate(tuple(
      None if t is None else step_lib.FrozenModel(t.parts.params, t.parts.batch_stats)
      for t in (teacher, aux)), mesh)
  private_steps = {kind: step_lib.make_train_step(
      plan, kind, temperature=config.temperature, info=config.info,
      teacher_graphdef=teacher.parts.graphdef,
      aux_graphdef=None if aux is None else aux.parts.graphdef, mesh=mesh)
      for kind in step_lib.KINDS}
  return dict(private_steps=private_steps, frozen=frozen,
              self_step=step_lib.make_self_learning_step(config.info, mesh,
                                                         config.self_learning_augment),
              batch_stats_step=step_lib.make_batch_stats_step(config.info, mesh))


@workdir_lib.run_scope
def train_rona(config: RONAConfig, workdir: str, *, resume: bool = False,
               stop_after_units: int | None = None, progress: bool = True,
               mesh: Mesh | None = None, latency_seconds: float = 1.0) -> dict[str, Any]:
  """Runs RONA, keeps the privacy ledger, writes the compression report.

  The ledger records each epoch's queries before their release (a crash never under-counts); a
  resumed run continues the most-spent ledger on disk and replays the same keys, so replayed
  releases equal the lost ones and reuse their charges (`train.ledger_file`). The workdir is
  locked for the whole run; a validation hold-out is evaluated instead of the test split.

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
  # 1. Workdir: lock, resume or refuse, root seed
  started, clock = (time.time(), time.process_time()), outputs.RunClock()
  run = workdir_lib.open_run(workdir, kind="RONA", config=config.to_json(), resume=resume,
                             migrate=config_migration.migrate)
  mesh = sharding.data_mesh() if mesh is None else mesh
  for size in (config.batch_size, config.self_learning_batch_size):
    sharding.check_divisible(size, mesh)
  root_seed = run.root_seed(config.seed)
  # 2. Data and plan (σ and T resolved once; the steps and the ledger read them from `plan`)
  num_train, public, test, validation = _data(config)
  plan = rona_plan.make_plan(config)
  # 3. Teachers (the auxiliary one saw the public split only) and the student's state
  teacher, aux = teachers_lib.teachers(
      config, teachers_lib.public_split_card(config, len(public)), public, workdir,
      progress=progress, mesh=mesh)
  optimizers = student.phase_optimizers(config.learning_rate, config.learning_rate_schedule,
                                        config.phase_steps(len(public)))
  carry, student_graphdef = _initial_carry(config, run, teacher, root_seed, mesh, optimizers)
  # 4. Ledger and steps (private ones from the plan)
  ledger = run.ledger(plan.new_ledger())
  keys = {name: jax.random.fold_in(carry.root_key, i)
          for i, name in enumerate(("order", "noise", "select", "augment"), start=1)}
  ctx = _Context(config=config, plan=plan, run=run, ledger=ledger, public=public, test=test,
                 mesh=mesh, student_graphdef=student_graphdef, keys=keys, optimizers=optimizers,
                 monitor=selection.Monitor(workdir, test, validation, resume_step=carry.unit),
                 **_steps(config, plan, teacher, aux, mesh))
  # 5. Train: charge -> release -> seal -> save, one unit of the schedule at a time
  carry, test_metrics = _train_units(ctx, carry, root_seed, workdir=workdir,
                                     stop_after_units=stop_after_units, show_progress=progress)
  # 6. Results record
  return _finish(ctx, carry, test_metrics, teacher=teacher, aux=aux, num_train=num_train,
                 root_seed=root_seed, workdir=workdir, started=started, clock=clock,
                 latency_seconds=latency_seconds)


def _train_units(ctx: _Context, carry: _Carry, root_seed: seeds.ResolvedSeed, *, workdir: str,
                 stop_after_units: int | None, show_progress: bool
                 ) -> tuple[_Carry, dict[str, float] | None]:
  """Runs the schedule's units from `carry.unit` (up to `stop_after_units` of them), each
  sealed, evaluated and checkpointed; returns the carry and the last test metrics."""
  config, units = ctx.config, schedule(ctx.config)
  stop = len(units) if stop_after_units is None else min(len(units),
                                                         carry.unit + stop_after_units)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=carry.unit)
  bar = StepBar(total=len(units), initial=carry.unit, disable=not show_progress,
                desc=f"rona {config.student_model}/{config.dataset}", unit="epoch")
  test_metrics = None
  while carry.unit < stop:
    phase, round_index, epoch = units[carry.unit]
    carry, step_metrics = _run_unit(ctx, carry, phase, round_index, epoch)
    bar.update(1)
    host_arrays = ctx.run.seal(carry.arrays())  # before any output of this unit's releases
    if phase != "select":
      test_metrics = _log_unit(ctx, carry, phase, step_metrics, writer, bar)
    ctx.run.save(carry.unit, host_arrays,
                 {"config": config.to_json(), "unit": carry.unit,
                  "executed": carry.executed, "plan": ctx.plan.to_json(),
                  "ledger": None if ctx.ledger is None else ctx.ledger.to_json(),
                  "root_seed": list(root_seed)})
  bar.close()
  writer.close()
  ctx.monitor.close()
  return carry, test_metrics


def _run_unit(ctx: _Context, carry: _Carry, phase: str, round_index: int,
              epoch: int) -> tuple[_Carry, Any]:
  """One unit of the schedule; returns the carry after it and its last step's metrics."""
  unit_order = jax.random.fold_in(ctx.keys["order"], carry.unit)
  if phase in _TRAINING_PHASES:  # this stage's optimizer and moments
    carry = carry._replace(state=carry.state.replace(opt_state=carry.opt_states[phase],
                                                     tx=ctx.optimizers[phase]))
  step_metrics = None
  if phase == "select":
    carry = carry._replace(selected=_select_queries(ctx, carry))
  elif phase == "self":
    state, unit_augment = carry.state, jax.random.fold_in(ctx.keys["augment"], carry.unit)
    for b, indices in enumerate(data.epoch_batches(unit_order, len(ctx.public),
                                                   ctx.config.self_learning_batch_size)):
      batch = sharding.shard_batch((ctx.public.images[indices], ctx.public.labels[indices]),
                                   ctx.mesh)
      key = (sharding.replicate(jax.random.fold_in(unit_augment, b), ctx.mesh)
             if ctx.config.self_learning_augment else None)  # no key to build when unused
      state, step_metrics = ctx.self_step(state, *batch, key)
    carry = carry._replace(state=state)
  else:
    carry, step_metrics = _private_epoch(ctx, carry, phase, f"{phase} round {round_index} "
                                         f"epoch {epoch}", unit_order)
  if phase in _TRAINING_PHASES:
    opt_states = {**carry.opt_states, phase: carry.state.opt_state}
    carry = carry._replace(opt_states=opt_states, state=carry.state.replace(
        opt_state=opt_states["self"], tx=ctx.optimizers["self"]))
  return carry._replace(unit=carry.unit + 1), step_metrics


def _select_queries(ctx: _Context, carry: _Carry) -> np.ndarray:
  """The round's |x_q| distillation queries from the student's public outputs (post-processing)."""
  log_probs = query_selection.student_log_probs(
      student.student_parts(carry.state, ctx.student_graphdef), ctx.public.images,
      ctx.config.info)
  return query_selection.select_queries(
      ctx.config.query_selection, jax.random.fold_in(ctx.keys["select"], carry.unit),
      log_probs, ctx.config.num_query_samples)


def _private_epoch(ctx: _Context, carry: _Carry, phase: str, note: str,
                   unit_order: jax.Array) -> tuple[_Carry, Any]:
  """A hint epoch (random public samples) or a distillation epoch (the selected ones):
  charge, then release and learn batch by batch; BatchNorm statistics re-estimated after."""
  config, public, unit = ctx.config, ctx.public, carry.unit
  queries = (np.asarray(jax.random.permutation(unit_order, len(public)))[
      :config.num_query_samples] if phase == "hint" else carry.selected)
  # Account before releasing: a crash never under-counts (a run without a ledger gets inf).
  ctx.run.charge(ctx.plan.event(ctx.plan.queries_per_epoch), step=unit, note=note)
  state, bound, executed, step_metrics = carry.state, carry.bounds[phase], carry.executed, None
  noise_key = jax.random.fold_in(ctx.keys["noise"], unit)
  batches = _query_batches(jax.random.fold_in(unit_order, 1), queries, config.batch_size)
  for b, (indices, mask) in enumerate(batches):
    images, mask = sharding.shard_batch((public.images[indices], mask), ctx.mesh)
    key = sharding.replicate(jax.random.fold_in(noise_key, b), ctx.mesh)
    state, bound, step_metrics = ctx.private_steps[phase](state, *ctx.frozen, bound, images,
                                                          mask, key)
    executed += 1
  if jax.tree.leaves(state.batch_stats):  # BatchNorm statistics from uniform public batches
    for indices in itertools.islice(data.epoch_batches(
        jax.random.fold_in(unit_order, 2), len(public), config.self_learning_batch_size),
                                    _BATCH_STATS_BATCHES):
      state = ctx.batch_stats_step(state, sharding.shard_batch(public.images[indices],
                                                               ctx.mesh))
  return carry._replace(state=state, bounds={**carry.bounds, phase: bound},
                        executed=executed), step_metrics


def _log_unit(ctx: _Context, carry: _Carry, phase: str, step_metrics: Any,
              writer: metrics_lib.MetricsWriter, bar: StepBar) -> dict[str, float] | None:
  """Evaluates the student (`ctx.monitor`), writes the unit's scalars; returns the test metrics
  (None with a hold-out: its figures go to the private diagnostics)."""
  parts = student.student_parts(carry.state, ctx.student_graphdef)
  epsilon = ctx.ledger.spent_epsilon() if ctx.ledger is not None else ctx.plan.sound_epsilon
  scalars = {f"{phase}_{k}": float(v) for k, v in jax.device_get(step_metrics or {}).items()}
  # Non-private runs have B = ε = inf: nothing finite to plot (results.json says inf).
  scalars = {k: v for k, v in {**scalars, "epsilon": epsilon}.items() if math.isfinite(v)}
  writer.write(carry.unit, scalars, prefix="train/")
  test_metrics = ctx.monitor.during(lambda split: evaluate_lib.evaluate(parts, split),
                                    carry.unit, writer)
  bar.set_postfix(phase=phase, acc=f"{(test_metrics or ctx.monitor.last)['accuracy']:.4f}",
                  eps=f"{epsilon:.3g}")
  return test_metrics


def _finish(ctx: _Context, carry: _Carry, test_metrics: dict[str, float] | None, *,
            teacher: teacher_lib.Teacher, aux: teacher_lib.Teacher | None, num_train: int,
            root_seed: seeds.ResolvedSeed, workdir: str, started: tuple[float, float],
            clock: outputs.RunClock, latency_seconds: float) -> dict[str, Any]:
  """The compression report, results.json and record.json; returns the results."""
  config, plan, ledger = ctx.config, ctx.plan, ctx.ledger
  per_query = plan.paper_epsilon_per_query
  deployed = student.student_parts(carry.state, ctx.student_graphdef)
  if test_metrics is None:
    test_metrics = evaluate_lib.evaluate(deployed, ctx.test)
  report = compression_report.compression_report(
      teacher.parts, deployed, student_accuracy=test_metrics["accuracy"], info=config.info,
      min_seconds=latency_seconds)
  if aux is not None:  # trained on the public split only (its card says so): public
    report["aux_teacher"] = {"params": aux.card["param_count"],
                             "test_accuracy": aux.card["test_accuracy"]}
  report["teacher"]["model"] = teacher.card["model"]
  report["student"]["model"] = config.student_model
  epsilon = ledger.spent_epsilon() if ledger is not None else (
      math.inf if plan.noise_multiplier == 0 and carry.executed else 0.0)
  units_planned = len(schedule(config))
  results = {
      "method": "rona", "dataset": config.dataset, "student_model": config.student_model,
      "test_accuracy": test_metrics["accuracy"], "test_loss": test_metrics["loss"],
      "epsilon": epsilon, "delta": config.delta,
      "accountant": "dp_accounting PLD; teacher not private (bounded batch sensitivity 2B)",
      "neighbouring_relation": "replace_one_sensitive_record", **plan.results_fields(),
      "num_queries_executed": carry.executed, "units_done": carry.unit,
      "units_planned": units_planned, "finished": carry.unit == units_planned,
      "bound_mode": config.bound_mode,
      "final_l2_bounds": rona_plan.final_bounds(plan, jax.device_get(carry.bounds)),
      "num_public": len(ctx.public), "num_sensitive": num_train - len(ctx.public),
      "compression": report, "seed": root_seed.public_description(),
      # This invocation, teachers trained here included; CPU: all threads of the process.
      "wall_seconds_this_run": round(time.time() - started[0], 1),
      "cpu_seconds_this_run": round(time.process_time() - started[1], 1),
      "config": config.to_json(),
      "ledger": None if ledger is None else json.loads(ledger.to_json()),
      "dpkd_jax_version": dpkd_jax.__version__,
      outputs.PRIVATE_KEY: outputs.private_section(  # the teacher saw the sensitive data
          {"teacher_test_accuracy": teacher.card["test_accuracy"],
           **ctx.monitor.private_values()}, workdir=workdir, files=("teacher",)),
  }
  return outputs.finish_run(
      workdir, results, run=ctx.run, clock=clock, dataset=config.dataset,
      test_accuracy=test_metrics["accuracy"], sound_epsilon=epsilon, delta=config.delta,
      accounting=plan.accounting, paper_epsilon=plan.paper_epsilon,
      target_epsilon=config.target_epsilon,
      extra={"paper_epsilon_scope": _PAPER_SCOPE, "paper_epsilon_per_query": per_query})
