"""DP-SGD: clipping, noise, normaliser, 8 devices == 1, no retracing, resume, results, configs.

Tiny LeNet-5/2 (GroupNorm) on the embedded digits, expected batch 16, padded batch M = 48 (6
rows per fake device). Tolerances: float32 sums in another order agree to ~1e-6: atol 1e-5.
"""

import dataclasses
import json
import math
import os

import chex
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpkd_jax import data
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods import dpsgd_step
from dpkd_jax.privacy import dpsgd_mechanism
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.train import checkpoint
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState
from experiments import dpsgd as dpsgd_cli

DIGITS_TRAIN = 1442
NUM_REAL = 11  # real rows of the test batch; expected batch size 16 != 11: normaliser visible


def _config(**kw):
  # Momentum 0.9 everywhere (its first step is plain SGD), so that `runs` can reuse the step
  # compiled for `noisy_step_8_devices` and exercise optimizer state in the checkpoint.
  base = dict(dataset="digits", model="lenet5_half", expected_batch_size=16, l2_clip_norm=2.0,
              noise_multiplier=1.0, steps=4, learning_rate=0.5, momentum=0.9, seed=0)
  base.update(kw)
  return dpsgd.DPSGDConfig(**base)


@pytest.fixture(scope="module")
def parts():
  return dpsgd.init_model(_config(), jax.random.key(0))


@pytest.fixture(scope="module")
def batch():
  # M = the padded size `train_dpsgd` picks for `_config()` (48), so the loop in `runs` reuses
  # the executables compiled by the unit tests.
  num_rows = dpsgd.make_plan(_config(), num_examples=DIGITS_TRAIN, num_devices=8).max_batch_size
  train = data.load("digits", "train")
  indices = np.arange(100, 100 + num_rows)  # padded rows hold real images: masking must work
  mask = np.arange(num_rows) < NUM_REAL
  return train.images[indices], train.labels[indices], mask


def _inputs(parts, config, batch, mesh=None):
  """A fresh state (the step donates it) and the batch, laid out as `train_dpsgd` does.

  The same layout as the loop lets `runs` reuse the executable compiled here.
  """
  mesh = sharding.data_mesh() if mesh is None else mesh
  params = jax.tree.map(jnp.array, parts.params)  # jnp.array copies
  state = TrainState.create(core.ModelParts(parts.graphdef, params, parts.batch_stats),
                            dpsgd.make_optimizer(config))
  return sharding.replicate(state, mesh), *sharding.shard_batch(batch, mesh)


def _key(seed, mesh=None):
  return sharding.replicate(jax.random.key(seed), sharding.data_mesh() if mesh is None else mesh)


@pytest.fixture(scope="module")
def noisy_step_8_devices():
  """The step of `_config()` on 8 devices, guarded by `chex.assert_max_traces(n=1)`.

  `make_train_step` is cached, so the training loop in `runs` gets this very function: the
  unit tests' calls and all steps of three runs (one resumed from a checkpoint) must share
  one trace.
  """
  config = _config()
  original = dpsgd_step.train_step_fn
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(dpsgd_step, "train_step_fn",
               lambda *a, **k: chex.assert_max_traces(original(*a, **k), n=1))
    chex.clear_trace_counter()
    step = dpsgd_step.make_train_step(config, sharding.data_mesh(), noise_multiplier=1.0)
  return config, step


def test_no_noise_huge_clip_is_sgd_on_summed_gradient_over_expected_batch(parts, batch):
  config = _config(noise_multiplier=0.0, l2_clip_norm=1e6)
  step = dpsgd_step.make_train_step(config, sharding.data_mesh(), noise_multiplier=0.0)
  new_state, metrics = step(*_inputs(parts, config, batch), _key(1))
  images, labels, mask = batch

  def summed_loss(params):  # plain batch forward; GroupNorm keeps examples independent
    out, _ = core.apply(parts.graphdef, params, parts.batch_stats,
                        data.normalize(jnp.asarray(images), config.info), train=True)
    losses = optax.softmax_cross_entropy_with_integer_labels(out.logits, labels)  # (M,)
    return jnp.sum(jnp.where(mask, losses, 0.0)) / config.expected_batch_size

  grads = jax.jit(jax.grad(summed_loss))(parts.params)
  expected = jax.tree.map(lambda p, g: p - 0.5 * g, parts.params, grads)
  chex.assert_trees_all_close(jax.device_get(new_state.params), expected, atol=1e-5, rtol=1e-5)
  assert float(metrics["batch_size"]) == NUM_REAL
  assert float(metrics["clipped_fraction"]) == 0.0
  assert int(new_state.step) == 1


def _norms(tree):
  """(B,) L2 norms over the whole pytree of each example (NumPy reference)."""
  return np.sqrt(sum(np.sum(np.square(np.asarray(g).reshape(g.shape[0], -1)), axis=1)
                     for g in jax.tree.leaves(tree)))


@pytest.fixture(scope="module")
def per_example(parts):
  """Gradient-like pytree: the model's parameter shapes with a leading axis of 8 examples,
  scaled so the example norms span 0.02..50 (clipped by some C values and not by others)."""
  # NumPy for test data: one eager jax.random draw per leaf shape compiles for seconds each.
  rng = np.random.default_rng(7)
  grads = jax.tree.map(lambda p: rng.standard_normal((8,) + p.shape, np.float32), parts.params)
  target = np.geomspace(0.02, 50.0, 8)
  scale = target / _norms(grads)
  return jax.tree.map(lambda g: g * scale.reshape((-1,) + (1,) * (g.ndim - 1)), grads)


_clip = jax.jit(dpsgd_mechanism.clip_per_example_gradients)  # C traced: one compile, every C


@pytest.mark.parametrize("clip_norm", [0.1, 8.0, 1e4])
def test_every_clipped_per_example_norm_is_at_most_clip_norm(per_example, clip_norm):
  grads = per_example
  clipped, norms = _clip(grads, clip_norm)
  chex.assert_trees_all_equal_shapes(clipped, grads)
  np.testing.assert_allclose(norms, _norms(grads), rtol=1e-5)
  clipped_norms = _norms(clipped)
  assert np.all(clipped_norms <= clip_norm * (1 + 1e-5))
  # Short gradients are untouched; long ones keep their direction at norm C.
  scale = np.minimum(1.0, clip_norm / _norms(grads))  # (8,)
  chex.assert_trees_all_close(
      clipped, jax.tree.map(lambda g: g * scale.reshape((-1,) + (1,) * (g.ndim - 1)), grads),
      rtol=1e-5, atol=1e-7)
  if clip_norm == 8.0:  # norms span 0.02..50: this C clips some examples and not others
    assert 0 < np.sum(_norms(grads) > clip_norm) < 8


def test_non_finite_example_gradient_becomes_zero():
  grads = {"w": jnp.array([[3.0, 4.0], [jnp.nan, 1.0], [0.0, 0.0]]),
           "b": jnp.array([[0.0], [1.0], [0.0]])}
  clipped, norms = _clip(grads, 1.0)
  chex.assert_trees_all_close(clipped["w"], jnp.array([[0.6, 0.8], [0.0, 0.0], [0.0, 0.0]]),
                              atol=1e-7)
  chex.assert_trees_all_equal(clipped["b"], jnp.zeros((3, 1)))
  assert norms[0] == pytest.approx(5.0) and not np.isfinite(norms[1]) and norms[2] == 0.0


def test_noise_std_of_update_is_z_times_clip_over_expected_batch(parts, batch,
                                                                noisy_step_8_devices):
  config, step = noisy_step_8_devices
  new_a, _ = step(*_inputs(parts, config, batch), _key(1))
  new_b, _ = step(*_inputs(parts, config, batch), _key(2))
  # Same data and clipped sum, different noise: the first (plain SGD) step moves the params by
  # lr (G + n) / (q N), so new_a - new_b = lr (n_b - n_a) / (q N) has per-coordinate std
  # lr sqrt(2) z C / (q N) = 0.5 * sqrt(2) * 1 * 2 / 16.
  diff, _ = jax.flatten_util.ravel_pytree(
      jax.tree.map(lambda a, b: a - b, jax.device_get(new_a.params), jax.device_get(new_b.params)))
  expected_std = 0.5 * math.sqrt(2) * 1.0 * 2.0 / 16
  # ~15.8k coordinates: one sigma of the sample std is ~0.6%, so 3% is 5 sigma; same for the mean.
  assert diff.size > 15_000
  assert float(jnp.std(diff)) == pytest.approx(expected_std, rel=0.03)
  assert abs(float(jnp.mean(diff))) < 5 * expected_std / math.sqrt(diff.size)


def test_eight_devices_equal_one_device(parts, batch, noisy_step_8_devices):
  config, step8 = noisy_step_8_devices
  new8, metrics8 = step8(*_inputs(parts, config, batch), _key(3))
  mesh1 = sharding.data_mesh(jax.devices()[:1])
  step1 = dpsgd_step.make_train_step(config, mesh1, noise_multiplier=1.0)
  new1, metrics1 = step1(*_inputs(parts, config, batch, mesh1), _key(3, mesh1))
  chex.assert_trees_all_close(jax.device_get(new8.params), jax.device_get(new1.params),
                              atol=1e-5)
  chex.assert_trees_all_close(jax.device_get(metrics8), jax.device_get(metrics1), rtol=1e-5)
  # One device sees every row, so equality also shows that devices 1..7 contributed (each
  # example moves the update by up to lr C / (q N) = 0.06, far above the tolerance).
  assert float(metrics8["batch_size"]) == NUM_REAL
  assert 0.0 < float(metrics8["clipped_fraction"]) <= 1.0


def test_trace_guard_catches_a_retrace(parts, batch):
  """The guard of `noisy_step_8_devices` (and `runs`) is live: a new batch shape fails.

  No `chex.clear_trace_counter()` here: it would also reset the count of the guarded step.
  """
  config = _config()
  step = jax.jit(chex.assert_max_traces(
      dpsgd_step.train_step_fn(config, sharding.data_mesh(), noise_multiplier=1.0), n=1))
  state, *rows = _inputs(parts, config, batch)
  step.trace(state, *rows, _key(0))
  with pytest.raises(AssertionError, match="traced > 1 times"):
    step.trace(state, *(a[:16] for a in rows), _key(0))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, noisy_step_8_devices):
  """Run `a`: 4 steps in one go; run `b`: stopped at step 2, then resumed to 4; run `c`: as
  `a` without a seed (a secret one from OS entropy), logging its private diagnostics.

  They use the trace-guarded step of `noisy_step_8_devices`: the loop must not retrace.
  """
  config, guarded_step = noisy_step_8_devices
  assert dpsgd_step.make_train_step(config, sharding.data_mesh(), noise_multiplier=1.0) is guarded_step
  dirs = {name: str(tmp_path_factory.mktemp(name)) for name in ("a", "b", "c")}
  one_go = dpsgd.train_dpsgd(config, dirs["a"], progress=False)
  first_half = dpsgd.train_dpsgd(config, dirs["b"], stop_at_step=2, progress=False)
  resumed = dpsgd.train_dpsgd(config, dirs["b"], resume=True, progress=False)
  secret = dpsgd.train_dpsgd(dataclasses.replace(config, seed=None, log_private_diagnostics=True),
                             dirs["c"], progress=False)
  return config, dirs, one_go, first_half, resumed, secret


def _restore_params(config, workdir):
  template = TrainState.create(dpsgd.init_model(config, jax.random.key(0)),
                               dpsgd.make_optimizer(config)).arrays()
  target = {"state": template, "rng": jax.random.key_data(jax.random.key(0))}
  arrays, meta = checkpoint.restore(os.path.join(workdir, "checkpoints"), target)
  return arrays, meta


def test_resume_is_bit_identical(runs):
  config, dirs, one_go, first_half, resumed, _ = runs
  assert first_half["steps"] == 2 and not first_half["finished"]
  assert resumed["steps"] == one_go["steps"] == 4 and resumed["finished"]
  arrays_a, meta_a = _restore_params(config, dirs["a"])
  arrays_b, meta_b = _restore_params(config, dirs["b"])
  chex.assert_trees_all_equal(arrays_a, arrays_b)  # params, momentum, step, key data
  assert resumed["test_accuracy"] == one_go["test_accuracy"]
  assert resumed["test_loss"] == one_go["test_loss"]
  assert resumed["epsilon"] == pytest.approx(one_go["epsilon"], rel=1e-12)
  assert first_half["epsilon"] < resumed["epsilon"]
  # The checkpoint carries the ledger: 1 entry of 4 steps vs 2 entries of 2 steps.
  assert len(json.loads(meta_a["ledger"])["entries"]) == 1
  assert len(json.loads(meta_b["ledger"])["entries"]) == 2


def test_results_epsilon_is_the_accountants(runs):
  config, dirs, one_go, _, _, _ = runs
  q = 16 / DIGITS_TRAIN
  expected = accounting.epsilon(accounting.dpsgd_event(
      noise_multiplier=1.0, sampling_rate=q, steps=4, relation="replace-one"), delta=config.delta)
  add_remove = accounting.epsilon(accounting.dpsgd_event(
      noise_multiplier=1.0, sampling_rate=q, steps=4, relation="add-remove"), delta=config.delta)
  assert one_go["epsilon"] == pytest.approx(expected, rel=1e-9)
  assert one_go["neighbouring_relation"] == "replace-one"
  assert one_go["epsilon_add_remove"] == pytest.approx(add_remove, rel=1e-9)
  assert add_remove < expected
  assert one_go["sampling_rate"] == pytest.approx(q) and one_go["noise_multiplier"] == 1.0
  assert one_go["delta"] == config.delta and one_go["accountant"] == "pld"
  assert one_go["max_batch_size"] % 8 == 0 and one_go["max_batch_size"] >= 16
  with open(os.path.join(dirs["a"], "results.json")) as f:
    assert json.load(f) == one_go
  saved = ledger_lib.PrivacyLedger.load(os.path.join(dirs["a"], "privacy_ledger.json"))
  assert saved.spent_epsilon() == pytest.approx(expected, rel=1e-9)
  assert one_go["ledger"]["spent_epsilon"] == pytest.approx(expected, rel=1e-9)
  assert os.path.exists(os.path.join(dirs["a"], "metrics.csv"))
  assert 0.0 <= one_go["test_accuracy"] <= 1.0


def test_private_batch_metrics_are_off_by_default_and_kept_apart_when_asked(runs, capsys):
  _, dirs, one_go, _, _, secret = runs
  for run in ("a", "c"):  # released: the test split's loss/accuracy and ε only
    assert set(metrics_lib.read_metrics(dirs[run])) == {"test/accuracy", "test/loss",
                                                        "test/epsilon"}
  assert outputs.read_private_diagnostics(dirs["a"]) == {}
  assert outputs.PRIVATE_CSV not in os.listdir(dirs["a"])
  assert "files" not in one_go[outputs.PRIVATE_KEY]
  logged = outputs.read_private_diagnostics(dirs["c"])
  assert {f"private_diagnostics/train/{k}" for k in ("loss", "accuracy", "batch_size",
                                                      "clipped_fraction", "grad_norm")} == set(logged)
  assert secret[outputs.PRIVATE_KEY]["files"] == [outputs.PRIVATE_CSV]
  print("\n".join(dpsgd_cli.summary.summary_lines(secret, workdir=dirs["c"])))
  out = capsys.readouterr().out
  assert f"private diagnostics (not covered by epsilon) in {dirs['c']}/{outputs.PRIVATE_CSV}" in out
  record = records.read_record(os.path.join(dirs["a"], "record.json"))
  assert record["method"] == "dpsgd" and record["test_accuracy"] == one_go["test_accuracy"]
  assert record["sound_epsilon"] == pytest.approx(one_go["epsilon"]) and one_go["warnings"] == []


def test_cli_noise_multiplier_zero_is_allowed_and_loudly_not_private(tmp_path, capsys):
  # The flags of `_config(noise_multiplier=0.0, l2_clip_norm=1e6)`: the step compiled by
  # test_no_noise_huge_clip_is_sgd_on_summed_gradient_over_expected_batch is reused.
  workdir = str(tmp_path / "run")
  dpsgd_cli.main(["--dataset=digits", "--model=lenet5_half", "--expected_batch_size=16",
                  "--l2_clip_norm=1e6", "--noise_multiplier=0", "--steps=4",
                  "--learning_rate=0.5", "--momentum=0.9", "--seed=0", "--no-download",
                  f"--workdir={workdir}", "--no_progress"])
  assert "WARNING: epsilon = inf (NOT private)" in capsys.readouterr().out
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert saved["epsilon"] == math.inf and saved["warnings"] == [outputs.NOT_PRIVATE]
  assert saved["ledger"] is None and saved["steps"] == 4
  assert records.read_record(os.path.join(workdir, "record.json"))["sound_epsilon"] == "inf"
  assert "test/epsilon" not in metrics_lib.read_metrics(workdir)  # nothing finite to plot


def test_default_seed_is_secret_and_fresh(runs):
  config, dirs, one_go, _, _, secret = runs
  assert one_go["seed"] == 0
  assert secret["seed"].startswith("os-entropy") and secret["config"]["seed"] is None
  arrays_a, _ = _restore_params(config, dirs["a"])
  arrays_c, _ = _restore_params(config, dirs["c"])
  # Another root key (not key(0)): the stored key data and so the noise differ.
  assert not np.array_equal(arrays_a["rng"], arrays_c["rng"])


def test_existing_checkpoint_needs_resume_and_same_config(runs):
  config, dirs, _, _, _, _ = runs
  with pytest.raises(ValueError, match="already holds"):
    dpsgd.train_dpsgd(config, dirs["a"], progress=False)
  other = dataclasses.replace(config, seed=1)
  with pytest.raises(ValueError, match="another config"):
    dpsgd.train_dpsgd(other, dirs["a"], resume=True, progress=False)


def test_release_over_budget_is_refused_before_it_runs(tmp_path, monkeypatch,
                                                       noisy_step_8_devices):
  config, _ = noisy_step_8_devices
  real_make_plan = dpsgd.make_plan  # planned ε of `_config()` is ~0.33 > the budget of 0.1
  monkeypatch.setattr(dpsgd, "make_plan",
                      lambda *a, **k: real_make_plan(*a, **k)._replace(target_epsilon=0.1))
  with pytest.raises(ledger_lib.BudgetExceededError, match="release refused"):
    dpsgd.train_dpsgd(config, str(tmp_path), progress=False)
  assert not os.path.exists(tmp_path / "checkpoints")


def test_target_epsilon_calibrates_noise_for_the_whole_run():
  config = _config(noise_multiplier=None, target_epsilon=2.0, delta=1e-5, steps=200)
  plan = dpsgd.make_plan(config, num_examples=DIGITS_TRAIN, num_devices=8)
  assert plan.target_epsilon == 2.0
  assert 0.97 * 2.0 <= plan.planned_epsilon <= 2.0
  event = accounting.dpsgd_event(noise_multiplier=plan.noise_multiplier,
                                 sampling_rate=16 / DIGITS_TRAIN, steps=200,
                                 relation="replace-one")  # the budget's relation
  assert accounting.epsilon(event, delta=1e-5) == pytest.approx(plan.planned_epsilon)


def test_plan_from_epochs_and_max_batch_size():
  plan = dpsgd.make_plan(_config(steps=None, epochs=2.0), num_examples=1000, num_devices=8)
  assert plan.steps == math.ceil(2.0 * 1000 / 16) and plan.steps_per_epoch == 63
  assert plan.max_batch_size % 8 == 0
  assert plan.max_batch_size >= data.suggested_max_batch_size(1000, 16 / 1000)


@pytest.mark.parametrize("kwargs,match", [
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(noise_multiplier=None, target_epsilon=0.0), "target_epsilon"),
    (dict(noise_multiplier=None, target_epsilon=-1.0), "target_epsilon"),
    (dict(noise_multiplier=-0.5), "noise_multiplier"),
    (dict(target_epsilon=1.0), "exactly one of noise_multiplier and target_epsilon"),
    (dict(noise_multiplier=None), "exactly one of noise_multiplier and target_epsilon"),
    (dict(l2_clip_norm=0.0), "l2_clip_norm"),
    (dict(l2_clip_norm=-1.0), "l2_clip_norm"),
    (dict(dataset="imagenet"), "unknown dataset"),
    (dict(model="gpt"), "unknown model"),
    (dict(norm="batch"), "BatchNorm mixes the examples"),
    (dict(norm="layer"), "norm must be one of"),
    (dict(steps=None), "exactly one of steps and epochs"),
    (dict(epochs=1.0), "exactly one of steps and epochs"),
    (dict(steps=0), "steps"),
    (dict(expected_batch_size=0), "expected_batch_size"),
    (dict(max_batch_size=8), "max_batch_size"),
    (dict(optimizer="lamb"), "optimizer"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(momentum=1.0), "momentum"),
])
def test_bad_config_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _config(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_batch_size=60), "not divisible by the 8 devices"),
    (dict(expected_batch_size=5000), "exceeds the 1442"),
])
def test_bad_plan_raises_before_compute(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    dpsgd.train_dpsgd(_config(**kwargs), str(tmp_path), progress=False)
  assert not os.listdir(tmp_path)  # nothing trained or written


def test_cli_flags_make_the_config():
  config, args = dpsgd_cli.parse_config([
      "--dataset=digits", "--model=lenet5", "--target_epsilon=3", "--epochs=2",
      "--expected_batch_size=64", "--l2_clip_norm=0.5", "--resume", "--no-download"])
  assert config == dpsgd.DPSGDConfig(dataset="digits", model="lenet5", target_epsilon=3.0,
                                     epochs=2.0, expected_batch_size=64, l2_clip_norm=0.5)
  assert args.resume and args.workdir == os.path.join("runs", "dpsgd", "digits_lenet5")
  with pytest.raises(SystemExit):
    dpsgd_cli.parse_config(["--noise_multiplier=1", "--steps=10", "--norm=batch"])
