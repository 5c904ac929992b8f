"""DPDFD's mechanism applied directly to private data (paper Table 4, `--mode=direct`).

The paper also trains a model on the private data itself with its output-gradient mechanism
instead of DP-SGD: each step takes a Poisson sample of private records (x_i, y_i), computes
the per-sample gradient of the cross-entropy w.r.t. the model's *outputs*,
g_i = softmax(s_i) - onehot(y_i) (B, K), bounds and noises it with A_{C,sigma}
(`privacy.output_gradient_mechanism`), and fits the model to y_s = s - gamma g~.

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
from dpkd_jax.methods import dpdfd_step
from dpkd_jax.models import core
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.privacy import seeds
from dpkd_jax.privacy import validation
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState

NOT_DP_REASON = ("direct mode is not DP: the private inputs reach the update through the "
                 "model's Jacobian, which is neither bounded nor noised (unbounded sensitivity)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DirectConfig:
  """A direct-mode run (no generator, no teacher: the private labels play the teacher).

  Attributes:
    noise_multiplier: sigma of A_{C,sigma} (noise std sigma*C per output coordinate).
    l2_norm_bound, stability, bound_method, gamma, student_loss: see `dpdfd_step.StepConfig`.
    delta: δ of the paper-formula figure.
    dataset, model, norm: private data and the model trained on it.
    expected_batch_size: q N of the Poisson sampling; max_batch_size: padded rows (None:
      the smallest size whose overflow probability is <= 1e-9 per step).
    steps, learning_rate: Adam steps and rate.
    seed: None (default) for a secret seed from OS entropy; an integer for a reproducible run.
    eval_every, data_dir: bookkeeping.
  """

  noise_multiplier: float
  l2_norm_bound: float = 1.0
  stability: float = 1e-6
  bound_method: str = "normalize"
  gamma: float = 1.0
  student_loss: str = "mse"
  delta: float = 1e-5
  dataset: str
  model: str = "small_cnn"
  norm: str = "group"
  expected_batch_size: int = 256
  max_batch_size: int | None = None
  steps: int = 1000
  learning_rate: float = 1e-3
  seed: int | None = None
  eval_every: int = 200
  data_dir: str | None = None

  def __post_init__(self):
    if self.dataset not in data.DATASETS:
      raise ValueError(f"unknown dataset {self.dataset!r}; known: {sorted(data.DATASETS)}")
    if self.model not in models.CLASSIFIERS:
      raise ValueError(f"unknown model {self.model!r}; known: {sorted(models.CLASSIFIERS)}")
    if self.norm not in ("group", "none"):
      raise ValueError(f"norm must be 'group' or 'none' (BatchNorm would mix padded rows), "
                       f"got {self.norm!r}")
    validation.check_int("expected_batch_size", self.expected_batch_size, minimum=1)
    if self.max_batch_size is not None:
      validation.check_int("max_batch_size", self.max_batch_size,
                           minimum=self.expected_batch_size)
    validation.check_int("steps", self.steps, minimum=1)
    validation.check_int("eval_every", self.eval_every, minimum=1)
    validation.check_float("learning_rate", self.learning_rate, positive=True)
    validation.check_delta(self.delta)
    if self.seed is not None:
      validation.check_int("seed", self.seed, minimum=0)
    self.step_config()  # validates sigma, C, e, gamma, the bound method and the loss

  def step_config(self) -> dpdfd_step.StepConfig:
    return dpdfd_step.StepConfig(
        noise_multiplier=self.noise_multiplier, l2_norm_bound=self.l2_norm_bound,
        stability=self.stability, bound_method=self.bound_method, gamma=self.gamma,
        student_loss=self.student_loss)


def build_direct_step(config: dpdfd_step.StepConfig):
  """`train_step(state, images, labels, mask, key) -> (state, metrics)`, pure and un-jitted.

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
    release = mechanisms.output_gradient_mechanism(
        key, grads, l2_norm_bound=config.l2_norm_bound, noise_multiplier=config.noise_multiplier,
        stability=config.stability, method=config.bound_method)
    target = jax.lax.stop_gradient(logits - config.gamma * release.noisy)
    weights = mask.astype(jnp.float32)
    row_weights = (weights / jnp.maximum(weights.sum(), 1.0))[:, None]  # (M, 1)

    def loss_of_logits(s):
      if config.student_loss == "ce":
        rows = -jnp.sum(jax.nn.softmax(target) * jax.nn.log_softmax(s), axis=-1)
      else:
        rows = 0.5 * jnp.sum(jnp.square(s - target), axis=-1)
      return jnp.sum(rows * row_weights[:, 0])

    # The loss is a function of the logits only, so d loss / d params = VJP(d loss / d s).
    loss, logit_grads = jax.value_and_grad(loss_of_logits)(logits)
    (param_grads,) = vjp_fn(logit_grads)
    return state.apply_gradients(param_grads, new_stats), {"loss": loss}

  return train_step


def paper_epsilon(config: DirectConfig, steps: int) -> float | None:
  """The paper-formula ε of `steps` direct steps (reconstruction of Theorem 3; warned)."""
  if config.noise_multiplier == 0:
    return None
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    return paper_accounting.paper_dpdfd_epsilon(
        noise_multiplier=config.noise_multiplier, l2_norm_bound=config.l2_norm_bound,
        steps=steps, delta=config.delta)


@workdir_lib.run_scope
def train_direct(config: DirectConfig, workdir: str, *, progress: bool = True) -> dict[str, Any]:
  """Trains `config.model` on the private train split with the direct mechanism.

  Not resumable: the workdir is locked for the run, and a rerun in it replaces the metrics.

  Returns:
    Results (also `<workdir>/results.json`, and `record.json`): test accuracy, `epsilon` =
    inf with the reason, the warned paper-formula ε, σ, C, steps, config. The training loss
    (of private batches) goes to `private_diagnostics.csv` only.
  """
  clock = outputs.RunClock()
  info = data.DATASETS[config.dataset]
  train = data.load(config.dataset, "train", data_dir=config.data_dir)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  q = config.expected_batch_size / len(train)
  if q > 1:  # checked before the workdir exists: a refused run writes nothing
    raise errors.UserError(f"expected_batch_size {config.expected_batch_size} exceeds the "
                           f"{len(train)} private records")
  warnings.warn(f"{NOT_DP_REASON}; the paper-formula ε it reports is not a guarantee.",
                paper_accounting.PaperAccountingWarning, stacklevel=2)
  run = workdir_lib.open_run(workdir, kind="DPDFD direct", config=dataclasses.asdict(config),
                             resumable=False)
  max_batch_size = config.max_batch_size or data.suggested_max_batch_size(len(train), q)
  root_seed = seeds.resolve_seed(config.seed)
  init_key, sample_key, noise_key = jax.random.split(seeds.root_key(root_seed), 3)
  model = models.create_classifier(config.model, num_classes=info.num_classes,
                                   input_shape=info.image_shape, norm=config.norm,
                                   rngs=nnx.Rngs(init_key))
  state = TrainState.create(core.split(model), optax.adam(config.learning_rate))
  step_fn = jax.jit(build_direct_step(config.step_config()), donate_argnums=0)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=run.step)
  private_writer = outputs.PrivateDiagnosticsWriter(workdir, resume_step=run.step)  # private loss
  accuracy = math.nan
  for step in tqdm.trange(config.steps, disable=not progress, desc=f"direct {config.dataset}"):
    indices, mask = data.poisson_batch(jax.random.fold_in(sample_key, step), len(train), q,
                                       max_batch_size=max_batch_size)
    images = data.normalize(train.images[indices], info)
    state, step_metrics = step_fn(state, images, train.labels[indices], mask,
                                  jax.random.fold_in(noise_key, step))
    if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
      accuracy = evaluate.evaluate(state.parts, test)["accuracy"]
      private_writer.write(step + 1, jax.device_get(step_metrics), prefix="train/")
      writer.write(step + 1, {"accuracy": accuracy}, prefix="test/")
  writer.close()
  private_writer.close()
  results = {
      "method": "dpdfd_direct",
      "test_accuracy": accuracy,
      "epsilon": math.inf,
      "epsilon_reason": NOT_DP_REASON,
      "paper_epsilon": paper_epsilon(config, config.steps),
      "paper_epsilon_warning": "DPDFD Theorem 3 (reconstruction): NOT a valid guarantee",
      "delta": config.delta,
      "noise_multiplier": config.noise_multiplier,
      "l2_norm_bound": config.l2_norm_bound,
      "sampling_rate": q,
      "max_batch_size": max_batch_size,
      "steps": config.steps,
      "seed": root_seed.public_description(),
      "config": dataclasses.asdict(config),
      outputs.PRIVATE_KEY: outputs.private_section(workdir=workdir),
  }
  outputs.finish_run(workdir, results, clock=clock, dataset=config.dataset,
                     test_accuracy=accuracy, sound_epsilon=math.inf, delta=config.delta,
                     paper_epsilon=results["paper_epsilon"])
  return results
