"""The public DP-SGD path beside the CLI's step and jax-privacy's, on one model and batch.

One DP-SGD step (per-example clip, noise, SGD update) on LeNet-5 with GroupNorm (or SmallCNN),
batch 256, MNIST shapes, each on its own copy of one initialisation:

* "public clipped_grad": `privacy.clipped_grad` + `privacy.dpsgd_privatizer` + `optax.sgd`, the
  loop of docs/MECHANISMS.md, jitted as a user would;
* "public ghost": the same with `models.ghost.clipped_grad` (ghost clipping);
* "CLI DP-SGD step": `methods.dpsgd.make_train_step` (what `python -m dpkd_jax.methods.dpsgd`
  runs);
* "jax-privacy clipped_grad": `jax_privacy.clipped_grad` + its `gaussian_privatizer` (only when
  jax-privacy is installed).

Warm-up, then interleaved rounds (`protocol.time_until_tight`), so background load hits every
step alike; the ratios of medians against the CLI's step are printed with their bootstrap
intervals. The idle check is `protocol.guard_script` (`DPKD_ALLOW_BUSY=1` runs anyway, and says
so). Usage: `PYTHONPATH=. python benchmarks/dropin_dpsgd.py [--repeats=15] [--model=lenet5]`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import protocol  # noqa: E402  pylint: disable=wrong-import-position

from dpkd_jax import data  # noqa: E402
from dpkd_jax import privacy  # noqa: E402
from dpkd_jax.methods import dpsgd  # noqa: E402
from dpkd_jax.models import core  # noqa: E402
from dpkd_jax.models import ghost  # noqa: E402
from dpkd_jax.train import sharding  # noqa: E402
from dpkd_jax.train.state import TrainState  # noqa: E402

BATCH_SIZE = 256
NUM_EXAMPLES = 60_000
L2_CLIP_NORM = 1.0
NOISE_MULTIPLIER = 1.0
LEARNING_RATE = 0.1
CLI = "CLI DP-SGD step"


def _public_step(parts: core.ModelParts, plan, info, key: jax.Array, *, use_ghost: bool):
  """The user's loop of docs/MECHANISMS.md on the zoo model: (params, opt state) -> step."""

  def loss_fn(params, images, labels):  # images (1, 28, 28, 1) uint8: one example
    out, _ = core.apply(parts.graphdef, params, parts.batch_stats,
                        data.model_inputs(images, info), train=True)
    return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean()

  if use_ghost:
    clipped = ghost.clipped_grad(
        parts.graphdef, batch_stats=parts.batch_stats, train=True, l2_clip_norm=L2_CLIP_NORM,
        loss_fn=lambda out, label: optax.softmax_cross_entropy_with_integer_labels(
            out.logits, label))
  else:
    clipped = privacy.clipped_grad(loss_fn, l2_clip_norm=L2_CLIP_NORM, batch_argnums=(1, 2))
  tx = optax.chain(privacy.dpsgd_privatizer(plan, key=key), optax.sgd(LEARNING_RATE))

  @jax.jit
  def step(params, opt_state, images, labels, mask):
    inputs = data.model_inputs(images, info) if use_ghost else images
    updates, opt_state = tx.update(clipped(params, inputs, labels, mask=mask), opt_state,
                                   params)
    return optax.apply_updates(params, updates), opt_state

  params = jax.tree.map(jnp.copy, parts.params)
  return step, (params, tx.init(params))


def _jax_privacy_step(parts: core.ModelParts, info, key: jax.Array):
  """jax-privacy's clipped_grad + gaussian_privatizer on the same model; None without it."""
  try:
    import jax_privacy  # pylint: disable=import-outside-toplevel
    from jax_privacy import noise_addition  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None

  def loss_fn(params, images, labels):
    out, _ = core.apply(parts.graphdef, params, parts.batch_stats,
                        data.model_inputs(images, info), train=True)
    return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean()

  clipped = jax_privacy.clipped_grad(loss_fn, l2_clip_norm=L2_CLIP_NORM, batch_argnums=(1, 2))
  privatizer = noise_addition.gaussian_privatizer(stddev=NOISE_MULTIPLIER * L2_CLIP_NORM,
                                                  prng_key=key)
  tx = optax.sgd(LEARNING_RATE)

  @jax.jit
  def step(params, opt_state, noise_state, images, labels):
    noisy, noise_state = privatizer.update(clipped(params, images, labels), noise_state)
    grads = jax.tree.map(lambda g: g / BATCH_SIZE, noisy)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, noise_state

  params = jax.tree.map(jnp.copy, parts.params)
  return step, (params, tx.init(params), privatizer.init(params))


def build_steps(model: str) -> dict[str, Callable[[int], None]]:
  """name -> step(call index), each blocking until its outputs are ready."""
  config = dpsgd.DPSGDConfig(dataset="mnist", model=model, norm="group",
                             expected_batch_size=BATCH_SIZE, l2_clip_norm=L2_CLIP_NORM,
                             noise_multiplier=NOISE_MULTIPLIER, steps=1,
                             learning_rate=LEARNING_RATE)
  init_key, image_key, label_key, noise_key = jax.random.split(jax.random.key(0), 4)
  images = jax.random.randint(image_key, (BATCH_SIZE, 28, 28, 1), 0, 256).astype(jnp.uint8)
  labels = jax.random.randint(label_key, (BATCH_SIZE,), 0, 10, dtype=jnp.int32)
  mask = jnp.ones((BATCH_SIZE,), bool)
  parts = dpsgd.init_model(config, init_key)
  plan = dpsgd.make_plan(config, num_examples=NUM_EXAMPLES, num_devices=1)  # z, C, B
  mesh = sharding.data_mesh(jax.devices()[:1])
  holder, steps = {}, {}

  holder[CLI] = sharding.replicate(TrainState.create(
      parts._replace(params=jax.tree.map(jnp.copy, parts.params)), dpsgd.make_optimizer(config)),
                                   mesh)
  cli = dpsgd.make_train_step(plan, config.info, mesh)

  def cli_step(i: int) -> None:
    holder[CLI], metrics = cli(holder[CLI], images, labels, mask, jax.random.fold_in(noise_key, i))
    jax.block_until_ready((holder[CLI], metrics))

  steps[CLI] = cli_step
  for name, use_ghost in (("public clipped_grad", False), ("public ghost", True)):
    fn, holder[name] = _public_step(parts, plan, config.info, noise_key, use_ghost=use_ghost)

    def public_step(i: int, name=name, fn=fn) -> None:
      del i  # the privatizer's state splits its own key every call
      holder[name] = jax.block_until_ready(fn(*holder[name], images, labels, mask))

    steps[name] = public_step
  jaxp = _jax_privacy_step(parts, config.info, noise_key)
  if jaxp is not None:
    fn, holder["jaxp"] = jaxp

    def jaxp_step(i: int) -> None:
      del i
      holder["jaxp"] = jax.block_until_ready(fn(*holder["jaxp"], images, labels))

    steps["jax-privacy clipped_grad"] = jaxp_step
  return steps


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds at least")
  parser.add_argument("--max_repeats", type=int, default=None,
                      help="rounds at most (default: 2 x repeats)")
  parser.add_argument("--model", default="lenet5", choices=("lenet5", "small_cnn"))
  parser.add_argument("--out", default=None, help="also write the table as a JSON record here "
                      "(e.g. docs/results/benchmarks/dropin_dpsgd__cpu.json)")
  args = parser.parse_args()
  load = protocol.guard_script()
  steps = build_steps(args.model)
  pairs = [(CLI, name) for name in steps if name != CLI]
  times, tight = protocol.time_until_tight(
      steps, pairs, warmup=1, min_rounds=args.repeats,
      max_rounds=max(args.repeats, args.max_repeats or 2 * args.repeats))
  print(f"\n## One DP-SGD step, {args.model} (GroupNorm), B = {BATCH_SIZE}, 28x28x1, "
        f"z = {NOISE_MULTIPLIER}, C = {L2_CLIP_NORM}, SGD; jax {jax.__version__} on "
        f"{jax.devices()[0].platform}; {len(times[CLI])} interleaved rounds"
        f"{'' if tight else ' (intervals not tight)'}\n")
  print(f"| step | median s | / {CLI} (95% interval) |\n|---|---|---|")
  rows = {}
  for name, series in times.items():
    interval = (1.0, 1.0, 1.0) if name == CLI else protocol.ratio_interval(times[CLI], series)
    ratio = "1" if name == CLI else "{:.3f} ({:.3f}-{:.3f})".format(*interval)
    print(f"| {name} | {statistics.median(series):.4f} | {ratio} |")
    rows[name] = {"median_s": statistics.median(series), "ratio_to_cli": list(interval)}
  if args.out:
    record = {"benchmark": "dropin_dpsgd", "model": args.model, "batch_size": BATCH_SIZE,
              "command": " ".join(["PYTHONPATH=. python benchmarks/dropin_dpsgd.py", *sys.argv[1:]]),
              "jax": jax.__version__, "platform": jax.devices()[0].platform,
              "host": protocol.host_id(), "load_before": load, "rounds": len(times[CLI]),
              "intervals_tight": tight, "rows": rows,
              "ratio": f"a row's median over the CLI step's ({CLI!r}); above 1 is slower"}
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(record, f, indent=2)
      f.write("\n")


if __name__ == "__main__":
  main()
