"""DP-SGD cross-checks against jax-privacy and Opacus: ε agreement and step throughput.

    PYTHONPATH=. python benchmarks/peers_dpsgd.py [--repeats=15] [--skip_epsilon]
        [--skip_throughput] [--model=lenet5|small_cnn]

The peers are a benchmark extra (`pip install -e .[bench]`: torch, opacus, jax-privacy), never a
library requirement; a missing peer prints "n/a" and the rest still runs.

(a) ε of DP-SGD (Poisson rate q, noise multiplier z, T steps, add/remove-one) at δ = 1e-5 over a
grid: ours (`accounting.epsilon(dpsgd_event(...))`, PLD at our 1e-3 grid, PLD at 1e-4 and RDP),
jax-privacy's `DpsgdTrainingAccountant` (PLD and RDP configs) and Opacus' accountants (RDP and
PRV). Only like is compared with like (PLD/PRV with PLD, RDP with RDP): RDP is a looser bound.
Every pair differing by more than `REL_TOLERANCE` is flagged with its known reason.

(b) Throughput of one DP-SGD step (per-example clip + noise + SGD update) on LeNet-5 with
GroupNorm, batch 256, MNIST shapes: ours (jit), jax-privacy's `clipped_grad` + Gaussian
privatizer on our very model, and Opacus (hooks grad sampler, CPU) on the same architecture in
PyTorch (parameter counts checked equal). Also our DPDFD direct-mode step (no per-example
parameter gradients) and, as the floor of any step that trains on the batch, a non-private
batch gradient + SGD update. `--model=small_cnn` runs the JAX rows on SmallCNN instead. Every
step is warmed up, then timed in interleaved rounds so background load hits all alike: compare
the ratios, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib as _pathlib
import sys as _sys
import itertools
import os
import statistics
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import dpsgd
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState

DELTA = 1e-5
NOISE_MULTIPLIERS = (0.5, 1.0, 2.0)
SAMPLING_RATES = (0.004, 0.01)
STEPS = (100, 1000, 10000)
# jax-privacy derives q = batch_size / num_samples: MNIST's 60,000 gives q N = 240 and 600 exactly.
NUM_EXAMPLES = 60_000
REL_TOLERANCE = 0.01
# (column a, column b, known reason they may differ). Like with like only.
COMPARISONS = (
    ("ours_pld", "jaxp_pld", "grid 1e-3 (ours) vs 1e-4 (jax-privacy): the coarser "
     "pessimistic PLD grid overestimates ε slightly"),
    ("ours_pld_1e-4", "jaxp_pld", "none known: both are dp_accounting's PLDAccountant"),
    ("ours_pld", "opacus_prv", "Opacus PRV returns an upper bound with eps_error=0.01 "
     "(absolute), which dominates at small ε"),
    ("ours_rdp", "jaxp_rdp", "RDP order grids differ (ours: dp_accounting default; "
     "jax-privacy: linspace(1.01, 8, 50) + 8..63 + 65..512)"),
    ("ours_rdp", "opacus_rdp", "fractional-order RDP: dp_accounting 0.6.0 adds |terms| of "
     "A_alpha's binomial series, Opacus keeps their signs (exact; checked by quadrature)"),
)
BATCH_SIZE = 256
L2_CLIP_NORM = 1.0
NOISE_MULTIPLIER = 1.0
LEARNING_RATE = 0.5
PLAIN = "non-private batch grad (floor)"
GHOST = "ours DP-SGD ghost"


def ours_epsilons(z: float, q: float, steps: int, delta: float = DELTA) -> dict[str, float]:
  """Our ε: PLD at the library's 1e-3 grid, PLD at jax-privacy's 1e-4 grid, and RDP."""
  event = accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=steps,
                                 relation="add-remove")
  return {"ours_pld": accounting.epsilon(event, delta=delta),
          "ours_pld_1e-4": accounting.epsilon(event, delta=delta,
                                              value_discretization_interval=1e-4),
          "ours_rdp": accounting.epsilon(event, delta=delta, accountant="rdp")}


def jax_privacy_epsilons(z: float, q: float, steps: int, delta: float = DELTA,
                         num_examples: int = NUM_EXAMPLES) -> dict[str, float]:
  """jax-privacy's `DpsgdTrainingAccountant` with its default PLD and RDP configs."""
  from jax_privacy.accounting import accountants, analysis  # pylint: disable=g-import-not-at-top
  batch_size = round(q * num_examples)
  if abs(batch_size / num_examples - q) > 1e-12:
    raise ValueError(f"q={q} is not a whole batch of {num_examples} examples")
  params = analysis.DpParams(noise_multipliers=z, num_samples=num_examples, delta=delta,
                             batch_size=batch_size)
  configs = {"jaxp_pld": accountants.PldAccountantConfig(),
             "jaxp_rdp": accountants.RdpAccountantConfig()}
  return {name: float(analysis.DpsgdTrainingAccountant(config).compute_epsilon(steps, params))
          for name, config in configs.items()}


def opacus_epsilons(z: float, q: float, steps: int, delta: float = DELTA) -> dict[str, float]:
  """Opacus' RDP and PRV accountants (history set directly: T identical steps)."""
  from opacus.accountants import PRVAccountant, RDPAccountant  # pylint: disable=g-import-not-at-top
  result = {}
  for name, accountant in (("opacus_rdp", RDPAccountant()), ("opacus_prv", PRVAccountant())):
    accountant.history = [(z, q, steps)]  # what T calls of step(z, q) would leave
    result[name] = float(accountant.get_epsilon(delta))
  return result


def flags(row: dict[str, float], tolerance: float = REL_TOLERANCE) -> list[str]:
  """`a/b +x.x% (reason)` for every `COMPARISONS` pair present whose |a/b - 1| > tolerance."""
  found = []
  for a, b, reason in COMPARISONS:
    if a in row and b in row:
      relative = row[a] / row[b] - 1.0
      if abs(relative) > tolerance:
        found.append(f"{a}/{b} {relative:+.1%} ({reason})")
  return found


def epsilon_table() -> None:
  """Prints the ε grid as a markdown table, then the flagged differences."""
  peers = {"jax-privacy": jax_privacy_epsilons, "opacus": opacus_epsilons}
  columns = ["ours_pld", "ours_pld_1e-4", "jaxp_pld", "opacus_prv", "ours_rdp", "jaxp_rdp",
             "opacus_rdp"]
  print(f"## ε at δ = {DELTA:g} (add/remove-one, Poisson); N = {NUM_EXAMPLES} for jax-privacy\n")
  print("| z | q | T | " + " | ".join(columns) + " |")
  print("|---" * (3 + len(columns)) + "|")
  all_flags, missing = [], set()
  for z, q, steps in itertools.product(NOISE_MULTIPLIERS, SAMPLING_RATES, STEPS):
    row = ours_epsilons(z, q, steps)
    for name, fn in peers.items():
      try:
        row.update(fn(z, q, steps))
      except ImportError:
        missing.add(name)
    cells = [f"{row[c]:.4f}" if c in row else "n/a" for c in columns]
    print(f"| {z:g} | {q:g} | {steps} | " + " | ".join(cells) + " |")
    all_flags += [f"z={z:g} q={q:g} T={steps}: {f}" for f in flags(row)]
  if missing:
    print(f"\nnot installed (n/a): {sorted(missing)}")
  print(f"\nRelative differences > {REL_TOLERANCE:.0%} ({len(all_flags)}):")
  for line in all_flags or ["none"]:
    print(f"- {line}")


def time_interleaved(steps: dict[str, Callable[[int], None]], warmup: int,
                      repeats: int) -> dict[str, list[float]]:
  """Warms each step up, then `repeats` rounds timing each once (seconds). A step gets its
  call index so that it can derive a fresh noise key per call."""
  for step in steps.values():
    for i in range(warmup):
      step(i)
  times = {name: [] for name in steps}
  for r in range(repeats):
    for name, step in steps.items():
      start = time.perf_counter()
      step(warmup + r)  # each step blocks until its outputs are ready
      times[name].append(time.perf_counter() - start)
  return times


def compiled_memory(fn: Callable, *args) -> float | None:
  """Bytes XLA allocates for one call of `fn` on `args`: its temporaries plus its arguments and
  outputs, less the outputs that alias (donated) arguments; None where the backend reports
  none. The step's device memory (on CPU, host memory in XLA's buffers). A PyTorch eager step
  has no such static plan."""
  try:
    stats = jax.jit(lambda *a: fn(*a)).lower(*args).compile().memory_analysis()
  except Exception:  # pylint: disable=broad-except  (a missing figure is reported as n/a)
    return None
  if stats is None:
    return None
  return float(stats.temp_size_in_bytes + stats.argument_size_in_bytes
               + stats.output_size_in_bytes - stats.alias_size_in_bytes)


def jax_steps(images_uint8: jax.Array, labels: jax.Array, key: jax.Array,
              model: str = "lenet5") -> tuple[dict[str, Callable[[int], None]], int]:
  """Ours (DP-SGD, DPDFD direct), jax-privacy's DP-SGD step and a non-private batch gradient,
  each on its own copy of one initialisation of `model` (GroupNorm).

  Returns:
    (name -> step(call_index), the model's parameter count). Each step of ours and the plain
    one carries `step.memory`, its `compiled_memory` in bytes.
  """
  config = dpsgd.DPSGDConfig(dataset="mnist", model=model, norm="group",
                             expected_batch_size=BATCH_SIZE, l2_clip_norm=L2_CLIP_NORM,
                             noise_multiplier=NOISE_MULTIPLIER, steps=1,
                             learning_rate=LEARNING_RATE)
  init_key, ours_key, direct_key, jaxp_key = jax.random.split(key, 4)
  parts = dpsgd.init_model(config, init_key)
  copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  (steps donate their state)
  mask = jnp.ones(labels.shape, bool)  # (B,): a full batch, no padding rows
  mesh = sharding.data_mesh(jax.devices()[:1])
  steps, holder = {}, {}

  holder["ours"] = sharding.replicate(
      TrainState.create(parts._replace(params=copy(parts.params)), dpsgd.make_optimizer(config)),
      mesh)
  plan = dpsgd.make_plan(config, num_examples=NUM_EXAMPLES, num_devices=1)  # z, C, B
  ours = dpsgd.make_train_step(plan, config.info, mesh)

  def ours_step(i: int) -> None:
    holder["ours"], metrics = ours(holder["ours"], images_uint8, labels, mask,
                                   jax.random.fold_in(ours_key, i))
    jax.block_until_ready((holder["ours"], metrics))

  steps["ours DP-SGD"] = ours_step
  ours_step.memory = compiled_memory(ours, holder["ours"], images_uint8, labels, mask, ours_key)

  # The same step with ghost clipping (`--clipping=ghost`): no per-example gradients.
  ghost_config = dataclasses.replace(config, clipping="ghost")
  holder["ghost"] = sharding.replicate(
      TrainState.create(parts._replace(params=copy(parts.params)),
                        dpsgd.make_optimizer(ghost_config)), mesh)
  ghost = dpsgd.make_train_step(plan, config.info, mesh, clipping="ghost")

  def ghost_step(i: int) -> None:
    holder["ghost"], metrics = ghost(holder["ghost"], images_uint8, labels, mask,
                                     jax.random.fold_in(ours_key, i))
    jax.block_until_ready((holder["ghost"], metrics))

  steps[GHOST] = ghost_step
  ghost_step.memory = compiled_memory(ghost, holder["ghost"], images_uint8, labels, mask,
                                      ours_key)

  try:
    import jax_privacy  # pylint: disable=g-import-not-at-top
    from jax_privacy import noise_addition  # pylint: disable=g-import-not-at-top
  except ImportError:
    jax_privacy = None
  if jax_privacy is not None:
    info = config.info

    def example_loss(params, images, labels_):  # images (1, 28, 28, 1): one example
      out, _ = core.apply(parts.graphdef, params, parts.batch_stats,
                          data.normalize(images, info), train=True)
      return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels_).mean()

    clipped_sum = jax_privacy.clipped_grad(example_loss, l2_clip_norm=L2_CLIP_NORM,
                                           batch_argnums=(1, 2))
    privatizer = noise_addition.gaussian_privatizer(stddev=NOISE_MULTIPLIER * L2_CLIP_NORM,
                                                    prng_key=jaxp_key)
    tx = optax.sgd(LEARNING_RATE)

    @jax.jit
    def jaxp(params, opt_state, noise_state, images, labels_):
      noisy_sum, noise_state = privatizer.update(clipped_sum(params, images, labels_),
                                                 noise_state)
      grads = jax.tree.map(lambda g: g / BATCH_SIZE, noisy_sum)  # expected batch size
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, noise_state

    jaxp_params = copy(parts.params)
    holder["jaxp"] = (jaxp_params, tx.init(jaxp_params), privatizer.init(jaxp_params))

    def jaxp_step(i: int) -> None:
      del i  # the privatizer's state splits its own key every call
      holder["jaxp"] = jax.block_until_ready(jaxp(*holder["jaxp"], images_uint8, labels))

    steps["jax-privacy DP-SGD"] = jaxp_step

  direct_config = dpdfd.DirectConfig(dataset="mnist", noise_multiplier=NOISE_MULTIPLIER,
                                     l2_clip_norm=L2_CLIP_NORM)
  direct = jax.jit(dpdfd.build_direct_step(dpdfd.make_direct_plan(direct_config), direct_config),
                   donate_argnums=0)
  holder["direct"] = TrainState.create(parts._replace(params=copy(parts.params)),
                                       optax.adam(1e-3))
  images = data.normalize(images_uint8, config.info)  # direct mode takes normalized images

  def direct_step(i: int) -> None:
    holder["direct"], metrics = direct(holder["direct"], images, labels, mask,
                                       jax.random.fold_in(direct_key, i))
    jax.block_until_ready((holder["direct"], metrics))

  steps["ours DPDFD direct"] = direct_step
  direct_step.memory = compiled_memory(direct, holder["direct"], images, labels, mask, direct_key)

  # The floor of any step that trains on the batch: one non-private batch gradient + update.
  @jax.jit
  def plain(params, opt_state, images_, labels_):
    def batch_loss(p):
      out, _ = core.apply(parts.graphdef, p, parts.batch_stats, images_, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels_).mean()
    updates, opt_state = plain_tx.update(jax.grad(batch_loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  plain_tx = optax.sgd(LEARNING_RATE)
  plain_params = copy(parts.params)
  holder["plain"] = (plain_params, plain_tx.init(plain_params))

  def plain_step(i: int) -> None:
    del i  # no randomness
    holder["plain"] = jax.block_until_ready(plain(*holder["plain"], images, labels))

  steps[PLAIN] = plain_step
  plain_step.memory = compiled_memory(plain, *holder["plain"], images, labels)
  return steps, models.count_params(parts.params)


def opacus_step(images_uint8: jax.Array, labels: jax.Array) -> tuple[Callable[[int], None], int]:
  """Opacus' DP-SGD step on LeNet-5/GroupNorm in PyTorch. Raises ImportError without it."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from opacus import GradSampleModule  # pylint: disable=g-import-not-at-top
  from opacus.optimizers import DPOptimizer  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)  # benchmark only: reproducible init and noise
  # classifiers.LeNet5 with norm="group": bias-free convs (GroupNorm's shift replaces it), one
  # group per channel (group_count(6) = 6, group_count(16) = 16), 28×28 padded as if 32×32.
  model = nn.Sequential(
      nn.Conv2d(1, 6, 5, padding=2, bias=False), nn.GroupNorm(6, 6), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(6, 16, 5, bias=False), nn.GroupNorm(16, 16), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
      nn.Linear(84, 10))
  param_count = sum(p.numel() for p in model.parameters())
  module = GradSampleModule(model, loss_reduction="mean")
  optimizer = DPOptimizer(torch.optim.SGD(module.parameters(), lr=LEARNING_RATE),
                          noise_multiplier=NOISE_MULTIPLIER, max_grad_norm=L2_CLIP_NORM,
                          expected_batch_size=BATCH_SIZE, loss_reduction="mean")
  info = data.DATASETS["mnist"]
  # NHWC uint8 -> NCHW normalized float32, once (our steps normalize inside, a negligible op).
  x = torch.from_numpy(np.asarray(data.normalize(np.asarray(images_uint8), info))
                       .transpose(0, 3, 1, 2).copy())
  y = torch.from_numpy(np.asarray(labels).astype(np.int64))
  loss_fn = nn.CrossEntropyLoss()

  def step(i: int) -> None:
    del i  # Opacus draws its noise from torch's global generator
    optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
      # The input needs no gradient; Opacus' hooks still see every layer's output gradient.
      warnings.filterwarnings("ignore", message="Full backward hook is firing")
      loss_fn(module(x), y).backward()
    optimizer.step()

  return step, param_count


def throughput_table(warmup: int, repeats: int, model: str = "lenet5") -> None:
  """Prints min/median/max seconds per step and the ratios of medians. Opacus runs only for
  lenet5 (the one architecture written in PyTorch here)."""
  data_key, model_key = jax.random.split(jax.random.key(0))
  image_key, label_key = jax.random.split(data_key)
  images_uint8 = jax.random.randint(image_key, (BATCH_SIZE, 28, 28, 1), 0, 256).astype(jnp.uint8)
  labels = jax.random.randint(label_key, (BATCH_SIZE,), 0, 10, dtype=jnp.int32)
  steps, jax_count = jax_steps(images_uint8, labels, model_key, model)
  torch_count, torch_info = None, "no PyTorch twin of this model"
  if model == "lenet5":
    try:
      steps["Opacus DP-SGD (CPU)"], torch_count = opacus_step(images_uint8, labels)
      import torch  # pylint: disable=g-import-not-at-top
      torch_info = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    except ImportError:
      torch_info = "torch/opacus not installed"
  print(f"\n## One step, {model} (GroupNorm), B = {BATCH_SIZE}, 28×28×1, z = {NOISE_MULTIPLIER}, "
        f"C = {L2_CLIP_NORM}, SGD; jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"{torch_info}; load average {os.getloadavg()}\n")
  if torch_count is None:
    print(f"Parameters: ours {jax_count} ({torch_info})")
  else:
    print(f"Parameters: ours {jax_count}, PyTorch {torch_count}: "
          + ("equal" if jax_count == torch_count else "DIFFERENT (architectures differ)"))
  start = time.perf_counter()
  times = time_interleaved(steps, warmup, repeats)
  print(f"\n{warmup} warm-up calls each, then {repeats} interleaved rounds "
        f"({time.perf_counter() - start:.0f} s incl. compilation)\n")
  print("| step | min s | median s | max s | steps/s (median) |\n|---|---|---|---|---|")
  for name, t in times.items():
    print(f"| {name} | {min(t):.3f} | {statistics.median(t):.3f} | {max(t):.3f} | "
          f"{1 / statistics.median(t):.2f} |")
  median = {name: statistics.median(t) for name, t in times.items()}
  ours = median["ours DP-SGD"]
  print()
  for name in ("jax-privacy DP-SGD", "Opacus DP-SGD (CPU)"):
    if name in median:
      print(f"- throughput ours / {name}: {median[name] / ours:.2f}× (ratio of median times)")
  print(f"- DPDFD direct vs our DP-SGD: {ours / median['ours DPDFD direct']:.2f}× faster "
        "(goal ≥ 3×)")
  print(f"- our DP-SGD / non-private batch grad: {ours / median[PLAIN]:.2f}× (the most any "
        "step without per-example parameter gradients can gain over DP-SGD)")
  print(f"load average after: {os.getloadavg()}")


def main() -> None:
  _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parent))
  import protocol  # pylint: disable=g-import-not-at-top  (sibling script)
  protocol.guard_script()  # speed is only measured on an idle machine
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--skip_epsilon", action="store_true")
  parser.add_argument("--skip_throughput", action="store_true")
  parser.add_argument("--model", default="lenet5", choices=("lenet5", "small_cnn"),
                      help="Opacus runs only for lenet5")
  args = parser.parse_args()
  print(f"load average before: {os.getloadavg()}")
  if not args.skip_epsilon:
    start = time.perf_counter()
    epsilon_table()
    print(f"\n(ε grid: {time.perf_counter() - start:.0f} s)")
  if not args.skip_throughput:
    throughput_table(args.warmup, args.repeats, args.model)


if __name__ == "__main__":
  main()
