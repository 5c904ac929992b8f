"""DPDFD's mechanism applied directly to private data (paper Table 4, `--mode=direct`).

The paper also trains a model on the private data itself with its output-gradient mechanism
instead of DP-SGD: each step takes a Poisson sample of private records (x_i, y_i), computes
the per-sample gradient of the cross-entropy w.r.t. the model's *outputs*,
g_i = softmax(s_i) - onehot(y_i) (B, K), bounds and noises it with A_{C,sigma}
(`step.release_rows` of the plan), and fits the model to y_s = s - gamma g~.

**This is not differentially private, whatever sigma is.** The parameter update is
sum_i J_theta(x_i)^T (s_i - y_s,i): the private input x_i enters through the Jacobian
J_theta(x_i) of the model, which nothing bounds or noises, so one record can move the released
parameters arbitrarily (unbounded sensitivity). In the data-free mode the same Jacobian is
evaluated on *synthetic* inputs, which is why that mode is post-processing of g~ and this one
is not. Results therefore report `epsilon = inf` and, labelled and warned, the paper-formula
figure the paper's Table 4 uses; DP-SGD (`methods.dpsgd`) is the sound way to train on private
data and the baseline this mode is compared against.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import optax
import tqdm
from flax import nnx

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.methods.dpdfd import privacy
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import dpdfd_update
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.privacy import seeds
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState

NOT_DP_REASON = ("direct mode is not DP: the private inputs reach the update through the "
                 "model's Jacobian, which is neither bounded nor noised (unbounded sensitivity)")


def build_direct_step(plan: privacy.DirectPlan, config: config_lib.DirectConfig):
  """`train_step(state, images, labels, mask, key) -> (state, metrics)`, pure and un-jitted.

  σ, C, e and the bound method come from `plan` only; `config` gives γ and L_S.
  images (M, H, W, C) normalized, labels (M,), mask (M,) True for real rows of the padded
  Poisson batch; padded rows weigh zero in the loss.
  """

  def train_step(state: TrainState, images: jax.Array, labels: jax.Array, mask: jax.Array,
                 key: jax.Array):
    def forward(params):
      out, new_stats = core.apply(state.graphdef, params, state.batch_stats, images, train=True)
      return out.logits, new_stats

    # One forward pass; its VJP later carries the loss gradient to the parameters (a second
    # forward inside value_and_grad cost ~20% of the step on CPU, benchmarks/peers_dpsgd.py).
    logits, vjp_fn, new_stats = jax.vjp(forward, state.params, has_aux=True)  # (M, K)
    # g_i = d CE(s_i, y_i) / d s_i, one row per record: (M, K).
    row_ce = lambda s, y: optax.softmax_cross_entropy_with_integer_labels(s, y)  # noqa: E731
    grads = jax.vmap(jax.grad(row_ce))(logits, labels)
    release = step_lib.release_rows(plan, key, grads)  # A_{C,σ}, the plan's σ
    target = dpdfd_update.dpdfd_student_target(logits, release.noisy, config.gamma)
    weights = mask.astype(jnp.float32)
    row_weights = weights / jnp.maximum(weights.sum(), 1.0)  # (M,)

    def loss_of_logits(s):  # L_S per real row, weighted; padded rows weigh zero
      return jnp.sum(step_lib.student_loss_rows(config.student_loss, s, target) * row_weights)

    # The loss is a function of the logits only, so d loss / d params = VJP(d loss / d s).
    loss, logit_grads = jax.value_and_grad(loss_of_logits)(logits)
    (param_grads,) = vjp_fn(logit_grads)
    return state.apply_gradients(param_grads, new_stats), {"loss": loss}

  return train_step


def _open(config: config_lib.DirectConfig, workdir: str, num_records: int):
  """(run, sampling rate q, max batch size): checks q, warns, then locks `workdir`."""
  q = config.expected_batch_size / num_records
  if q > 1:  # checked before the workdir exists: a refused run writes nothing
    raise errors.UserError(f"expected_batch_size {config.expected_batch_size} exceeds the "
                           f"{num_records} private records")
  warnings.warn(f"{NOT_DP_REASON}; the paper-formula ε it reports is not a guarantee.",
                paper_accounting.PaperAccountingWarning, stacklevel=3)
  run = workdir_lib.open_run(workdir, kind="DPDFD direct", config=dataclasses.asdict(config),
                             resumable=False)
  max_batch_size = config.max_batch_size or data.suggested_max_batch_size(num_records, q)
  return run, q, max_batch_size


def _results(config, plan, *, accuracy, q, max_batch_size, root_seed, workdir) -> dict:
  return {
      "method": "dpdfd_direct",
      "test_accuracy": accuracy,
      "epsilon": plan.sound_epsilon,
      "epsilon_reason": NOT_DP_REASON,
      "paper_epsilon": plan.paper_epsilon,
      "paper_epsilon_warning": "DPDFD Theorem 3 (reconstruction): NOT a valid guarantee",
      "delta": plan.delta,
      "noise_multiplier": plan.noise_multiplier,
      "l2_norm_bound": plan.l2_clip_norm,  # the results field keeps its recorded name
      "sampling_rate": q,
      "max_batch_size": max_batch_size,
      "steps": plan.releases,
      "seed": root_seed.public_description(),
      "config": dataclasses.asdict(config),
      outputs.PRIVATE_KEY: outputs.private_section(workdir=workdir),
  }


@workdir_lib.run_scope
def train_direct(config: config_lib.DirectConfig, workdir: str, *,
                 progress: bool = True) -> dict[str, Any]:
  """Trains `config.model` on the private train split with the direct mechanism.

  Not resumable: the workdir is locked for the run, and a rerun in it replaces the metrics.
  No ledger: the plan's event is `NonPrivateDpEvent` (ε = inf), so nothing finite is charged.

  Returns:
    Results (also `<workdir>/results.json`, and `record.json`): test accuracy, `epsilon` =
    inf with the reason, the warned paper-formula ε, σ, C, steps, config. The training loss
    (of private batches) goes to `private_diagnostics.csv` only.
  """
  # 1. Data, workdir, plan, root seed.
  clock = outputs.RunClock()
  info = data.DATASETS[config.dataset]
  train = data.load(config.dataset, "train", data_dir=config.data_dir)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  run, q, max_batch_size = _open(config, workdir, len(train))
  plan = privacy.make_direct_plan(config)
  root_seed = seeds.resolve_seed(config.seed)
  init_key, sample_key, noise_key = jax.random.split(seeds.root_key(root_seed), 3)
  # 2. State and step.
  model = models.create_classifier(config.model, num_classes=info.num_classes,
                                   input_shape=info.image_shape, norm=config.norm,
                                   rngs=nnx.Rngs(init_key))
  state = TrainState.create(core.split(model), optax.adam(config.learning_rate))
  step_fn = jax.jit(build_direct_step(plan, config), donate_argnums=0)
  # 3. Train: sample -> release -> update; only the test accuracy is a released curve.
  writer = metrics_lib.MetricsWriter(workdir, resume_step=run.step)
  private_writer = outputs.PrivateDiagnosticsWriter(workdir, resume_step=run.step)  # private loss
  accuracy = math.nan
  for step in tqdm.trange(plan.releases, disable=not progress, desc=f"direct {config.dataset}"):
    indices, mask = data.poisson_batch(jax.random.fold_in(sample_key, step), len(train), q,
                                       max_batch_size=max_batch_size)
    images = data.normalize(train.images[indices], info)
    state, step_metrics = step_fn(state, images, train.labels[indices], mask,
                                  jax.random.fold_in(noise_key, step))
    if (step + 1) % config.eval_every == 0 or step + 1 == plan.releases:
      accuracy = evaluate.evaluate(state.parts, test)["accuracy"]
      private_writer.write(step + 1, jax.device_get(step_metrics), prefix="train/")
      writer.write(step + 1, {"accuracy": accuracy}, prefix="test/")
  writer.close()
  private_writer.close()
  # 4. Results record.
  results = _results(config, plan, accuracy=accuracy, q=q, max_batch_size=max_batch_size,
                     root_seed=root_seed, workdir=workdir)
  outputs.finish_run(workdir, results, run=run, clock=clock, dataset=config.dataset,
                     test_accuracy=accuracy, sound_epsilon=plan.sound_epsilon, delta=plan.delta,
                     accounting=plan.accounting, paper_epsilon=plan.paper_epsilon,
                     neighbouring=plan.relation)
  return results
