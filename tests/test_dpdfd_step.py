"""dpkd_jax.methods.dpdfd.step: privacy plumbing, isolation and sharding of one DPDFD step."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dpdfd_fixtures import dpdfd_config

from dpkd_jax import data
from dpkd_jax import losses
from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import probes as probes_lib
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import mechanisms
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              noise_multiplier=10.0, steps=4, batch_size=16, eval_every=2, latent_dim=8)
  base.update(kw)
  return dpdfd_config(**base)


@pytest.fixture(scope="module")
def ensemble(teacher_dir):
  """The digits teacher as a one-member ensemble, loaded once for the tests that step with it
  (every config here names the same teacher_dirs and dataset)."""
  return dpdfd.load_teachers(_config(teacher_dir))[0]


def test_sigma_zero_target_is_the_nonprivate_normalized_gradient(teacher_dir):
  config = _config(teacher_dir, noise_multiplier=0.0)
  plan = dpdfd.make_plan(config)
  grads = jax.random.normal(jax.random.key(1), (1, 16, 10))
  release = step_lib.private_output_gradients(plan, jax.random.key(2), grads)
  expected = mechanisms.normalize_rows(grads[0], 1.0, plan.stability)
  np.testing.assert_array_equal(release.noisy, expected)
  assert float(release.noise_stddev) == 0.0


@pytest.mark.parametrize("weight", [0.0, 1.0, 2.5])
def test_one_hot_weight_scales_the_generator_cross_entropy(teacher_dir, weight):
  # The L_G ablation (paper Table 6) switches terms off through their weights.
  config = _config(teacher_dir, one_hot_weight=weight)
  logits = jax.random.normal(jax.random.key(3), (6, 10))
  out = core.ClassifierOutput(logits=logits, features=jnp.ones((6, 4)), hint=None)
  terms = step_lib.generator_loss_terms(config, out)
  full = step_lib.generator_loss_terms(_config(teacher_dir), out)
  np.testing.assert_allclose(terms["one_hot"], weight * full["one_hot"], rtol=1e-6)
  assert float(full["one_hot"]) > 0
  np.testing.assert_allclose(terms["entropy"], full["entropy"])


def test_per_sample_output_grads_match_rowwise_autodiff(teacher_dir):
  config = _config(teacher_dir)
  s = jax.random.normal(jax.random.key(0), (5, 10))
  t = jax.random.normal(jax.random.key(1), (2, 5, 10))  # two teachers
  # Jitted: eagerly, each of DKD's many small ops compiled on its own (seconds in all).
  g = jax.jit(lambda s, t: step_lib.per_sample_output_grads(config, s, t))(s, t)
  chex.assert_shape(g, (2, 5, 10))
  full = jax.jit(jax.vmap(lambda tj: jax.grad(lambda s_: losses.dkd(
      s_, tj, jnp.argmax(tj, -1), alpha=1.0, beta=8.0, temperature=4.0).sum())(s)))(t)
  for j in range(2):
    np.testing.assert_allclose(g[j], full[j], rtol=1e-5, atol=1e-6)


def test_logit_teacher_loss_rows_are_the_logit_gap(teacher_dir):
  config = _config(teacher_dir, teacher_loss="logit")
  s = jax.random.normal(jax.random.key(0), (5, 10))
  t = jax.random.normal(jax.random.key(1), (2, 5, 10))
  g = step_lib.per_sample_output_grads(config, s, t)
  full = jax.vmap(lambda tj: jax.grad(lambda s_: 0.5 * jnp.sum(jnp.square(s_ - tj)))(s))(t)
  np.testing.assert_allclose(g, full, rtol=1e-6, atol=1e-6)


def _two_forward_step(config, plan, ensemble, state, key):
  """Algorithm 1 written plainly (each update runs its own forward passes): the reference the
  jitted step, which shares one forward per network through vjps, must equal."""
  z_key, noise_key = jax.random.split(key)
  z = jax.random.normal(z_key, (plan.batch_size, config.latent_dim))
  gen, stu = state.generator, state.student
  x, gen_stats = core.apply(gen.graphdef, gen.params, gen.batch_stats, z, train=True)
  t = step_lib.teacher_logits(ensemble.graphdef, ensemble.params, ensemble.batch_stats, x)
  s, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, x, train=True)
  release = step_lib.private_output_gradients(
      plan, noise_key, step_lib.per_sample_output_grads(config, s.logits, t))
  target = s.logits - config.gamma * release.noisy

  def s_loss(params):
    out, stats = core.apply(stu.graphdef, params, stu.batch_stats, x, train=True)
    return step_lib.student_loss(config, out.logits, target), stats

  s_grads, s_stats = jax.grad(s_loss, has_aux=True)(stu.params)
  stu = stu.apply_gradients(s_grads, s_stats)

  def g_loss(params):
    x_g, _ = core.apply(gen.graphdef, params, gen.batch_stats, z, train=True)
    out, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, x_g, train=True)
    terms = step_lib.generator_loss_terms(config, out)
    return sum(terms.values()) + step_lib.student_loss(config, out.logits, target)

  gen = gen.apply_gradients(jax.grad(g_loss)(gen.params), gen_stats)
  return step_lib.DPDFDState(stu, gen)


# The teacher loss enters the step only through `per_sample_output_grads` (each loss checked
# against autodiff above): one loss checks the step's plumbing ("logit" ran the same step).
@pytest.mark.parametrize("teacher_loss", ["dkd"])
def test_step_equals_the_two_forward_formulation(teacher_dir, ensemble, teacher_loss):
  config = _config(teacher_dir, teacher_loss=teacher_loss, student_model="datalens_cnn")
  plan = dpdfd.make_plan(config)
  # Plain SGD: Adam's first step is lr·sign(grad), which turns the rounding noise of exactly-zero
  # gradients (a conv bias before BatchNorm) into differences of size lr.
  student, generator = models.create_student_and_generator(config, jax.random.key(0))
  state = step_lib.DPDFDState(TrainState.create(student, optax.sgd(0.1)),
                              TrainState.create(generator, optax.sgd(0.1)))
  key = jax.random.key(5)
  expected = jax.jit(lambda s: _two_forward_step(config, plan, ensemble, s, key))(state)
  got, _ = jax.jit(dpdfd.build_train_step(plan, config, ensemble.graphdef))(
      state, ensemble.params, ensemble.batch_stats, key)
  # Compare the updates on the scale of the largest one: a conv bias before BatchNorm has an
  # exactly-zero gradient whose rounding noise differs between the two groupings of the sums.
  before, got, expected = (jax.tree.leaves(s.arrays()) for s in (state, got, expected))
  delta_got = [g - b for g, b in zip(got, before)]
  delta_expected = [e - b for e, b in zip(expected, before)]
  scale = max(float(jnp.abs(d).max()) for d in delta_expected)
  assert scale > 0
  for d_got, d_expected in zip(delta_got, delta_expected):
    np.testing.assert_allclose(d_got, d_expected, atol=1e-4 * scale)


def test_student_loss_is_the_batch_mean_of_the_chosen_loss():
  logits = jax.random.normal(jax.random.key(0), (4, 10))
  target = jax.random.normal(jax.random.key(1), (4, 10))
  ce = step_lib.student_loss(_config("x", student_loss="ce"), logits, target)
  np.testing.assert_allclose(
      ce, jnp.mean(-jnp.sum(jax.nn.softmax(target) * jax.nn.log_softmax(logits), axis=-1)),
      rtol=1e-6)
  mse = step_lib.student_loss(_config("x"), logits, target)
  np.testing.assert_allclose(mse, jnp.mean(0.5 * jnp.sum((logits - target) ** 2, axis=-1)),
                             rtol=1e-6)
  l1 = _config("x", student_loss="l1")
  np.testing.assert_allclose(step_lib.student_loss(l1, logits, target),
                             jnp.mean(jnp.sum(jnp.abs(logits - target), axis=-1)), rtol=1e-6)
  # L1's gradient is the sign of the released step γ g~ = s - y_s, divided by B: its size does
  # not depend on the row's scale (so neither on C nor on the noise's).
  for scale in (1e-6, 1.0, 1e6):
    grad = jax.grad(step_lib.student_loss, argnums=1)(l1, logits, logits - scale * target)
    np.testing.assert_array_equal(grad, jnp.sign(target) / 4)


def test_no_gradient_reaches_the_teacher(teacher_dir, ensemble):
  config = _config(teacher_dir)
  plan = dpdfd.make_plan(config)
  state = dpdfd.init_state(config, jax.random.key(0))
  z = jax.random.normal(jax.random.key(3), (16, config.latent_dim))
  gen, stu = state.generator, state.student

  def student_update_norm(teacher_params):
    x, _ = core.apply(gen.graphdef, gen.params, gen.batch_stats, z, train=True)
    t = step_lib.teacher_logits(ensemble.graphdef, teacher_params, ensemble.batch_stats, x)
    s, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, x, train=True)
    g = step_lib.per_sample_output_grads(config, s.logits, t)
    release = step_lib.private_output_gradients(plan, jax.random.key(4), g)
    target = jax.lax.stop_gradient(s.logits - config.gamma * release.noisy)
    return step_lib.student_loss(config, s.logits, target)

  grads = jax.jit(jax.grad(student_update_norm))(ensemble.params)  # jitted: faster than eager
  assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in jax.tree.leaves(grads))


class _PaperSteps:
  """Two paper-objective steps (keys 0 and 1) on one device, through one jitted step that may
  trace only once; `students[i]`: host copies of the student's parameters after step i."""

  def __init__(self, config, ensemble):
    self.ensemble = ensemble
    step_fn = chex.assert_max_traces(
        dpdfd.build_train_step(dpdfd.make_plan(config), config, ensemble.graphdef), n=1)
    self.jitted = jax.jit(step_fn, donate_argnums=0)
    # One state object (one optax closure): a new optimizer object per state would be a new
    # static field and, rightly, a retrace. Copies, because the step donates its input.
    self.initial = dpdfd.init_state(config, jax.random.key(0))
    self.students, self.metrics = self.run()

  def run(self):
    state, students = jax.tree.map(jnp.copy, self.initial), []
    for step in range(2):
      state, metrics = self.jitted(state, self.ensemble.params, self.ensemble.batch_stats,
                                   jax.random.key(step))
      students.append(jax.device_get(state.student.params))
    return students, metrics


@pytest.fixture(scope="module")
def paper_steps(teacher_dir, ensemble):
  """Shared by the retrace/determinism test and the 8-device test (one compilation)."""
  return _PaperSteps(_config(teacher_dir), ensemble)


def test_step_compiles_once_and_is_deterministic_per_key(paper_steps):
  again, _ = paper_steps.run()  # the same jitted step: a second trace fails
  chex.assert_trees_all_equal(paper_steps.students[1], again[1])
  assert np.isfinite(float(paper_steps.metrics["student_loss"]))


def _sharded_step(config, ensemble, devices, key):
  """The student's parameters after one step from init_state(key 0) on a mesh of `devices`."""
  mesh = sharding.data_mesh(devices)
  state = sharding.replicate(dpdfd.init_state(config, jax.random.key(0)), mesh)
  ens = sharding.replicate(ensemble, mesh)
  step = dpdfd.make_train_step(dpdfd.make_plan(config), config, ens.graphdef)
  state, _ = step(state, ens.params, ens.batch_stats, key)
  return jax.device_get(state.student.params)


@pytest.mark.parametrize("objective", ["paper", "disagreement"])
def test_sharded_over_8_devices_equals_single_device(teacher_dir, ensemble, paper_steps,
                                                     objective):
  assert len(jax.devices()) == 8
  if objective == "paper":  # the single-device step is paper_steps' first (key 0)
    config, single = _config(teacher_dir), paper_steps.students[0]
    key = jax.random.key(0)
  else:
    config = _config(teacher_dir, generator_objective="disagreement", bound_method="clip",
                     teacher_loss="logit", noise_multiplier=0.0)
    key = jax.random.key(7)
    single = _sharded_step(config, ensemble, jax.devices()[:1], key)
  chex.assert_trees_all_close(single, _sharded_step(config, ensemble, jax.devices(), key),
                              rtol=2e-4, atol=2e-5)


def test_multi_teacher_ensemble_step(teacher_dir):
  config = _config(teacher_dir, teacher_dirs=(teacher_dir, "b", "c"))  # 3 teachers
  plan = dpdfd.make_plan(config)
  one = teacher_lib.load_teacher(teacher_dir).parts
  ensemble = dpdfd.TeacherEnsemble.stack([one] * 3)
  assert ensemble.size == 3
  chex.assert_trees_all_equal((ensemble.member(2).params, ensemble.member(2).batch_stats),
                              (one.params, one.batch_stats))
  # Three identical teachers: the aggregate's noiseless part equals one teacher's bounded rows,
  # and the noise on the mean is sigma*C/n.
  grads = jnp.stack([jax.random.normal(jax.random.key(5), (16, 10))] * 3)
  release = step_lib.private_output_gradients(plan, jax.random.key(6), grads)
  assert float(release.noise_stddev) == pytest.approx(10.0 / 3)
  assert float(release.accounting_noise_multiplier) == pytest.approx(10.0 / (2 * 4))
  step = dpdfd.make_train_step(plan, config, ensemble.graphdef)
  state, metrics = step(dpdfd.init_state(config, jax.random.key(0)), ensemble.params,
                        ensemble.batch_stats, jax.random.key(1))
  assert np.isfinite(float(metrics["student_loss"]))


def _disagreement_config(teacher_dir, **kw):
  return _config(teacher_dir, generator_objective="disagreement", bound_method="clip",
                 teacher_loss="logit", probe_directions=2, **kw)


def test_a_large_stack_runs_in_groups_with_the_same_logits():
  # 7 teachers in groups of 3 (lax.map, remainder 1) = all 7 in one vmap.
  info = data.DATASETS["digits"]
  stack = teacher_ensemble.init_ensemble("patch_cnn", 7, info, jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (5, *info.image_shape))
  # Jitted: eagerly, the vmap and the lax.map body ran op by op, each op compiled on its own.
  logits = lambda **group: jax.jit(functools.partial(  # noqa: E731
      step_lib.teacher_logits, stack.graphdef, **group))(stack.params, {}, x)
  whole, grouped = logits(), logits(teachers_per_group=3)
  assert whole.shape == (7, 5, info.num_classes)
  np.testing.assert_allclose(grouped, whole, atol=1e-5)


def test_disagreement_ascent_estimates_the_gradient_of_the_released_disagreement():
  # A linear "teacher" t = W x and s = 0: logit rows s - t, D(x) = ||W x||_1. With many
  # directions the forward-difference estimate points along -∇D/B (the generator descends
  # -D), and its scale matches.
  config = dpdfd_config(dataset="digits", teacher_dirs=("t",), bound_method="clip",
                        generator_objective="disagreement", teacher_loss="logit",
                        noise_multiplier=0.0)
  x = jax.random.normal(jax.random.key(0), (3, 4, 4, 1))
  w = jax.random.normal(jax.random.key(1), (16, 5))
  rows = lambda v: -(v.reshape(v.shape[0], -1) @ w)  # noqa: E731
  count, step = 20000, 1e-3
  u = probes_lib.unit_directions(jax.random.key(2), x, count)  # (m, B, 4, 4, 1)
  np.testing.assert_allclose(jnp.sum(u[:, 0] ** 2, axis=(1, 2, 3)), 1.0, rtol=1e-5)
  probes = (x[None] + step * u).reshape((-1,) + x.shape[1:])
  noisy = jnp.concatenate([rows(x), rows(probes)])
  loss, terms, d_images = probes_lib.disagreement_ascent(config.gamma, noisy, u, step=step)
  want = jax.vmap(jax.grad(lambda v: jnp.abs(rows(v[None])).sum()))(x)
  np.testing.assert_allclose(float(terms["disagreement"]), np.abs(rows(x)).sum(-1).mean(),
                             rtol=1e-5)
  assert float(loss) == pytest.approx(-float(terms["disagreement"]))
  for got, expected in zip(-3 * d_images, want):
    cosine = jnp.vdot(got, expected) / (jnp.linalg.norm(got) * jnp.linalg.norm(expected))
    assert float(cosine) > 0.95
    assert float(jnp.linalg.norm(got) / jnp.linalg.norm(expected)) == pytest.approx(1, abs=0.1)


def _one_step(config, ensemble):
  """(state, metrics) of one step (key 1) from init_state(key 0)."""
  step = dpdfd.make_train_step(dpdfd.make_plan(config), config, ensemble.graphdef)
  return step(dpdfd.init_state(config, jax.random.key(0)), ensemble.params,
              ensemble.batch_stats, jax.random.key(1))


@pytest.fixture(scope="module")
def disagreement_step(teacher_dir, ensemble):
  """One step of the plain disagreement generator: read by the release test and as the
  class-balance test's baseline (one compilation)."""
  return _one_step(_disagreement_config(teacher_dir), ensemble)


def test_disagreement_step_releases_the_probes_rows_in_the_same_draw(teacher_dir,
                                                                     disagreement_step):
  assert dpdfd.make_plan(_disagreement_config(teacher_dir)).rows_per_step == 16 * 3
  _, metrics = disagreement_step
  assert np.isfinite(float(metrics["student_loss"]))
  assert float(metrics["lg_disagreement"]) == pytest.approx(-float(metrics["generator_loss"]))
  assert float(metrics["noise_std"]) == pytest.approx(10.0)


def test_class_balance_terms_move_only_the_generator(teacher_dir, ensemble, disagreement_step):
  # The same key and state: the release and the student update are unchanged; only the
  # generator's loss gains the weighted DAFL entropy of the updated student's predictions
  # (diversity_weight) and minus the weighted entropy of the released targets
  # (released_balance_weight). Both terms in one step: one compile fewer.
  (plain, m0) = disagreement_step
  balanced, m1 = _one_step(_disagreement_config(
      teacher_dir, diversity_weight=5.0, released_balance_weight=3.0), ensemble)
  # Two programs: equal up to float rounding (atol for the entries near 0).
  chex.assert_trees_all_close(plain.student.params, balanced.student.params, atol=1e-8)
  deltas = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)),
                                        plain.generator.params, balanced.generator.params))
  assert max(float(d) for d in deltas) > 0
  assert "lg_diversity" not in m0 and "lg_released_entropy" not in m0
  assert -5 * np.log(10) <= float(m1["lg_diversity"]) <= 0  # 5·(-H), H <= log K
  assert 0 <= float(m1["lg_released_entropy"]) <= np.log(10) + 1e-6
  assert float(m1["generator_loss"]) == pytest.approx(
      float(m0["generator_loss"]) + float(m1["lg_diversity"])
      - 3 * float(m1["lg_released_entropy"]), rel=1e-5)
  with pytest.raises(ValueError, match="needs generator_objective='disagreement'"):
    _config(teacher_dir, released_balance_weight=1.0)


def test_released_balance_ascent_estimates_the_gradient_of_the_batch_entropy():
  # Targets y = W x (a linear "teacher" through the release): the forward-difference estimate
  # of ∇_x H(mean_b softmax(W x_b)) points along autodiff's, at its scale.
  x = jax.random.normal(jax.random.key(0), (3, 4, 4, 1))
  w = 0.5 * jax.random.normal(jax.random.key(1), (16, 5))
  targets = lambda v: v.reshape(v.shape[0], -1) @ w  # noqa: E731
  count, step = 20000, 1e-3
  u = probes_lib.unit_directions(jax.random.key(2), x, count)
  probes = (x[None] + step * u).reshape((-1,) + x.shape[1:])
  entropy, d_images = probes_lib.released_balance_ascent(
      jnp.concatenate([targets(x), targets(probes)]), u, step=step)
  batch_entropy = lambda v: -losses.information_entropy(targets(v))  # noqa: E731
  assert float(entropy) == pytest.approx(float(batch_entropy(x)), rel=1e-5)
  want = jax.grad(batch_entropy)(x)
  for got, expected in zip(d_images, want):
    cosine = jnp.vdot(got, expected) / (jnp.linalg.norm(got) * jnp.linalg.norm(expected))
    assert float(cosine) > 0.95
    assert float(jnp.linalg.norm(got) / jnp.linalg.norm(expected)) == pytest.approx(1, abs=0.1)


def test_released_class_descent_estimates_the_gradient_of_the_requested_class_ce():
  # Targets y = W x through the release; each sample asks for its own class: the estimate of
  # ∇_x mean_b CE(softmax(W x_b), c_b) points along autodiff's, at its scale.
  x = jax.random.normal(jax.random.key(0), (3, 4, 4, 1))
  w = 0.5 * jax.random.normal(jax.random.key(1), (16, 5))
  classes = jnp.array([4, 0, 2])
  targets = lambda v: v.reshape(v.shape[0], -1) @ w  # noqa: E731
  count, step = 20000, 1e-3
  u = probes_lib.unit_directions(jax.random.key(2), x, count)
  probes = (x[None] + step * u).reshape((-1,) + x.shape[1:])
  ce, d_images = probes_lib.released_class_descent(
      jnp.concatenate([targets(x), targets(probes)]), classes, u, step=step)
  mean_ce = lambda v: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(  # noqa: E731
      targets(v), classes))
  assert float(ce) == pytest.approx(float(mean_ce(x)), rel=1e-5)
  for got, expected in zip(d_images, jax.grad(mean_ce)(x)):
    cosine = jnp.vdot(got, expected) / (jnp.linalg.norm(got) * jnp.linalg.norm(expected))
    assert float(cosine) > 0.95
    assert float(jnp.linalg.norm(got) / jnp.linalg.norm(expected)) == pytest.approx(1, abs=0.1)


def test_a_class_conditional_step_asks_for_classes_and_descends_their_released_ce(teacher_dir,
                                                                                 ensemble):
  # With the smoothness prior too (one compile): the generator's loss is the sum of the terms.
  config = _disagreement_config(teacher_dir, class_conditional_weight=2.0, latent_dim=16,
                                smoothness_weight=0.5)
  assert config.class_codes == 10 and _disagreement_config(teacher_dir).class_codes == 0
  _, metrics = _one_step(config, ensemble)
  ce = float(metrics["lg_released_class_ce"])
  assert np.isfinite(ce) and ce >= 0
  smoothness = float(metrics["lg_smoothness"])
  assert smoothness > 0
  assert float(metrics["generator_loss"]) == pytest.approx(
      -float(metrics["lg_disagreement"]) + 2 * ce + smoothness, rel=1e-5)
  for name in ("class_conditional_weight", "smoothness_weight"):
    with pytest.raises(ValueError, match=f"{name} is a term of the disagreement generator"):
      _config(teacher_dir, **{name: 1.0})
  with pytest.raises(ValueError, match="latent_dim must exceed it, got 8"):
    _disagreement_config(teacher_dir, class_conditional_weight=1.0)  # latent_dim 8 < K


def test_paper_objective_keeps_its_latents_and_noise(teacher_dir):
  # The disagreement generator draws its directions from a third key of split(key, 3); the
  # paper's two keys are those of split(key, 2), so existing runs replay unchanged.
  key = jax.random.key(9)
  np.testing.assert_array_equal(jax.random.key_data(jax.random.split(key, 3)[:2]),
                                jax.random.key_data(jax.random.split(key, 2)))


@pytest.mark.parametrize("teacher_loss", ["dkd", "logit"])
def test_teacher_loss_scale_scales_every_row(teacher_dir, teacher_loss):
  s = jax.random.normal(jax.random.key(3), (16, 10))
  t = jax.random.normal(jax.random.key(4), (2, 16, 10))
  rows = {scale: jax.jit(functools.partial(  # jitted: eager DKD compiles op by op
      step_lib.per_sample_output_grads,
      _config(teacher_dir, teacher_loss=teacher_loss, teacher_loss_scale=scale)))(s, t)
      for scale in (1.0, 1e-6)}
  np.testing.assert_allclose(rows[1e-6], 1e-6 * rows[1.0], rtol=1e-6)
