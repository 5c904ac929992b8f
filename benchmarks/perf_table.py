"""The performance table: every speed ratio measured side by side in one run, twice.

    nice -n 5 env PYTHONPATH=. python benchmarks/perf_table.py \
        [--repeats=5] [--warmup=1] [--skip_scaling] [--skip_peers] [--skip_ablation] [--write]

One markdown table, one row per comparison "A vs B", with two ratio columns: every JAX step of
ours built once with the reference ops (plain jax.lax / Flax, the library's default) and once
with the opt-in CPU kernels (`dpkd_jax.kernels`; the CLIs' default on a CPU backend). All steps
are timed in interleaved rounds in one process; a ratio is median(B) / median(A) with its 95%
bootstrap interval. The process runs with the kernels' XLA CPU option (set before JAX starts),
so the two columns differ by the model-zoo ops only. The rows:

* plain train step (batch gradient + SGD) of `lenet5` and `small_cnn` (GroupNorm, B = 256,
  28×28×1): ours vs a PyTorch eager twin with the same architecture and parameter count;
* the DPDFD step vs its non-private twin (no bounding, no noise), as `benchmarks/dpdfd_step.py`,
  and ours vs its PyTorch eager twin (`benchmarks/peers_dpdfd.py`: same models and step);
* the non-private batch gradient vs our DP-SGD step with vmap and with ghost clipping
  (`--clipping=ghost`), lenet5 and small_cnn: the cost of per-example clipping;
* DPDFD direct mode vs our DP-SGD, and our DP-SGD (vmap and ghost) vs jax-privacy and Opacus, from
  `benchmarks/peers_dpsgd.py`'s own step builders (not duplicated here);
* scaling of the DPDFD step with batch size, generator width and image size;
* then "which kernel pays": each step with all CPU kernels vs all but one (that op back to the
  reference), for every kernel the step uses; a kernel must make some step >= 5% faster.

FLOPs are XLA's `cost_analysis` of the reference-ops step (XLA does not count the products inside
the kernels' `lax.platform_dependent` branches), with the achieved FLOP/s of each column against
a 2048×2048 float32 matmul peak measured in the same run. PyTorch, jax-privacy or Opacus
missing: their cells print "n/a".

`--write` replaces the section between `<!-- perf-table:begin -->` and `<!-- perf-table:end -->`
in docs/PERFORMANCE.md and writes the record docs/results/benchmarks/perf_table__cpu.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import performance_doc  # noqa: E402  (renders docs/PERFORMANCE.md's tables from records)
import peers_dpsgd  # noqa: E402  (a sibling benchmark script: its step builders are reused)
import protocol  # noqa: E402  (idle check, peak check, repeat until the intervals are tight)

from dpkd_jax import models  # noqa: E402
from dpkd_jax.methods import dpdfd  # noqa: E402
from dpkd_jax.methods.dpdfd import step as dpdfd_step  # noqa: E402
from dpkd_jax import kernels  # noqa: E402
from dpkd_jax.kernels import reference  # noqa: E402
from dpkd_jax.kernels.xla_cpu import flags as xla_flags  # noqa: E402
from dpkd_jax.models import core  # noqa: E402
from dpkd_jax.privacy import mechanisms  # noqa: E402
from dpkd_jax.train.state import TrainState  # noqa: E402

# The CPU kernels' XLA option for the whole process (both columns), set before JAX starts its
# backend, as `kernels.use_cpu_kernels()` and the commands set it on a CPU backend.
XLA_OPTION_ADDED = xla_flags.apply_defaults()

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
RECORD = DOC.parent / "results" / "benchmarks" / "perf_table__cpu.json"
TRAIN_BATCH = 256
LEARNING_RATE = 0.1
# DPDFD base configuration of the scaling rows (and of the private-vs-twin row).
DPDFD_BASE = dict(batch_size=64, generator_channels=64, image_shape=(28, 28, 1))
# (label, changes to the base): twice the batch, twice the generator width, 32×32×3 images.
DPDFD_SCALING = (("B 128 vs 64", dict(batch_size=128)),
                 ("generator width 128 vs 64", dict(generator_channels=128)),
                 ("image 32×32×3 vs 28×28×1", dict(image_shape=(32, 32, 3))))

Step = Callable[[int], None]


class Timed:
  """A step to time: `call(i)` blocks until done; `flops` per call from XLA, or None; `memory`:
  the bytes XLA allocates for one call (`peers_dpsgd.compiled_memory`), or None."""

  def __init__(self, call: Step, flops: float | None = None, memory: float | None = None):
    self.call, self.flops, self.memory = call, flops, memory


# The two columns: the library's default ops, and the opt-in CPU kernels.
COLUMNS = {"reference ops": kernels.REFERENCE, "CPU kernels": kernels.xla_cpu_ops()}
# The kernels "which kernel pays" takes out one at a time: name -> the Ops fields they fill.
KERNEL_FIELDS = {
    "fast_conv (GEMM / banded convolution passes)": ("conv_general_dilated",),
    "fused norm → ReLU → pool (fast_norm_pool, fast_batch_norm_pool)": (
        "norm_relu_max_pool", "tapped_group_norm_relu_max_pool"),
    "upsample_conv (sub-pixel upsampling convolution)": ("upsample_conv",),
}


def without(ops: kernels.Ops, fields: tuple[str, ...]) -> kernels.Ops:
  """`ops` with `fields` back to the reference implementation."""
  return dataclasses.replace(ops, name=f"{ops.name}-{'-'.join(fields)}",
                             **{f: getattr(reference, f) for f in fields})


def built_with(ops: kernels.Ops, build: Callable, *args, **kwargs):
  """`build(*args, **kwargs)` with `ops` active, and every step call it returns (a Timed, a
  callable, or a dict of them) wrapped so that it traces and runs with `ops` too."""
  with kernels.using(ops):
    built = build(*args, **kwargs)

  def wrap(item):
    if isinstance(item, Timed):
      return Timed(wrap(item.call), item.flops, item.memory)
    if callable(item):
      def call(i: int) -> None:
        with kernels.using(ops):
          item(i)
      call.memory = getattr(item, "memory", None)
      return call
    return item
  if isinstance(built, dict):
    return {name: wrap(item) for name, item in built.items()}
  if isinstance(built, tuple):
    return tuple(wrap(item) for item in built)
  return wrap(built)


def compiled_flops(fn: Callable, *args) -> float | None:
  """XLA's FLOP count of `fn` (un-jitted) on `args`; None where the backend reports none.

  XLA's cost analysis does not count the matrix products inside the CPU kernels'
  `lax.platform_dependent` branches (the GEMM kernel gradient, the banded forms). `fn` is
  therefore traced here with the reference ops: the same function, counted at the direct
  convolutions' FLOPs (the banded form does more, on zeros).
  """
  try:
    with kernels.using(kernels.REFERENCE):
      # A fresh function: `jax.jit(fn)` would reuse the trace cached for the timed step.
      analysis = jax.jit(lambda *a: fn(*a)).lower(*args).compile().cost_analysis()
  except Exception:  # pylint: disable=broad-except  (a missing figure is reported as n/a)
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  flops = (analysis or {}).get("flops")
  return float(flops) if flops is not None and flops >= 0 else None


def peak_flops(repeats: int, size: int = 2048) -> float:
  """Best FLOP/s of a size×size float32 matmul: the machine's practical peak."""
  a = jax.random.normal(jax.random.key(0), (size, size))
  b = jax.random.normal(jax.random.key(1), (size, size))
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))
  best = float("inf")
  for _ in range(max(3, repeats)):
    start = time.perf_counter()
    jax.block_until_ready(matmul(a, b))
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best


# Set by main(): the most interleaved rounds a group of rows may take to get tight intervals.
MAX_ROUNDS = 30
NOT_TIGHT: list[str] = []  # groups whose intervals stayed wide after MAX_ROUNDS


def time_interleaved(steps: dict[str, Timed], warmup: int, repeats: int,
                     pairs: list[tuple[str, str]]) -> dict[str, list[float]]:
  """Warms every step up, then times them in interleaved rounds (seconds per call): at least
  `repeats` rounds, more until every (A, B) ratio's 95% interval is within 5% (protocol)."""
  pairs = [(a, b) for a, b in pairs if a in steps and b in steps]
  times, tight = protocol.time_until_tight(
      {name: step.call for name, step in steps.items()}, pairs, warmup=warmup,
      min_rounds=repeats, max_rounds=max(repeats, MAX_ROUNDS))
  if not tight:
    NOT_TIGHT.append(", ".join(f"{b}/{a}" for a, b in pairs))
  return times


def jax_train_step(model: str, images: jax.Array, labels: jax.Array) -> tuple[Timed, int]:
  """Ours: jitted batch gradient of the cross-entropy + SGD update, GroupNorm `model`."""
  parts = core.split(models.create_classifier(model, num_classes=10, input_shape=(28, 28, 1),
                                              norm="group", rngs=nnx.Rngs(jax.random.key(0))))
  tx = optax.sgd(LEARNING_RATE)

  def step_fn(params, opt_state, x, y):
    def loss(p):
      out, _ = core.apply(parts.graphdef, p, parts.batch_stats, x, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(out.logits, y).mean()
    updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  step = jax.jit(step_fn)

  holder = {"state": (parts.params, tx.init(parts.params))}

  def call(i: int) -> None:
    del i  # no randomness
    holder["state"] = jax.block_until_ready(step(*holder["state"], images, labels))

  call(0)  # traced now, with the ops the caller made active
  flops = compiled_flops(step_fn, *holder["state"], images, labels)
  memory = peers_dpsgd.compiled_memory(step_fn, *holder["state"], images, labels)
  return Timed(call, flops, memory), models.count_params(parts.params)


def torch_train_step(model: str, images: jax.Array, labels: jax.Array) -> tuple[Timed, int]:
  """The PyTorch eager twin of `jax_train_step` (NCHW). Raises ImportError without torch."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)  # benchmark only: a reproducible initialisation
  if model == "lenet5":  # classifiers.LeNet5, norm="group": as peers_dpsgd.opacus_step
    net = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2, bias=False), nn.GroupNorm(6, 6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, bias=False), nn.GroupNorm(16, 16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))
  else:  # classifiers.SmallCNN, norm="group": SAME 3×3 convs, 16 groups (group_count)
    net = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.GroupNorm(16, 32), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.GroupNorm(16, 64),
        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(7 * 7 * 64, 128), nn.ReLU(),
        nn.Linear(128, 10))
  optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
  x = torch.from_numpy(np.asarray(images).transpose(0, 3, 1, 2).copy())
  y = torch.from_numpy(np.asarray(labels).astype(np.int64))
  loss_fn = nn.CrossEntropyLoss()

  def call(i: int) -> None:
    del i
    optimizer.zero_grad(set_to_none=True)
    loss_fn(net(x), y).backward()
    optimizer.step()

  return Timed(call), sum(p.numel() for p in net.parameters())


def dpdfd_steps(batch_size: int, generator_channels: int, image_shape: tuple[int, int, int],
                twin: bool = False) -> dict[str, Timed]:
  """The jitted DPDFD step (student `datalens_cnn`, teacher `small_cnn`, DAFL generator), and
  with `twin` also its non-private twin (raw mean of the output gradients, no noise)."""
  key_s, key_g, key_t = jax.random.split(jax.random.key(0), 3)
  student = models.create_classifier("datalens_cnn", num_classes=10, input_shape=image_shape,
                                     rngs=nnx.Rngs(key_s))
  generator = models.create_generator("dafl", latent_dim=100, image_shape=image_shape,
                                      rngs=nnx.Rngs(key_g), base_channels=generator_channels)
  teacher = core.split(models.create_classifier("small_cnn", num_classes=10,
                                                input_shape=image_shape, rngs=nnx.Rngs(key_t)))
  tx = optax.adam(1e-3)
  state = dpdfd_step.DPDFDState(TrainState.create(core.split(student), tx),
                                TrainState.create(core.split(generator), tx))
  ensemble = dpdfd_step.TeacherEnsemble.stack([teacher])
  # The step reads no dataset field (the shapes come from the networks above).
  config = dpdfd.DPDFDConfig(dataset="mnist", teacher_dirs=("unused",), noise_multiplier=1.0,
                             batch_size=batch_size)
  plan = dpdfd.make_plan(config)
  keys = jax.random.split(jax.random.key(1), 2)

  def timed(step_fn: Callable, key: jax.Array) -> Timed:
    step = jax.jit(step_fn)

    # The state is not donated: every call starts from the same state (a fixed workload).
    def call(i: int) -> None:
      jax.block_until_ready(step(state, ensemble.params, ensemble.batch_stats,
                                 jax.random.fold_in(key, i)))
    call(0)  # traced here, inside any patch the caller holds
    args = (state, ensemble.params, ensemble.batch_stats, key)
    return Timed(call, compiled_flops(step_fn, *args), peers_dpsgd.compiled_memory(step_fn, *args))

  steps = {"private": timed(dpdfd_step.build_train_step(plan, config, ensemble.graphdef), keys[0])}
  if twin:
    # As benchmarks/dpdfd_step.py: the mechanism swapped for the raw mean, while tracing.
    original = dpdfd_step.private_output_gradients
    dpdfd_step.private_output_gradients = lambda plan, key, g: mechanisms.GaussianRelease(
        g.mean(0), jnp.zeros(()), jnp.ones(()))
    try:
      steps["twin"] = timed(dpdfd_step.build_train_step(plan, config, ensemble.graphdef), keys[1])
    finally:
      dpdfd_step.private_output_gradients = original
  return steps


def _median(times: list[float] | None) -> str:
  return "n/a" if not times else f"{statistics.median(times):.4f}"


def _gflops(step: Timed | None) -> float | None:
  return None if step is None or step.flops is None else step.flops / 1e9


def _name(steps: dict[str, Timed], name: str, column: str) -> str:
  """The step `name` of `column` ("ours|CPU kernels"), or `name` itself (a peer's step)."""
  return f"{name}|{column}" if f"{name}|{column}" in steps else name


class Table:
  """Rows "A vs B": per column (reference ops, CPU kernels) the ratio median(B) / median(A)
  with its 95% interval, both medians, A's FLOPs and FLOP/s, and XLA's memory of A."""

  def __init__(self, peak: float):
    self.peak, self.rows, self.records = peak, [], []

  def add(self, label: str, a_base: str, b_base: str, steps: dict[str, Timed],
          times: dict[str, list[float]], columns: tuple[str, ...] = tuple(COLUMNS)) -> None:
    record = {"comparison": label, "columns": {}}
    ratios, a_medians, b_medians, rates, memory = [], [], [], [], []
    for column in COLUMNS:
      a_name, b_name = _name(steps, a_base, column), _name(steps, b_base, column)
      a, b = times.get(a_name), times.get(b_name)
      if column not in columns or not (a and b):
        ratios.append("–" if column not in columns else "n/a")
        continue
      median, low, high = protocol.ratio_interval(a, b)
      ratios.append(f"{median:.2f}× [{low:.2f}, {high:.2f}]")
      a_medians.append(_median(a))
      b_medians.append(_median(b))
      step = steps.get(a_name)
      flops = _gflops(step)
      rate = None if flops is None else flops / statistics.median(a)
      rates.append("n/a" if rate is None else f"{rate:.1f} ({rate * 1e9 / self.peak:.0%})")
      mib = None if step is None or step.memory is None else step.memory / 2 ** 20
      memory.append("n/a" if mib is None else f"{mib:,.1f}")
      record["columns"][column] = {
          "ratio": median, "interval": [low, high], "a_median_s": statistics.median(a),
          "b_median_s": statistics.median(b), "a_gflop": flops, "a_memory_mib": mib}
    flops = next((_gflops(steps.get(_name(steps, a_base, c))) for c in COLUMNS), None)
    self.rows.append(
        f"| {label} | {' | '.join(ratios)} | {' / '.join(a_medians) or 'n/a'} | "
        f"{' / '.join(b_medians) or 'n/a'} | "
        f"{'n/a' if flops is None else f'{flops:.2f}'}; {' / '.join(rates) or 'n/a'} | "
        f"{' / '.join(memory) or 'n/a'} |")
    self.records.append(record)
    print(self.rows[-1], flush=True)

  def markdown(self) -> str:
    header = ("| comparison: A vs B | B / A, reference ops [95% interval] "
              "| B / A, CPU kernels [95% interval] | A median s, reference / kernels "
              "| B median s, reference / kernels | A GFLOP/step; GFLOP/s (% of peak), "
              "reference / kernels | XLA MiB per step of A, reference / kernels |\n"
              "|---|---|---|---|---|---|---|")
    return "\n".join([header, *self.rows])


def both(build: Callable, *args, **kwargs) -> dict[str, object]:
  """`build`'s result per column: {column: built with that column's ops}."""
  return {column: built_with(ops, build, *args, **kwargs) for column, ops in COLUMNS.items()}


def train_rows(table: Table, warmup: int, repeats: int) -> None:
  """Plain train steps: ours (both columns) vs PyTorch eager, and the kernels' own gain."""
  data_key, label_key = jax.random.split(jax.random.key(2))
  images = jax.random.normal(data_key, (TRAIN_BATCH, 28, 28, 1))
  labels = jax.random.randint(label_key, (TRAIN_BATCH,), 0, 10)
  for model in ("lenet5", "small_cnn"):
    steps = {}
    for column, (timed, ours_count) in both(jax_train_step, model, images, labels).items():
      steps[f"ours|{column}"] = timed
    torch_note = "torch n/a"
    try:
      steps["torch"], torch_count = torch_train_step(model, images, labels)
      import torch  # pylint: disable=g-import-not-at-top
      if torch_count != ours_count:
        raise AssertionError(f"{model}: {ours_count} JAX vs {torch_count} PyTorch parameters")
      torch_note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    except ImportError:
      pass
    pairs = [(f"ours|{c}", "torch") for c in COLUMNS]
    pairs += [("ours|CPU kernels", "ours|reference ops")]
    times = time_interleaved(steps, warmup, repeats, pairs)
    label = f"train step {model} (GroupNorm, B={TRAIN_BATCH}, {ours_count:,} params)"
    table.add(f"{label}: ours vs PyTorch eager ({torch_note})", "ours", "torch", steps, times)
    kernel_gain(table, label, steps, times)


def kernel_gain(table: Table, label: str, steps: dict[str, Timed], times, base: str = "ours"):
  """The row "CPU kernels vs reference ops" of one step (its ratio in the kernels column)."""
  steps = {**steps, "kernels": steps[f"{base}|CPU kernels"],
           "reference": steps[f"{base}|reference ops"]}
  times = {**times, "kernels": times.get(f"{base}|CPU kernels"),
           "reference": times.get(f"{base}|reference ops")}
  table.add(f"{label}: CPU kernels vs reference ops", "kernels", "reference", steps, times,
            columns=("CPU kernels",))


def dpdfd_rows(table: Table, warmup: int, repeats: int, scaling: bool) -> None:
  """DPDFD step vs its non-private twin and its PyTorch eager twin, then the scaling rows."""
  steps = {}
  for column, built in both(dpdfd_steps, **DPDFD_BASE, twin=True).items():
    steps[f"base private|{column}"], steps[f"base twin|{column}"] = (built["private"],
                                                                     built["twin"])
  torch_note = "torch n/a"
  try:
    import peers_dpdfd  # pylint: disable=g-import-not-at-top  (sibling script; needs torch)
    torch_step = peers_dpdfd.build_torch_dpdfd_step(**DPDFD_BASE)  # parameter counts checked
    steps["torch"], torch_note = Timed(lambda i: torch_step()), peers_dpdfd.torch_info()
  except ImportError:
    pass
  if scaling:
    for label, change in DPDFD_SCALING:
      for column, built in both(dpdfd_steps, **{**DPDFD_BASE, **change}).items():
        steps[f"{label}|{column}"] = built["private"]
  pairs = []
  for column in COLUMNS:
    pairs += [(f"base twin|{column}", f"base private|{column}"),
              (f"base private|{column}", "torch")]
    pairs += [(f"base private|{column}", f"{label}|{column}")
              for label, _ in DPDFD_SCALING if scaling]
  pairs += [("base private|CPU kernels", "base private|reference ops")]
  times = time_interleaved(steps, warmup, repeats, pairs)
  base_label = (f"DPDFD step (B={DPDFD_BASE['batch_size']}, "
                f"DAFL w{DPDFD_BASE['generator_channels']}, 28×28×1, datalens_cnn student, "
                f"small_cnn teacher)")
  table.add(f"{base_label}: non-private twin vs private", "base twin", "base private", steps,
            times)
  table.add(f"{base_label}: ours vs PyTorch eager twin ({torch_note})", "base private", "torch",
            steps, times)
  kernel_gain(table, base_label, steps, times, base="base private")
  for label, _ in DPDFD_SCALING if scaling else ():
    table.add(f"DPDFD step scaling, {label}: base vs changed", "base private", label, steps, times)


def _dpsgd_batch(batch: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(model key, (B, 28, 28, 1) uint8 images, (B,) labels): the fixed workload of the rows."""
  data_key, model_key = jax.random.split(jax.random.key(0))
  image_key, label_key = jax.random.split(data_key)
  images_uint8 = jax.random.randint(image_key, (batch, 28, 28, 1), 0, 256).astype(jnp.uint8)
  labels = jax.random.randint(label_key, (batch,), 0, 10, dtype=jnp.int32)
  return model_key, images_uint8, labels


def _jax_steps(images_uint8, labels, model_key, model) -> dict[str, Timed]:
  """peers_dpsgd's steps of `model`, per column ("<name>|<column>"); jax-privacy's step is
  built once, with the reference ops (it is not ours)."""
  steps = {}
  for column, (calls, _) in both(peers_dpsgd.jax_steps, images_uint8, labels, model_key,
                                 model).items():
    for name, call in calls.items():
      if name != "jax-privacy DP-SGD" or column == "reference ops":
        name = name if name == "jax-privacy DP-SGD" else f"{name}|{column}"
        steps[name] = Timed(call, memory=getattr(call, "memory", None))
  return steps


def clipping_rows(table: Table, warmup: int, repeats: int) -> None:
  """The cost of privacy in a DP-SGD step: per-example clipping by vmap or by ghost clipping
  against the non-private batch gradient (the goal: DP-SGD / non-private <= 1.5x)."""
  batch = peers_dpsgd.BATCH_SIZE
  model_key, images_uint8, labels = _dpsgd_batch(batch)
  plain, vmap, ghost = peers_dpsgd.PLAIN, "ours DP-SGD", peers_dpsgd.GHOST
  for model in ("lenet5", "small_cnn"):
    steps = _jax_steps(images_uint8, labels, model_key, model)
    pairs = [(f"{plain}|{c}", f"{other}|{c}") for c in COLUMNS for other in (vmap, ghost)]
    pairs += [(f"{ghost}|CPU kernels", f"{ghost}|reference ops")]
    times = time_interleaved(steps, warmup, repeats, pairs)
    label = f"{model} (GroupNorm, B={batch})"
    table.add(f"{label}: non-private step vs DP-SGD, vmap clipping", plain, vmap, steps, times)
    table.add(f"{label}: non-private step vs DP-SGD, ghost clipping", plain, ghost, steps, times)
    kernel_gain(table, f"{label}, DP-SGD ghost clipping", steps, times, base=ghost)


def peer_rows(table: Table, warmup: int, repeats: int) -> None:
  """DP-SGD vs jax-privacy / Opacus and DPDFD direct vs DP-SGD (peers_dpsgd's builders)."""
  batch = peers_dpsgd.BATCH_SIZE
  model_key, images_uint8, labels = _dpsgd_batch(batch)
  steps = _jax_steps(images_uint8, labels, model_key, "lenet5")
  try:
    steps["Opacus DP-SGD (CPU)"] = Timed(peers_dpsgd.opacus_step(images_uint8, labels)[0])
  except ImportError:
    pass
  ghost, opacus, ours = peers_dpsgd.GHOST, "Opacus DP-SGD (CPU)", "ours DP-SGD"
  pairs = []
  for c in COLUMNS:
    pairs += [(f"ours DPDFD direct|{c}", f"{ours}|{c}"), (f"{ours}|{c}", "jax-privacy DP-SGD"),
              (f"{ours}|{c}", opacus), (f"{ghost}|{c}", opacus)]
  times = time_interleaved(steps, warmup, repeats, pairs)
  label = f"lenet5 (GroupNorm, B={batch})"
  table.add(f"{label}: our DP-SGD (ghost clipping) vs Opacus DP-SGD", ghost, opacus, steps, times)
  table.add(f"{label}: DPDFD direct vs our DP-SGD", "ours DPDFD direct", ours, steps, times)
  table.add(f"{label}: our DP-SGD vs jax-privacy DP-SGD", ours, "jax-privacy DP-SGD", steps,
            times)
  table.add(f"{label}: our DP-SGD vs Opacus DP-SGD", ours, opacus, steps, times)


def ablation_rows(table: Table, warmup: int, repeats: int) -> None:
  """Which kernel pays: each step with every CPU kernel vs with all but one (ratio B / A > 1:
  the kernel taken out made the step faster)."""
  data_key, label_key = jax.random.split(jax.random.key(2))
  images = jax.random.normal(data_key, (TRAIN_BATCH, 28, 28, 1))
  labels = jax.random.randint(label_key, (TRAIN_BATCH,), 0, 10)
  model_key, images_uint8, dpsgd_labels = _dpsgd_batch(peers_dpsgd.BATCH_SIZE)

  def ghost(model):
    calls, _ = peers_dpsgd.jax_steps(images_uint8, dpsgd_labels, model_key, model)
    return Timed(calls[peers_dpsgd.GHOST])

  builders = {
      f"train step lenet5 (B={TRAIN_BATCH})": lambda: jax_train_step("lenet5", images, labels)[0],
      f"train step small_cnn (B={TRAIN_BATCH})": lambda: jax_train_step("small_cnn", images,
                                                                        labels)[0],
      f"DPDFD step (B={DPDFD_BASE['batch_size']})": lambda: dpdfd_steps(**DPDFD_BASE)["private"],
      f"DP-SGD ghost lenet5 (B={peers_dpsgd.BATCH_SIZE})": lambda: ghost("lenet5"),
      f"DP-SGD ghost small_cnn (B={peers_dpsgd.BATCH_SIZE})": lambda: ghost("small_cnn"),
  }
  full = COLUMNS["CPU kernels"]
  for label, build in builders.items():
    # Only the DPDFD step has a generator (the one user of the upsampling convolution).
    used = [k for k in KERNEL_FIELDS if "DPDFD" in label or not k.startswith("upsample_conv")]
    steps = {"all": built_with(full, build)}
    steps.update({kernel: built_with(without(full, KERNEL_FIELDS[kernel]), build)
                  for kernel in used})
    times = time_interleaved(steps, warmup, repeats, [("all", k) for k in used])
    for kernel in used:
      table.add(f"{label}: every CPU kernel vs without {kernel}", "all", kernel, steps, times,
                columns=("CPU kernels",))


def write_record(conditions_line: str, header: str, tables: dict[str, Table], markdown: str,
                 path: pathlib.Path = RECORD) -> None:
  """The table's figures as a record (docs/results/benchmarks/), with the markdown section
  `benchmarks/performance_doc.py` renders from it."""
  payload = {"benchmark": "benchmarks/perf_table.py", "date": str(datetime.date.today()),
             "jax": jax.__version__, "machine": protocol.machine_id(),
             "xla_flags": os.environ.get("XLA_FLAGS", ""), "conditions": conditions_line,
             "header": header, "commit": _commit(),
             "tables": {name: t.records for name, t in tables.items()}, "markdown": markdown}
  path.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")


def _commit() -> str | None:
  try:
    import subprocess  # pylint: disable=g-import-not-at-top
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True, cwd=DOC.parent).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=1)
  parser.add_argument("--skip_scaling", action="store_true")
  parser.add_argument("--skip_peers", action="store_true")
  parser.add_argument("--skip_ablation", action="store_true")
  parser.add_argument("--max_rounds", type=int, default=30,
                      help="most interleaved rounds per group while the intervals are wide")
  parser.add_argument("--idle_wait", type=float, default=0.0,
                      help="seconds to wait for the load average to fall below the threshold")
  parser.add_argument("--allow_busy", action="store_true",
                      help="run on a busy machine anyway: the table is marked INVALID, never written")
  parser.add_argument("--write", action="store_true",
                      help=f"write {RECORD.name} and the table of {DOC.name} rendered from it")
  args = parser.parse_args()
  if args.repeats < 1 or args.warmup < 0:
    raise ValueError(f"need repeats >= 1 and warmup >= 0, got {args.repeats}, {args.warmup}")
  global MAX_ROUNDS
  MAX_ROUNDS = args.max_rounds
  start = time.perf_counter()
  conditions = protocol.start_conditions(lambda: peak_flops(args.repeats),
                                         max_wait_s=args.idle_wait, allow_busy=args.allow_busy)
  peak = conditions.peak
  print(f"peak (2048² float32 matmul, best of {max(3, args.repeats)}): {peak / 1e9:.1f} GFLOP/s",
        flush=True)
  table, pays = Table(peak), Table(peak)
  train_rows(table, args.warmup, args.repeats)
  dpdfd_rows(table, args.warmup, args.repeats, scaling=not args.skip_scaling)
  clipping_rows(table, args.warmup, args.repeats)
  if not args.skip_peers:
    peer_rows(table, args.warmup, args.repeats)
  if not args.skip_ablation:
    ablation_rows(pays, args.warmup, args.repeats)
  conditions.finish(protocol.load1(), peak_flops(args.repeats))
  wide = (f" Intervals still wider than 5% after {MAX_ROUNDS} rounds: {'; '.join(NOT_TIGHT)}."
          if NOT_TIGHT else "")
  header = (
      f"{datetime.date.today()}, jax {jax.__version__} on {jax.devices()[0].platform} "
      f"({protocol.machine_id()}), XLA_FLAGS `{os.environ.get('XLA_FLAGS', '')}` (the CPU "
      f"kernels' option, set for both columns), {args.warmup} warm-up call(s) then >= "
      f"{args.repeats} interleaved rounds per group of rows, until each ratio's 95% bootstrap "
      f"interval is within 5%; {conditions.line()}; whole run "
      f"{time.perf_counter() - start:.0f} s.{wide}")
  text = f"{header}\n\n{table.markdown()}"
  if pays.rows:
    text += ("\n\nWhich kernel pays (B / A > 1.05: the kernel makes that step at least 5% "
             f"faster):\n\n{pays.markdown()}")
  print(f"\n{text}")
  if args.write and not conditions.valid:
    raise protocol.MachineBusy("not writing an invalid table to the docs (see the conditions)")
  if args.write:
    write_record(conditions.line(), header, {"comparisons": table, "which_kernel_pays": pays},
                 text)
    DOC.write_text(performance_doc.render(DOC.read_text()))  # the section, from the record
    print(f"\nwritten to {DOC} and {RECORD}")


if __name__ == "__main__":
  main()
