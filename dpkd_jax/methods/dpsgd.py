"""DP-SGD (Abadi et al. 2016) on the private training split, as jax_privacy / Opacus do it.

Each step: a Poisson sample (every record in independently w.p. q); per-example gradients,
each clipped to L2 norm C over the whole parameter pytree; their sum plus N(0, z²C²) per
coordinate, divided by the expected batch size q N (data-independent, unlike the realised
size); an optax update. Privacy (docs/privacy.md): T steps are
`accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=T, relation=...)` (N public,
as in Opacus/jax_privacy). The run's `epsilon` (ledger, budget, `target_epsilon` calibration)
is REPLACE-ONE, the relation of every other method here and so of the comparison tables (one
record's clipped gradient moves from g to g' in its sample slot); `epsilon_add_remove` (a record
joins or leaves the sample: the clipped sum moves by <= C, Opacus' figure) is reported beside
it. Padding rows of the fixed-size batch weigh 0; an
oversized sample raises, never truncates; a non-finite per-example gradient becomes zero. The
noise derives from the run's root seed: without `seed` it is drawn from OS entropy and kept
only in the checkpoint (`privacy.seeds`), which is then as secret as the data; an explicit
`seed` makes the noise reproducible by anyone who knows it (research runs only). Only the parameters
are released (and their accuracy and loss on the public test split); the training metrics
(loss, accuracy, batch size, fraction clipped, gradient norm) are noiseless functions of private
batches, written to `private_diagnostics.csv` only with `log_private_diagnostics=True`.
`noise_multiplier=0` trains without noise: allowed, reported as ε = inf (NOT private).

The config is in `dpsgd_config.py`; the step itself (per-example gradients, clipping, the
sharded clipped sum and the single noise draw) is in `dpsgd_step.py`.

Workdir: checkpoints/ (Orbax state + PRNG key data; config, plan, ledger JSON as metadata),
privacy_ledger.json, results.json, record.json, metrics.csv and tb/ (released values only).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from typing import Any, NamedTuple

import jax
import optax
import tqdm
from flax import nnx
from jax.sharding import Mesh

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.privacy import validation
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState
from dpkd_jax.methods.dpsgd_config import DPSGDConfig  # Re-exported: dpsgd.DPSGDConfig.
from dpkd_jax.methods.dpsgd_step import make_train_step

PyTree = Any
_LOG_EVERY_STEPS = 50


class DPSGDPlan(NamedTuple):
  """A config resolved for N records on a mesh: q = B / N, T, steps_per_epoch = ceil(N / B)
  (the ledger / checkpoint / evaluation interval), padded batch M, z (given or calibrated),
  the run's planned replace-one ε at δ (PLD), and the ledger's budget (target_epsilon, else
  planned ε)."""

  num_examples: int
  sampling_rate: float
  steps: int
  steps_per_epoch: int
  max_batch_size: int
  noise_multiplier: float
  planned_epsilon: float
  target_epsilon: float


def make_plan(config: DPSGDConfig, *, num_examples: int, num_devices: int) -> DPSGDPlan:
  """Resolves q, T, M and z (calibrating z for `target_epsilon`), cheap checks first.

  Args:
    config: the validated configuration.
    num_examples: N, size of the private training split.
    num_devices: size of the mesh's 'data' axis.

  Returns:
    The plan. Raises ValueError for a batch larger than N or M not divisible by the devices.
    z = 0 (no noise) plans ε = ∞ and target_epsilon = ∞: a non-private run, kept by no ledger.
  """
  if config.expected_batch_size > num_examples:
    raise errors.UserError(f"expected_batch_size={config.expected_batch_size} exceeds the "
                           f"{num_examples} private training examples")
  q = config.expected_batch_size / num_examples
  steps = config.steps if config.steps is not None else math.ceil(config.epochs / q)
  # Default M: the overflow-safe size rounded up to a multiple of the device count.
  max_batch_size = config.max_batch_size or -(
      -data.suggested_max_batch_size(num_examples, q) // num_devices) * num_devices
  if max_batch_size % num_devices:
    raise ValueError(f"max_batch_size={max_batch_size} is not divisible by the {num_devices} "
                     f"devices of the 'data' mesh axis; use a multiple of {num_devices}")

  def event(z: float):  # Replace-one: the budget and the comparison tables' relation.
    return accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=steps,
                                  relation=accounting.REPLACE_ONE)

  noise_multiplier = float(config.noise_multiplier) if config.target_epsilon is None else (
      calibration.calibrate_noise_multiplier(event, target_epsilon=config.target_epsilon,
                                             delta=config.delta))
  planned = (math.inf if noise_multiplier == 0
             else accounting.epsilon(event(noise_multiplier), delta=config.delta))
  target = planned if config.target_epsilon is None else float(config.target_epsilon)
  return DPSGDPlan(num_examples=num_examples, sampling_rate=q, steps=steps,
                   steps_per_epoch=math.ceil(num_examples / config.expected_batch_size),
                   max_batch_size=max_batch_size, noise_multiplier=noise_multiplier,
                   planned_epsilon=planned, target_epsilon=target)


def make_optimizer(config: DPSGDConfig) -> optax.GradientTransformation:
  """Constant-rate SGD (optional momentum) or Adam: post-processing of the noisy gradient."""
  return _optimizer(config.optimizer, config.learning_rate, config.momentum)


@functools.cache
def _optimizer(name: str, learning_rate: float, momentum: float) -> optax.GradientTransformation:
  # One object per setting: TrainState's static `tx` is compared by identity under jit, so
  # repeated runs in one process (resume, sweeps, tests) then reuse the compiled step.
  if name == "adam":
    return optax.adam(learning_rate)
  return optax.sgd(learning_rate, momentum=momentum or None)


def init_model(config: DPSGDConfig, key: jax.Array) -> core.ModelParts:
  """The config's classifier, initialised from `key` and split."""
  return core.split(models.create_classifier(
      config.model, num_classes=config.info.num_classes, input_shape=config.info.image_shape,
      norm=config.norm, rngs=nnx.Rngs(key)))


@workdir_lib.run_scope
def train_dpsgd(config: DPSGDConfig, workdir: str, *, resume: bool = False,
                stop_at_step: int | None = None, progress: bool = True,
                mesh: Mesh | None = None) -> dict[str, Any]:
  """Trains with DP-SGD, keeps the privacy ledger, evaluates on the test split.

  Each expected epoch (ceil(N/B) steps) is charged to the ledger before it runs
  (`BudgetExceededError` if over budget; `workdir.Run.charge` writes privacy_ledger.json
  first), then a checkpoint is written. A run cut mid-epoch resumes from the last intact
  checkpoint and replays the same keys: the replayed releases equal the lost ones and reuse
  their charges (`train.ledger_file`). The workdir is locked for the whole run.

  Args:
    config: the validated configuration.
    workdir: output directory (created).
    resume: continue the checkpoint in `workdir` (same config required; none: start afresh).
      Without it a workdir holding a checkpoint is refused.
    stop_at_step: end this invocation (checkpointed) at this step, as if preempted.
    progress: show a tqdm progress bar (step, loss, ε).
    mesh: mesh with a 'data' axis (default: all devices).

  Returns:
    The results (also `<workdir>/results.json`).
  """
  clock = outputs.RunClock()
  if stop_at_step is not None:
    validation.check_int("stop_at_step", stop_at_step, minimum=1)
  config_json = dataclasses.asdict(config)
  run = workdir_lib.open_run(workdir, kind="DP-SGD", config=config_json, resume=resume)
  mesh = sharding.data_mesh() if mesh is None else mesh
  train = data.load(config.dataset, "train", data_dir=config.data_dir, download=config.download)
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  plan = make_plan(config, num_examples=len(train), num_devices=mesh.shape[sharding.DATA_AXIS])

  root_seed = seeds.resolve_seed(config.seed)  # a resumed run restores its key below
  root_key = seeds.root_key(root_seed)
  state = TrainState.create(init_model(config, jax.random.split(root_key, 3)[0]),
                            make_optimizer(config))
  if run.resuming:
    arrays, _ = run.restore({"state": state.arrays(), "rng": jax.random.key_data(root_key)})
    state = state.with_arrays(arrays["state"])
    root_key = jax.random.wrap_key_data(arrays["rng"])
  nonprivate = plan.noise_multiplier == 0  # ε = inf: no ledger can hold it
  ledger = run.ledger(None if nonprivate else ledger_lib.PrivacyLedger(
      target_epsilon=plan.target_epsilon, delta=config.delta, relation=accounting.REPLACE_ONE))
  # Named streams, each used with fold_in(step): a key is never reused.
  _, sample_key, noise_key = jax.random.split(root_key, 3)
  state = sharding.replicate(state, mesh)
  train_step = make_train_step(config, mesh, noise_multiplier=plan.noise_multiplier)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=run.step)
  # The step's metrics come from private batches: written apart, and only if asked for.
  private_writer = (outputs.PrivateDiagnosticsWriter(workdir, resume_step=run.step)
                    if config.log_private_diagnostics else None)
  spent_of = lambda: math.inf if ledger is None else ledger.spent_epsilon()  # noqa: E731

  step = int(state.step)
  stop = plan.steps if stop_at_step is None else min(stop_at_step, plan.steps)
  bar = tqdm.tqdm(total=plan.steps, initial=step, disable=not progress,
                  desc=f"dpsgd {config.model}/{config.dataset}")
  start_time, test_metrics, postfix = time.time(), None, {"eps": f"{spent_of():.3f}"}
  while step < stop:
    chunk_steps = min(plan.steps_per_epoch - step % plan.steps_per_epoch, stop - step)
    event = accounting.dpsgd_event(noise_multiplier=plan.noise_multiplier,
                                   sampling_rate=plan.sampling_rate, steps=chunk_steps,
                                   relation=accounting.REPLACE_ONE)
    # Before the releases: raises BudgetExceededError if over budget (inf without a ledger).
    run.charge(event, step=step + chunk_steps, note="dpsgd")
    for _ in range(chunk_steps):
      indices, mask = data.poisson_batch(jax.random.fold_in(sample_key, step), len(train),
                                         plan.sampling_rate, max_batch_size=plan.max_batch_size)
      batch = sharding.shard_batch((train.images[indices], train.labels[indices], mask), mesh)
      step_noise_key = sharding.replicate(jax.random.fold_in(noise_key, step), mesh)
      state, step_metrics = train_step(state, *batch, step_noise_key)
      step += 1
      bar.update(1)
      if private_writer is not None and (step % _LOG_EVERY_STEPS == 0 or step == stop):
        step_metrics = jax.device_get(step_metrics)
        private_writer.write(step, step_metrics, prefix="train/")
        postfix["loss"] = f"{step_metrics['loss']:.3f}"
        bar.set_postfix(postfix)
    host_arrays = run.seal({"state": state.arrays(), "rng": jax.random.key_data(root_key)})
    spent = spent_of()
    test_metrics = evaluate_lib.evaluate(state.parts, test)
    # A non-private run has no finite ε to plot: results.json says inf.
    writer.write(step, {**test_metrics, **({"epsilon": spent} if ledger else {})},
                 prefix="test/")
    postfix.update(eps=f"{spent:.3f}", test_acc=f"{test_metrics['accuracy']:.4f}")
    bar.set_postfix(postfix)
    run.save(step, host_arrays, {"config": config_json, "plan": plan._asdict(),
                                 "ledger": None if ledger is None else ledger.to_json()})
  bar.close()
  writer.close()
  if private_writer is not None:
    private_writer.close()

  if test_metrics is None:  # nothing ran in this invocation
    test_metrics = evaluate_lib.evaluate(state.parts, test)
  epsilon = spent_of()
  results = {
      "method": "dpsgd", "dataset": config.dataset, "model": config.model, "norm": config.norm,
      "test_accuracy": test_metrics["accuracy"], "test_loss": test_metrics["loss"],
      "epsilon": epsilon, "neighbouring_relation": accounting.REPLACE_ONE,
      "epsilon_add_remove": epsilon if ledger is None else accounting.epsilon(
          accounting.dpsgd_event(noise_multiplier=plan.noise_multiplier,
                                 sampling_rate=plan.sampling_rate, steps=step,
                                 relation=accounting.ADD_REMOVE), delta=config.delta),
      "delta": config.delta, "accountant": "none" if ledger is None else ledger.accountant,
      **plan._asdict(),
      "steps": step, "planned_steps": plan.steps, "finished": step == plan.steps,
      "expected_batch_size": config.expected_batch_size, "l2_clip_norm": config.l2_clip_norm,
      "param_count": models.count_params(state.params),
      "seed": root_seed.public_description(),  # secret iff config.seed is None, resumed or not
      "train_seconds_this_run": round(time.time() - start_time, 1),
      "config": config_json,
      "ledger": None if ledger is None else json.loads(ledger.to_json()),
      "dpkd_jax_version": dpkd_jax.__version__,
      outputs.PRIVATE_KEY: outputs.private_section(workdir=workdir),
  }
  # `epsilon` is replace-one, the relation of every method's table (add/remove beside it).
  outputs.finish_run(workdir, results, clock=clock, dataset=config.dataset,
                     test_accuracy=results["test_accuracy"], sound_epsilon=epsilon,
                     delta=config.delta, target_epsilon=config.target_epsilon,
                     neighbouring="replace-one")
  return results
