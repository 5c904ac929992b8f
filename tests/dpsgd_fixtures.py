"""Fixtures shared by the DP-SGD tests (test_dpsgd_{privacy,step,run}.py): one config, one
batch, one trace-guarded step, so that every file (and the training loop) reuses the step
compiled once per process (`make_train_step` is cached per plan, dataset, mesh and clipping).

Tiny LeNet-5/2 (GroupNorm) on the embedded digits, expected batch 16, padded batch M = 48 (6
rows per fake device).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState

DIGITS_TRAIN = 1442
NUM_REAL = 11  # real rows of the test batch; expected batch size 16 != 11: normaliser visible


def make_config(**kw) -> dpsgd.DPSGDConfig:
  # Momentum 0.9 everywhere (its first step is plain SGD), so that the runs can reuse the step
  # compiled for `noisy_step_8_devices` and exercise optimizer state in the checkpoint.
  base = dict(dataset="digits", model="lenet5_half", expected_batch_size=16, l2_clip_norm=2.0,
              noise_multiplier=1.0, steps=4, learning_rate=0.5, momentum=0.9, seed=0)
  base.update(kw)
  return dpsgd.DPSGDConfig(**base)


def make_plan(config: dpsgd.DPSGDConfig) -> dpsgd.DPSGDPlan:
  """The plan `train_dpsgd` makes for `config` on the digits and the 8 fake devices."""
  return dpsgd.make_plan(config, num_examples=DIGITS_TRAIN, num_devices=8)


def make_step(config: dpsgd.DPSGDConfig, mesh=None, plan=None):
  """The jitted step of `config` (or of `plan`), as the training loop gets it."""
  mesh = sharding.data_mesh() if mesh is None else mesh
  return dpsgd.make_train_step(make_plan(config) if plan is None else plan, config.info, mesh,
                               clipping=config.clipping)


@pytest.fixture(scope="module")
def parts():
  return dpsgd.init_model(make_config(), jax.random.key(0))


@pytest.fixture(scope="module")
def batch():
  # M = the padded size `train_dpsgd` picks for `make_config()` (48), so the loop reuses the
  # executables compiled by the unit tests.
  num_rows = make_plan(make_config()).max_batch_size
  train = data.load("digits", "train")
  indices = np.arange(100, 100 + num_rows)  # padded rows hold real images: masking must work
  mask = np.arange(num_rows) < NUM_REAL
  return train.images[indices], train.labels[indices], mask


def inputs(parts, config, batch, mesh=None):
  """A fresh state (the step donates it) and the batch, laid out as `train_dpsgd` does.

  The same layout as the loop lets the runs reuse the executable compiled here.
  """
  mesh = sharding.data_mesh() if mesh is None else mesh
  params = jax.tree.map(jnp.array, parts.params)  # jnp.array copies
  state = TrainState.create(core.ModelParts(parts.graphdef, params, parts.batch_stats),
                            dpsgd.make_optimizer(config))
  return sharding.replicate(state, mesh), *sharding.shard_batch(batch, mesh)


def key(seed, mesh=None):
  return sharding.replicate(jax.random.key(seed), sharding.data_mesh() if mesh is None else mesh)


def hand_ema(iterates, decay, start_step=0):
  """The bias-corrected EMA of the iterates p_1..p_t after `start_step`, in float64:
  Σ_i d^(k-i) p_{s+i} / Σ_i d^(k-i) (the last iterate itself while k <= 0)."""
  averaged = iterates[start_step:] or iterates[-1:]
  weights = decay ** np.arange(len(averaged) - 1, -1, -1, dtype=np.float64)
  return jax.tree.map(lambda *ps: sum(w * np.float64(p) for w, p in zip(weights, ps))
                      / weights.sum(), *averaged)


_GUARDED_STEPS = []  # the steps built under the trace guard in this process


@pytest.fixture(scope="module")
def noisy_step_8_devices():
  """The step of `make_config()` on 8 devices, guarded by `chex.assert_max_traces(n=1)`.

  `make_train_step` is cached, so the training loop gets this very function: the unit
  tests' calls and all steps of the runs (one resumed from a checkpoint) must share one
  trace. A step cached earlier in the process without the guard is rebuilt under it, and the
  guarded step leaves the cache with the module: other tests' runs (e.g. the export tests'
  DP-SGD run) must get an unguarded step of their own.
  """
  config = make_config()
  step = make_step(config)
  if not any(step is guarded for guarded in _GUARDED_STEPS):
    dpsgd.make_train_step.cache_clear()
    original = step_lib.build_train_step
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(step_lib, "build_train_step",
                 lambda *a, **k: chex.assert_max_traces(original(*a, **k), n=1))
      chex.clear_trace_counter()
      step = make_step(config)
    _GUARDED_STEPS.append(step)
  yield config, step
  dpsgd.make_train_step.cache_clear()
  _GUARDED_STEPS.clear()
