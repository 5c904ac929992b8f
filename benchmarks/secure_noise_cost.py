"""The cost of `--secure_noise`: float vs discrete Gaussian noise, side by side in one process.

    PYTHONPATH=. python benchmarks/secure_noise_cost.py [--repeats=20]

Times (medians over interleaved repeats, and their ratio; JSON on stdout):
* one DPDFD step on the digits quickstart shape (B = 64, DAFL width 64, lenet5 teacher,
  the datalens_cnn student), built from the same plan with `secure_noise` off and on;
* the noise half of one DP-SGD step (`dpsgd_add_noise`) against the same D coordinates on the
  secure grid (`secure_gaussian.add_grid_noise`), D = lenet5's parameter count on digits. DP-SGD
  does not offer the secure mode (no sound accountant of subsampled zCDP under replace-one):
  this is the sampler's cost at that size, for comparison.
Run it on an idle machine (`protocol.guard_script`; DPKD_ALLOW_BUSY=1 runs anyway and says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib as _pathlib
import statistics
import sys as _sys
import time

import jax
import jax.flatten_util
from flax import nnx

from dpkd_jax import models
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import step as dpdfd_step
from dpkd_jax.models import core
from dpkd_jax.privacy import dpsgd_mechanism
from dpkd_jax.privacy import secure_gaussian


def _median_pair(first, second, repeats: int) -> dict[str, float]:
  """Interleaved timings of two thunks: medians (s) and the ratio second / first."""
  for fn in (first, second):  # compile and warm up
    jax.block_until_ready(fn())
  times = ([], [])
  for _ in range(repeats):
    for fn, out in zip((first, second), times):
      start = time.perf_counter()
      jax.block_until_ready(fn())
      out.append(time.perf_counter() - start)
  a, b = statistics.median(times[0]), statistics.median(times[1])
  return {"float_s": a, "secure_s": b, "ratio": b / a}


def _dpdfd(repeats: int) -> dict[str, float]:
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=("unused",), noise_multiplier=10.0,
                             steps=600, batch_size=64, generator_channels=64)
  info = config.info
  teacher = core.split(models.create_classifier("lenet5", num_classes=info.num_classes,
                                                input_shape=info.image_shape,
                                                rngs=nnx.Rngs(0)))
  ensemble = dpdfd.TeacherEnsemble.stack([teacher])
  plan = dpdfd.make_plan(config)
  secure_plan = dpdfd.make_plan(dataclasses.replace(config, secure_noise=True))
  state = dpdfd.init_state(config, jax.random.key(0))
  steps = [jax.jit(dpdfd_step.build_train_step(p, config, ensemble.graphdef))
           for p in (plan, secure_plan)]
  key = jax.random.key(1)
  run = [lambda s=s: s(state, ensemble.params, ensemble.batch_stats, key) for s in steps]
  return {"rows": plan.rows_per_step * info.num_classes, **_median_pair(*run, repeats)}


def _dpsgd_noise(repeats: int) -> dict[str, float]:
  info = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=("u",), noise_multiplier=1.0).info
  model = models.create_classifier("lenet5", num_classes=info.num_classes,
                                   input_shape=info.image_shape, rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  flat, _ = jax.flatten_util.ravel_pytree(params)
  grid = secure_gaussian.choose_grid(noise_multiplier=1.0, bound=1.0)
  key = jax.random.key(2)
  add_float = jax.jit(lambda k, p: dpsgd_mechanism.dpsgd_add_noise(
      k, p, l2_clip_norm=1.0, noise_multiplier=1.0).noisy_sum)
  add_secure = jax.jit(lambda k, x: secure_gaussian.add_grid_noise(k, x, grid))
  return {"coordinates": int(flat.size),
          **_median_pair(lambda: add_float(key, params), lambda: add_secure(key, flat), repeats)}


def main():
  _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parent))
  import protocol  # pylint: disable=g-import-not-at-top  (sibling script)
  load = protocol.guard_script()
  p = argparse.ArgumentParser()
  p.add_argument("--repeats", type=int, default=20)
  args = p.parse_args()
  print(json.dumps({"platform": jax.devices()[0].platform, "load_before": load,
                    "repeats": args.repeats, "dpdfd_step": _dpdfd(args.repeats),
                    "dpsgd_noise": _dpsgd_noise(args.repeats)}, indent=2))


if __name__ == "__main__":
  main()
