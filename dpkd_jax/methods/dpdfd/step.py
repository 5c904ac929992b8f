"""DPDFD (Liu et al., IJCAI 2023, "Model Conversion via Differentially Private Data-Free
Distillation"), Algorithm 1, as one pure jitted step.

    z ~ N(0, I)                       (B, latent)
    x = G(z)                          (B, H, W, C) synthetic batch
    t = teacher(x), s = student(x)    (B, K) logits; n teachers give (n, B, K)
    g_i = dL_T(t_i, s_i)/ds_i         (B, K) per-sample output gradients, L_T = DKD or logit
    g~ = A_{C,sigma}(g)               (B, K) normalized/clipped + Gaussian (the only release)
    y_s = stop_gradient(s - gamma g~) (B, K) noisy target
    student  <- grad L_S(student(x), y_s)                 x held constant
    generator<- grad [L_S + L_G](student(G(z)))           student only, y_s constant
                 or, generator_objective="disagreement": up D = ||s - y_s||_1 along its
                 forward-difference gradient from m probes x + δu per sample, whose rows
                 are released with the batch's (B·(1 + m) rows in one draw)

The step takes σ, C, e, the bound method and B from the plan (`privacy.DPDFDPlan`), the
object whose `event(n)` the ledger charges, and the loss weights from the config.

Privacy argument (docs/privacy.md): the teacher touches the computation only through `g`, which
leaves through the mechanism; the student and generator updates are post-processing of the
noisy rows `g~` plus teacher-free computation on synthetic data. The code enforces both
preconditions: the teacher's logits are `stop_gradient`ed (no gradient reaches the teacher and
its parameters are a read-only argument), and `y_s` is a constant in both losses.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dpkd_jax import losses
from dpkd_jax import models
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.methods.dpdfd import privacy
from dpkd_jax.methods.dpdfd import probes as probes_lib
from dpkd_jax.methods.dpdfd import replay as replay_lib
from dpkd_jax.models import core
from dpkd_jax.models import generators
from dpkd_jax.privacy import dpdfd_update
from dpkd_jax.privacy import mechanisms
from dpkd_jax.train import averaging
from dpkd_jax.train.state import TrainState

PyTree = Any
# Teachers whose forward passes `teacher_logits` vmaps at once (bounds its live activations).
TEACHERS_PER_GROUP = 32


@flax.struct.dataclass
class DPDFDState:
  """Student and generator train states, and the replay buffer of released pairs if the run
  keeps one (the teacher is never part of the state)."""

  student: TrainState
  generator: TrainState
  replay: replay_lib.ReplayBuffer | None = None

  @property
  def step(self) -> jax.Array:
    return self.student.step

  def arrays(self) -> dict[str, PyTree]:
    out = {"student": self.student.arrays(), "generator": self.generator.arrays()}
    if self.replay is not None:  # runs without replay keep the checkpoint layout they had
      out["replay"] = self.replay.arrays()
    return out

  def with_arrays(self, arrays: dict[str, PyTree]) -> "DPDFDState":
    replay = None if self.replay is None else self.replay.with_arrays(arrays["replay"])
    return DPDFDState(self.student.with_arrays(arrays["student"]),
                      self.generator.with_arrays(arrays["generator"]), replay)


def _adam(config: config_lib.DPDFDConfig, lr: float) -> optax.GradientTransformation:
  return optax.adam(optax.cosine_decay_schedule(lr, config.steps))


def generator_state(config: config_lib.DPDFDConfig, generator: core.ModelParts) -> TrainState:
  """The generator's train state: Adam on a cosine over the run's steps, from its start."""
  return TrainState.create(generator, _adam(config, config.generator_learning_rate))


def init_state(config: config_lib.DPDFDConfig, key: jax.Array) -> DPDFDState:
  """Fresh student and generator (keys split(key): 0 the student, 1 the generator), and the
  empty replay buffer of a run that keeps one."""
  student, generator = models.create_student_and_generator(config, key)
  student_tx = _adam(config, config.student_learning_rate)
  if config.engine.param_averaging_decay:  # the student's average: post-processing of the releases
    student_tx = averaging.param_averaging(student_tx, config.engine.param_averaging_decay)
  replay = None if not config.engine.replay_size else replay_lib.ReplayBuffer.empty(
      config.engine.replay_size, config.info.image_shape, config.info.num_classes,
      memory=config.engine.replay_memory)
  return DPDFDState(TrainState.create(student, student_tx), generator_state(config, generator),
                    replay)


class TeacherEnsemble(NamedTuple):
  """n teachers of one architecture, parameters stacked on a leading axis of size n."""

  graphdef: nnx.GraphDef
  params: PyTree  # leaves (n, ...)
  batch_stats: PyTree  # leaves (n, ...)

  @classmethod
  def stack(cls, parts: list[core.ModelParts]) -> "TeacherEnsemble":
    if not parts:
      raise ValueError("need at least one teacher")
    stack = lambda *xs: jnp.stack(xs)  # noqa: E731
    return cls(parts[0].graphdef, jax.tree.map(stack, *[p.params for p in parts]),
               jax.tree.map(stack, *[p.batch_stats for p in parts]))

  @property
  def size(self) -> int:
    return jax.tree.leaves(self.params)[0].shape[0]

  def member(self, index: int) -> core.ModelParts:
    """Teacher `index` alone (leaves without the teacher axis), as `stack` was given it."""
    take = lambda x: x[index]  # noqa: E731
    return core.ModelParts(self.graphdef, jax.tree.map(take, self.params),
                           jax.tree.map(take, self.batch_stats))


def teacher_logits(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
                   x: jax.Array, *, teachers_per_group: int = TEACHERS_PER_GROUP) -> jax.Array:
  """(n, B, K) eval-mode logits of every teacher, with no gradient path to the teachers.

  Up to `teachers_per_group` teachers run as one vmap; a larger stack runs in groups of that
  many, one after another (`lax.map`), so that only one group's activations are live (a
  250-teacher stack vmapped at once would hold all of them: gigabytes at B = 256).
  """
  def one(p, s):
    out, _ = core.apply(graphdef, p, s, x, train=False)
    return out.logits
  if jax.tree.leaves(params)[0].shape[0] <= teachers_per_group:
    return jax.lax.stop_gradient(jax.vmap(one)(params, batch_stats))
  return jax.lax.stop_gradient(jax.lax.map(lambda ps: one(*ps), (params, batch_stats),
                                           batch_size=teachers_per_group))


def per_sample_output_grads(config: config_lib.DPDFDConfig, student_logits: jax.Array,
                            t_logits: jax.Array) -> jax.Array:
  """g[j, i] = dL_T(t_ji, s_i)/ds_i for every teacher j and sample i: (n, B, K).

  L_T is `config.teacher_loss`: decoupled KD with the teacher's argmax as the label ("dkd"),
  or 0.5||s - t||² ("logit", whose gradient is the logit gap s - t), times
  `config.teacher_loss_scale` κ. vmap over rows gives
  the gradient of each sample's own loss w.r.t. its own output: no per-example parameter
  gradients are needed.
  """
  scale = config.teacher_loss_scale
  if config.teacher_loss == "logit":
    return scale * (student_logits[None] - t_logits)

  def row_loss(s, t):
    label = jnp.argmax(t)
    return losses.dkd(s[None], t[None], label[None], alpha=config.dkd_alpha,
                      beta=config.dkd_beta, temperature=config.temperature)[0]

  row_grad = jax.vmap(jax.grad(row_loss), in_axes=(0, 0))  # over samples
  return scale * jax.vmap(row_grad, in_axes=(None, 0))(student_logits, t_logits)  # teachers


def _mechanism_args(plan: privacy.OutputGradientPlan) -> dict[str, Any]:
  args = dict(l2_clip_norm=plan.l2_clip_norm, noise_multiplier=plan.noise_multiplier,
              stability=plan.stability, method=plan.bound_method)
  if getattr(plan, "secure_noise", False):  # only the data-free plan has the secure mode
    args.update(secure_noise=True, grid_bits=plan.grid_bits)
  return args


def release_rows(plan: privacy.OutputGradientPlan, key: jax.Array,
                 rows: jax.Array) -> mechanisms.GaussianRelease:
  """Algorithm 1's A_{C,σ} of the plan on one set of (B, K) rows (both modes)."""
  return mechanisms.output_gradient_mechanism(key, rows, **_mechanism_args(plan))


def private_output_gradients(plan: privacy.DPDFDPlan, key: jax.Array,
                             grads: jax.Array) -> mechanisms.GaussianRelease:
  """A_{C,σ} of the plan on (n, B, K) grads: each teacher's rows bounded to C, summed over the
  n teachers, one draw per row; n = 1 is Algorithm 1's mechanism itself
  (`mechanisms.output_gradient_mechanism` is this call on one teacher)."""
  return mechanisms.multi_teacher_output_gradients(key, grads, **_mechanism_args(plan))


def student_loss_rows(kind: str, logits: jax.Array, target: jax.Array) -> jax.Array:
  """L_S per row, (B,): CE(logits, softmax(target)), 0.5||logits - target||² or the L1
  distance ||logits - target||₁ (DFME's student loss: its gradient, sign(γ g~), is the sign of
  the released row, whatever the row's size). The public `privacy.dpdfd_update` function."""
  chex.assert_rank([logits, target], 2)
  return dpdfd_update.student_loss_rows(kind, logits, target)


def student_loss(config: config_lib.DPDFDConfig, logits: jax.Array,
                 target: jax.Array) -> jax.Array:
  """L_S: the batch mean of `student_loss_rows` for `config.student_loss`."""
  return student_loss_rows(config.student_loss, logits, target).mean()


def _student_forward(stu: TrainState, x: jax.Array,
                     replayed: tuple[jax.Array, jax.Array, jax.Array] | None):
  """(logits (B + R, K), their vjp to the student's params, new BatchNorm statistics): the
  student on the fresh batch x (B, ...) and, with replay, the R replayed images in one
  forward pass (the released rows are computed from the first B)."""
  rows = x if replayed is None else jnp.concatenate([x, replayed[0]])

  def logits(params):
    out, new_stats = core.apply(stu.graphdef, params, stu.batch_stats, rows, train=True)
    return out.logits, new_stats

  return jax.vjp(logits, stu.params, has_aux=True)


def _student_objective(config: config_lib.DPDFDConfig, logits: jax.Array, target: jax.Array,
                       replayed: tuple[jax.Array, jax.Array, jax.Array] | None
                       ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """L_S over the fresh rows (the first B of `logits`, (B + R, K)) and the replayed ones:
  the mean over all B + R rows (the replayed rows weigh 0 while the buffer is empty).
  Returns (objective, (fresh mean, replayed mean))."""
  batch = target.shape[0]
  fresh = student_loss_rows(config.student_loss, logits[:batch], target)
  if replayed is None:
    return fresh.mean(), (fresh.mean(), jnp.zeros(()))
  _, targets, weight = replayed
  old = student_loss_rows(config.student_loss, logits[batch:], targets)
  total = (fresh.sum() + weight * old.sum()) / (batch + weight * old.shape[0])
  return total, (fresh.mean(), old.mean())


def generator_loss_terms(config: config_lib.DPDFDConfig,
                         out: core.ClassifierOutput) -> dict[str, jax.Array]:
  """L_G terms on the student's output for generated data (teacher-free)."""
  return {
      "one_hot": config.one_hot_weight * losses.argmax_cross_entropy(out.logits),
      "entropy": config.entropy_weight * losses.information_entropy(out.logits),
      "feature": config.feature_weight * losses.feature_norm(out.features),
  }


def _paper_generator_grad(config: config_lib.DPDFDConfig, stu: TrainState, target: jax.Array,
                          x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], jax.Array]:
  """The paper's generator loss L_S + L_G through the (updated, frozen) student, y_s constant:
  (loss, terms, d loss / d x) with x (B, ...) the synthetic batch."""
  def g_loss_fn(images):
    out, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, images, train=True)
    terms = generator_loss_terms(config, out)
    terms["student"] = student_loss(config, out.logits, target)
    return sum(terms.values()), terms

  (g_loss, terms), d_images = jax.value_and_grad(g_loss_fn, has_aux=True)(x)
  return g_loss, terms, d_images


def _generator_grad(config: config_lib.DPDFDConfig, stu: TrainState, target: jax.Array,
                    x: jax.Array, noisy: jax.Array, directions: jax.Array | None,
                    s_queries: jax.Array | None = None, classes: jax.Array | None = None
                    ) -> tuple[jax.Array, dict[str, jax.Array], jax.Array]:
  """(loss, terms, d loss / d x) of the generator: the paper's (through the updated student)
  without probe `directions`, else the released disagreement's ascent, plus, if weighted,
  the diversity term through the student, and the class balance of the released targets
  s - γ·g̃ of every query (`noisy` and the student's logits `s_queries`, (B·(1 + m), K)), the
  smoothness of x, and the cross-entropy of the released targets to the requested `classes`
  (B,) of a class-conditional generator."""
  if directions is None:
    return _paper_generator_grad(config, stu, target, x)
  engine = config.engine  # the disagreement generator's terms
  g_loss, terms, d_images = probes_lib.disagreement_ascent(config.gamma, noisy, directions,
                                                           step=engine.probe_step)
  if engine.diversity_weight:  # class balance through the updated student
    div_loss, d_div = probes_lib.diversity_ascent(engine.diversity_weight, stu,
                                                  jax.lax.stop_gradient(x))
    terms["diversity"] = div_loss
    g_loss, d_images = g_loss + div_loss, d_images + d_div
  released_targets = dpdfd_update.dpdfd_student_target(s_queries, noisy, config.gamma)
  if engine.released_balance_weight:  # class balance as the release shows it
    entropy, d_entropy = probes_lib.released_balance_ascent(released_targets, directions,
                                                            step=engine.probe_step)
    terms["released_entropy"] = entropy
    weight = engine.released_balance_weight
    g_loss, d_images = g_loss - weight * entropy, d_images - weight * d_entropy
  if engine.smoothness_weight:  # an image prior: no teacher, no row
    tv, d_tv = jax.value_and_grad(losses.total_variation)(jax.lax.stop_gradient(x))
    terms["smoothness"] = engine.smoothness_weight * tv
    g_loss, d_images = g_loss + terms["smoothness"], d_images + engine.smoothness_weight * d_tv
  if classes is not None:  # the requested classes, as the release shows them
    ce, d_ce = probes_lib.released_class_descent(released_targets, classes, directions,
                                                 step=engine.probe_step)
    terms["released_class_ce"] = ce
    weight = engine.class_conditional_weight
    g_loss, d_images = g_loss + weight * ce, d_images + weight * d_ce
  return g_loss, terms, d_images


# The one per-step metric that is a (K,) vector, not a scalar: the run sums it rather than
# writing it to the curves.
RELEASED_CLASS_COUNTS = "released_class_counts"


def _collapse_diagnostics(s_logits: jax.Array, target: jax.Array) -> dict[str, jax.Array]:
  """Diagnostics of collapse (`restarts`) from the student's logits and the released targets
  y_s, both (B, K), alone: how often the student's class is the released target's, the entropy
  (nats) of the student's batch-mean prediction (log K: the batch spreads over every class),
  and (K,) int32 how many released targets name each class (their argmax), which the run sums
  into the generator's class coverage."""
  return {
      "released_agreement": jnp.mean(jnp.argmax(s_logits, -1) == jnp.argmax(target, -1)),
      "student_class_entropy": -losses.information_entropy(s_logits),
      RELEASED_CLASS_COUNTS: jnp.bincount(jnp.argmax(target, -1), length=target.shape[-1]),
  }


def build_train_step(plan: privacy.DPDFDPlan, config: config_lib.DPDFDConfig,
                     teacher_graphdef: nnx.GraphDef):
  """Returns the pure, un-jitted `train_step(state, teacher_params, teacher_batch_stats, key)
  -> (state, metrics)`. σ, C, e, the bound method and B come from `plan` only; `config`
  gives γ and the loss weights. Teacher params/batch stats are read-only arguments with a
  leading teacher axis (see `TeacherEnsemble`)."""

  def train_step(state: DPDFDState, teacher_params: PyTree, teacher_batch_stats: PyTree,
                 key: jax.Array):
    # split(key, 3)[:2] == split(key, 2): the paper path keeps its latents and noise.
    # split(key, 3)[i] == fold_in(key, i): the replay draw takes tag 3, the classes tag 4.
    z_key, noise_key, probe_key = jax.random.split(key, 3)
    z = jax.random.normal(z_key, (plan.batch_size, config.latent_dim))
    classes = None
    if config.class_codes:  # a class-conditional generator: each sample asks for a class
      classes = jax.random.randint(jax.random.fold_in(key, 4), (plan.batch_size,), 0,
                                   config.class_codes)
      z = generators.class_coded_latents(z, classes, config.class_codes)
    gen, stu, replay = state.generator, state.student, state.replay

    # 1-3. Synthetic batch, teacher and student outputs, per-sample output gradients. Each
    # network runs forward once here; the vjps keep what the two updates need, so neither
    # update repeats the forward pass that produced x or s (same values, fewer FLOPs).
    def generate(params):
      return core.apply(gen.graphdef, params, gen.batch_stats, z, train=True)

    x, generator_vjp, gen_stats = jax.vjp(generate, gen.params, has_aux=True)
    x_const = jax.lax.stop_gradient(x)

    replayed = None if replay is None else replay_lib.sample(
        replay, jax.random.fold_in(key, 3), config.replay_rows,
        sampling=config.engine.replay_sampling)
    all_logits, student_vjp, s_stats = _student_forward(stu, x_const, replayed)
    s_logits = all_logits[:plan.batch_size]
    queries, s_queries, directions = x_const, s_logits, None
    if plan.probes_per_sample:  # the disagreement probes x + δu are queries of the same release
      directions = probes_lib.unit_directions(probe_key, x_const,
                                              plan.probes_per_sample)  # (m, B, ...)
      probes = (x_const[None] + config.engine.probe_step * directions).reshape(
          (-1,) + x_const.shape[1:])  # (m·B, ...)
      s_probes, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, probes, train=True)
      queries = jnp.concatenate([x_const, probes])
      s_queries = jnp.concatenate([s_logits, s_probes.logits])
    t_logits = teacher_logits(teacher_graphdef, teacher_params, teacher_batch_stats, queries)
    grads = per_sample_output_grads(config, s_queries, t_logits)  # (n, R, K)

    # 4. The only private release: bounded rows + Gaussian noise, R = B·(1 + m) rows at once.
    release = private_output_gradients(plan, noise_key, grads)
    noisy = release.noisy[:plan.batch_size]
    target = dpdfd_update.dpdfd_student_target(s_logits, noisy, config.gamma)

    # 5a. Student update on (x, y_s) and the replayed pairs: L_S's gradient w.r.t. the
    # logits, pulled back.
    (_, (s_loss, replay_loss)), d_logits = jax.value_and_grad(
        lambda l: _student_objective(config, l, target, replayed), has_aux=True)(all_logits)
    (s_grads,) = student_vjp(d_logits)
    stu = stu.apply_gradients(s_grads, s_stats)
    if replay is not None:  # written after the draw: a step replays only earlier releases
      replay = replay_lib.write(replay, x_const, target)

    # 5b. Generator update (post-processing of the release and teacher-free computation).
    g_loss, terms, d_images = _generator_grad(config, stu, target, x, release.noisy,
                                              directions, s_queries, classes)
    (g_grads,) = generator_vjp(d_images)
    # Generator BN statistics come from the forward pass that made x (one update per step).
    gen = gen.apply_gradients(g_grads, gen_stats)

    # Metrics are outputs too: only post-mechanism, teacher-free quantities are reported
    # (no teacher agreement, no raw gradient norms), so logs never leak beyond the release.
    metrics = _collapse_diagnostics(s_logits, target)
    metrics.update(student_loss=s_loss, generator_loss=g_loss, noise_std=release.noise_stddev,
                   **{f"lg_{k}": v for k, v in terms.items()})
    if replay is not None:
      metrics["replay_loss"] = replay_loss
    return DPDFDState(stu, gen, replay), metrics

  return train_step


def make_train_step(plan: privacy.DPDFDPlan, config: config_lib.DPDFDConfig,
                    teacher_graphdef: nnx.GraphDef):
  """`build_train_step` jitted with the state donated (its buffers are reused in place)."""
  return jax.jit(build_train_step(plan, config, teacher_graphdef), donate_argnums=0)
