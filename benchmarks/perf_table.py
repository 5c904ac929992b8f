"""Issue #10's performance table: every speed ratio measured side by side in one run.

    nice -n 5 env PYTHONPATH=. /work/venv_peers/bin/python benchmarks/perf_table.py \
        [--repeats=5] [--warmup=1] [--skip_scaling] [--skip_peers] [--write]

One markdown table, one row per comparison "A vs B". Both sides are timed in interleaved rounds
(min / median / max seconds over `--repeats`), and the ratio is median(B) / median(A). The rows:

* plain train step (batch gradient + SGD) of `lenet5` and `small_cnn` (GroupNorm, B = 256,
  28×28×1): ours vs a PyTorch eager twin with the same architecture and parameter count. Also
  ours vs ours with the layers before `fast_pool` / `fast_norm` (`nnx.max_pool`,
  `nnx.GroupNorm`): the effect of this change;
* the DPDFD step vs its non-private twin (no bounding, no noise), as `benchmarks/dpdfd_step.py`,
  and ours vs its PyTorch eager twin (`benchmarks/peers_dpdfd.py`: same models and step);
* the non-private batch gradient vs our DP-SGD step with vmap and with ghost clipping
  (`--clipping=ghost`), lenet5 and small_cnn: the cost of per-example clipping;
* DPDFD direct mode vs our DP-SGD, and our DP-SGD (vmap and ghost) vs jax-privacy and Opacus, from
  `benchmarks/peers_dpsgd.py`'s own step builders (not duplicated here);
* scaling of the DPDFD step with batch size, generator width and image size, each against a base
  configuration (a ratio of 2.0 for twice the batch means linear cost; compare it with the
  ratio of the two FLOP counts).

For every JAX step built here it also reports XLA's FLOP count (`cost_analysis` of the compiled
step, traced with XLA's own convolution kernel gradients, which XLA counts, unlike `fast_conv`'s)
and the achieved FLOP/s, as a share of the machine's peak. The peer steps come as
closures from `peers_dpsgd`, so their FLOPs are n/a. The peak is measured as the best FLOP/s of
a 2048×2048 float32 matmul. PyTorch, jax-privacy or Opacus missing: their cells print "n/a".

`--write` also replaces the section between `<!-- perf-table:begin -->` and
`<!-- perf-table:end -->` in docs/PERFORMANCE.md with the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peers_dpsgd  # noqa: E402  (a sibling benchmark script: its step builders are reused)
import protocol  # noqa: E402  (idle check, peak check, repeat until the intervals are tight)

from dpkd_jax import models  # noqa: E402
from dpkd_jax.methods import dpdfd  # noqa: E402
from dpkd_jax.methods.dpdfd import step as dpdfd_step  # noqa: E402
from dpkd_jax.models import classifiers, conv_routes, core, fast_conv, fast_norm  # noqa: E402
from dpkd_jax.privacy import mechanisms  # noqa: E402
from dpkd_jax.train.state import TrainState  # noqa: E402

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
BEGIN, END = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"
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


def compiled_flops(fn: Callable, *args) -> float | None:
  """XLA's FLOP count of `fn` (un-jitted) on `args`; None where the backend reports none.

  XLA's cost analysis does not count the matrix products inside `fast_conv`'s
  `lax.platform_dependent` branches (its GEMM kernel gradient, the banded forms). `fn` is
  therefore traced here with XLA's own convolutions everywhere (`fast_conv.xla_only`): the
  same convolutions, counted at their direct FLOPs (the banded form does more, on zeros).
  """
  try:
    with fast_conv.xla_only():
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


@contextlib.contextmanager
def reference_layers() -> Iterator[None]:
  """Traces models with `nnx.max_pool` and `nnx.GroupNorm` as before `fast_pool`/`fast_norm`
  (and so without `fast_norm_pool`, which fuses the two).

  Benchmark only: swaps the three module-level functions the classifiers call, and restores
  them. Steps must be traced (first called) inside the context.
  """
  pool, norm, stage = (classifiers.max_pool_2x2, fast_norm.apply_group_norm,
                       classifiers.conv_norm_relu_pool)
  classifiers.max_pool_2x2 = lambda x: nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))
  fast_norm.apply_group_norm = lambda layer, x: layer(x)
  classifiers.conv_norm_relu_pool = lambda layer, x, train: classifiers.max_pool_2x2(
      nnx.relu(layer(x, train=train)))
  try:
    yield
  finally:
    classifiers.max_pool_2x2, fast_norm.apply_group_norm = pool, norm
    classifiers.conv_norm_relu_pool = stage


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

  call(0)  # traced now, so that `reference_layers` applies when the caller uses it
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


def _cells(times: list[float] | None) -> str:
  if times is None:
    return "n/a"
  return f"{min(times):.3f} / {statistics.median(times):.3f} / {max(times):.3f}"


def _flops_cells(step: Timed | None, times: list[float] | None, peak: float) -> str:
  """"GFLOP per step, GFLOP/s (% of peak)" of one side, or n/a."""
  if step is None or step.flops is None or not times:
    return "n/a"
  rate = step.flops / statistics.median(times)
  return f"{step.flops / 1e9:.2f}, {rate / 1e9:.1f} ({rate / peak:.0%})"


def _memory_cell(step: Timed | None) -> str:
  """XLA's MiB per call of one side, or n/a."""
  if step is None or step.memory is None:
    return "n/a"
  return f"{step.memory / 2 ** 20:,.1f}"


class Table:
  """Rows "A vs B": timings of both, ratio median(B) / median(A), FLOPs and FLOP/s of both."""

  def __init__(self, peak: float):
    self.peak, self.rows = peak, []

  def add(self, label: str, a_name: str, b_name: str, steps: dict[str, Timed],
          times: dict[str, list[float]]) -> None:
    a, b = times.get(a_name), times.get(b_name)
    ratio = "n/a"
    if a and b:
      median, low, high = protocol.ratio_interval(a, b)
      ratio = f"{median:.2f}× [{low:.2f}, {high:.2f}]"
    self.rows.append(f"| {label} | {_cells(a)} | {_cells(b)} | {ratio} | "
                     f"{_flops_cells(steps.get(a_name), a, self.peak)} | "
                     f"{_flops_cells(steps.get(b_name), b, self.peak)} | "
                     f"{_memory_cell(steps.get(a_name))} / {_memory_cell(steps.get(b_name))} |")
    print(self.rows[-1], flush=True)

  def markdown(self) -> str:
    header = ("| comparison: A vs B | A s (min / median / max) | B s (min / median / max) "
              "| B / A (median) [95% interval] | A GFLOP/step, GFLOP/s (% of peak) "
              "| B GFLOP/step, GFLOP/s (% of peak) | XLA memory MiB per step, A / B |\n"
              "|---|---|---|---|---|---|---|")
    return "\n".join([header, *self.rows])


def train_rows(table: Table, warmup: int, repeats: int) -> None:
  """Plain train steps: ours vs PyTorch eager and ours vs ours before fast_pool/fast_norm."""
  data_key, label_key = jax.random.split(jax.random.key(2))
  images = jax.random.normal(data_key, (TRAIN_BATCH, 28, 28, 1))
  labels = jax.random.randint(label_key, (TRAIN_BATCH,), 0, 10)
  for model in ("lenet5", "small_cnn"):
    steps = {}
    steps["ours"], ours_count = jax_train_step(model, images, labels)
    with reference_layers():
      steps["before"], _ = jax_train_step(model, images, labels)
    with conv_routes.forced_mode("static"):
      steps["static"], _ = jax_train_step(model, images, labels)
    torch_note = "torch n/a"
    try:
      steps["torch"], torch_count = torch_train_step(model, images, labels)
      import torch  # pylint: disable=g-import-not-at-top
      if torch_count != ours_count:
        raise AssertionError(f"{model}: {ours_count} JAX vs {torch_count} PyTorch parameters")
      torch_note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    except ImportError:
      pass
    times = time_interleaved(steps, warmup, repeats,
                             [("ours", "torch"), ("ours", "before"), ("ours", "static")])
    label = f"train step {model} (GroupNorm, B={TRAIN_BATCH}, {ours_count:,} params)"
    table.add(f"{label}: ours vs PyTorch eager ({torch_note})", "ours", "torch", steps, times)
    table.add(f"{label}: ours vs ours with nnx.max_pool + nnx.GroupNorm", "ours", "before",
              steps, times)
    table.add(f"{label}: ours vs ours with the static convolution rule", "ours", "static",
              steps, times)


def dpdfd_rows(table: Table, warmup: int, repeats: int, scaling: bool) -> None:
  """DPDFD step vs its non-private twin and its PyTorch eager twin, then the scaling rows."""
  base = dpdfd_steps(**DPDFD_BASE, twin=True)
  with conv_routes.forced_mode("static"):
    static = dpdfd_steps(**DPDFD_BASE)["private"]
  steps = {"base private": base["private"], "base twin": base["twin"], "static": static}
  torch_note = "torch n/a"
  try:
    import peers_dpdfd  # pylint: disable=g-import-not-at-top  (sibling script; needs torch)
    torch_step = peers_dpdfd.build_torch_dpdfd_step(**DPDFD_BASE)  # parameter counts checked
    steps["torch"], torch_note = Timed(lambda i: torch_step()), peers_dpdfd.torch_info()
  except ImportError:
    pass
  if scaling:
    for label, change in DPDFD_SCALING:
      steps[label] = dpdfd_steps(**{**DPDFD_BASE, **change})["private"]
  pairs = [("base twin", "base private"), ("base private", "torch"), ("base private", "static")]
  pairs += [("base private", label) for label, _ in DPDFD_SCALING if scaling]
  times = time_interleaved(steps, warmup, repeats, pairs)
  base_label = (f"DPDFD step (B={DPDFD_BASE['batch_size']}, "
                f"DAFL w{DPDFD_BASE['generator_channels']}, 28×28×1, datalens_cnn student, "
                f"small_cnn teacher)")
  table.add(f"{base_label}: non-private twin vs private", "base twin", "base private", steps,
            times)
  table.add(f"{base_label}: ours vs PyTorch eager twin ({torch_note})", "base private", "torch",
            steps, times)
  table.add(f"{base_label}: ours vs ours with the static convolution rule", "base private",
            "static", steps, times)
  for label, _ in DPDFD_SCALING if scaling else ():
    table.add(f"DPDFD step scaling, {label}: base vs changed", "base private", label, steps, times)


def _dpsgd_batch(batch: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(model key, (B, 28, 28, 1) uint8 images, (B,) labels): the fixed workload of the rows."""
  data_key, model_key = jax.random.split(jax.random.key(0))
  image_key, label_key = jax.random.split(data_key)
  images_uint8 = jax.random.randint(image_key, (batch, 28, 28, 1), 0, 256).astype(jnp.uint8)
  labels = jax.random.randint(label_key, (batch,), 0, 10, dtype=jnp.int32)
  return model_key, images_uint8, labels


def clipping_rows(table: Table, warmup: int, repeats: int) -> None:
  """The cost of privacy in a DP-SGD step: per-example clipping by vmap or by ghost clipping
  against the non-private batch gradient (the goal: DP-SGD / non-private <= 1.3x)."""
  batch = peers_dpsgd.BATCH_SIZE
  model_key, images_uint8, labels = _dpsgd_batch(batch)
  plain, vmap, ghost = peers_dpsgd.PLAIN, "ours DP-SGD", peers_dpsgd.GHOST
  for model in ("lenet5", "small_cnn"):
    calls, _ = peers_dpsgd.jax_steps(images_uint8, labels, model_key, model)
    steps = {name: Timed(calls[name], memory=calls[name].memory) for name in (plain, vmap, ghost)}
    times = time_interleaved(steps, warmup, repeats, [(plain, vmap), (plain, ghost)])
    label = f"{model} (GroupNorm, B={batch})"
    table.add(f"{label}: non-private step vs DP-SGD, vmap clipping", plain, vmap, steps, times)
    table.add(f"{label}: non-private step vs DP-SGD, ghost clipping", plain, ghost, steps, times)


def peer_rows(table: Table, warmup: int, repeats: int) -> None:
  """DP-SGD vs jax-privacy / Opacus and DPDFD direct vs DP-SGD (peers_dpsgd's builders)."""
  batch = peers_dpsgd.BATCH_SIZE
  model_key, images_uint8, labels = _dpsgd_batch(batch)
  calls, _ = peers_dpsgd.jax_steps(images_uint8, labels, model_key, "lenet5")
  steps = {name: Timed(call, memory=getattr(call, "memory", None))
           for name, call in calls.items()}
  try:
    steps["Opacus DP-SGD (CPU)"] = Timed(peers_dpsgd.opacus_step(images_uint8, labels)[0])
  except ImportError:
    pass
  ghost = peers_dpsgd.GHOST
  times = time_interleaved(steps, warmup, repeats, [
      ("ours DPDFD direct", "ours DP-SGD"), ("ours DP-SGD", "jax-privacy DP-SGD"),
      ("ours DP-SGD", "Opacus DP-SGD (CPU)"), (ghost, "Opacus DP-SGD (CPU)")])
  label = f"lenet5 (GroupNorm, B={batch})"
  table.add(f"{label}: our DP-SGD (ghost clipping) vs Opacus DP-SGD", ghost,
            "Opacus DP-SGD (CPU)", steps, times)
  table.add(f"{label}: DPDFD direct vs our DP-SGD", "ours DPDFD direct", "ours DP-SGD", steps,
            times)
  table.add(f"{label}: our DP-SGD vs jax-privacy DP-SGD", "ours DP-SGD", "jax-privacy DP-SGD",
            steps, times)
  table.add(f"{label}: our DP-SGD vs Opacus DP-SGD", "ours DP-SGD", "Opacus DP-SGD (CPU)", steps,
            times)


def write_section(text: str, path: pathlib.Path = DOC) -> None:
  """Replaces the text between the BEGIN and END markers of `path` by `text`."""
  doc = path.read_text()
  if BEGIN not in doc or END not in doc:
    raise ValueError(f"{path} has no {BEGIN} ... {END} section")
  head, rest = doc.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=1)
  parser.add_argument("--skip_scaling", action="store_true")
  parser.add_argument("--skip_peers", action="store_true")
  parser.add_argument("--max_rounds", type=int, default=30,
                      help="most interleaved rounds per group while the intervals are wide")
  parser.add_argument("--idle_wait", type=float, default=0.0,
                      help="seconds to wait for the load average to fall below the threshold")
  parser.add_argument("--allow_busy", action="store_true",
                      help="run on a busy machine anyway: the table is marked INVALID, never written")
  parser.add_argument("--write", action="store_true",
                      help=f"replace the {BEGIN} section of {DOC.name}")
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
  table = Table(peak)
  train_rows(table, args.warmup, args.repeats)
  dpdfd_rows(table, args.warmup, args.repeats, scaling=not args.skip_scaling)
  clipping_rows(table, args.warmup, args.repeats)
  if not args.skip_peers:
    peer_rows(table, args.warmup, args.repeats)
  conditions.finish(protocol.load1(), peak_flops(args.repeats))
  wide = (f" Intervals still wider than 5% after {MAX_ROUNDS} rounds: {'; '.join(NOT_TIGHT)}."
          if NOT_TIGHT else "")
  header = (
      f"{datetime.date.today()}, jax {jax.__version__} on {jax.devices()[0].platform} "
      f"({protocol.machine_id()}), XLA_FLAGS `{os.environ.get('XLA_FLAGS', '')}` (from "
      f"dpkd_jax/xla_cpu.py unless set), convolution routes {conv_routes.mode()} "
      f"(models/conv_routes.py), {args.warmup} warm-up call(s) then >= {args.repeats} "
      f"interleaved rounds per group of rows, until each ratio's 95% bootstrap interval is "
      f"within 5%; {conditions.line()}; whole run {time.perf_counter() - start:.0f} s.{wide}")
  text = f"{header}\n\n{table.markdown()}"
  print(f"\n{text}")
  if args.write and not conditions.valid:
    raise protocol.MachineBusy("not writing an invalid table to the docs (see the conditions)")
  if args.write:
    write_section(text)
    print(f"\nwritten to {DOC}")


if __name__ == "__main__":
  main()
