"""A PyTorch eager twin of our DPDFD train step, for `perf_table.py` to time.

    PYTHONPATH=. /work/venv_peers/bin/python benchmarks/peers_dpdfd.py [--batch_size=64]
        [--generator_channels=64] [--repeats=5] [--check_only]

The twin runs `methods.dpdfd.step.build_train_step` at perf_table's configuration (student
`datalens_cnn`, teacher `small_cnn`, both BatchNorm; DAFL generator, latent 100; Adam 1e-3):
z ~ N(0, I), x = G(z); teacher(x) (eval, no grad), s = student(x); g_i = d DKD(s_i, t_i)/d s_i
in ONE batched autograd call (row i of the summed loss depends on s_i only); g~ = C g/(||g|| + e)
+ sigma C N(0, I); y_s = s - gamma g~ (a constant); Adam on the student's 0.5 ||s - y_s||^2;
Adam on the generator's L_S + one-hot CE + entropy + feature norm through the updated student.

It is written as one writes PyTorch, where no compiler merges repeated work: one generator
forward gives both x (detached) and the generator update's graph, one student forward gives
both g and the student update (our step writes each forward twice and leaves the duplicate to
XLA; the values are equal). The student forward of the generator update leaves the student's
running statistics alone, as ours discards them.

`check_against_ours` runs one step of both from equal weights, z and noise (SGD in both; ours
keeps its exact gradient in the optimizer state); `main` prints it in float64 and float32. The
speed of the two is timed by `perf_table.py` (its DPDFD rows), on an idle machine only.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
from flax import nnx, traverse_util
from torch import nn

from dpkd_jax import models
from dpkd_jax.methods import dpdfd as ours
from dpkd_jax.methods.dpdfd import step as ours_step
from dpkd_jax.models import core
from dpkd_jax.train.state import TrainState

NUM_CLASSES = 10
LATENT_DIM = 100
LEARNING_RATE = 1e-3  # perf_table's optax.adam(1e-3)
# flax names -> torch names (BatchNorm's statistics are buffers in torch).
_TORCH_NAME = {"kernel": "weight", "scale": "weight", "bias": "bias", "mean": "running_mean",
               "var": "running_var"}


class StepSettings:
  """Our DPDFD config and plan at perf_table's setting (the library defaults but for sigma and
  B), read by the twin as one namespace: the plan's noise fields, else the config's."""

  def __init__(self, batch_size: int, noise_multiplier: float = 1.0):
    self.config = ours.DPDFDConfig(dataset="mnist", teacher_dirs=("unused",),
                                   noise_multiplier=noise_multiplier, batch_size=batch_size,
                                   latent_dim=LATENT_DIM)
    self.plan = ours.make_plan(self.config)

  def __getattr__(self, name: str):
    plan, config = self.__dict__["plan"], self.__dict__["config"]
    return getattr(plan, name) if hasattr(plan, name) else getattr(config, name)


def step_config(batch_size: int, noise_multiplier: float = 1.0) -> StepSettings:
  return StepSettings(batch_size, noise_multiplier)


def jax_models(generator_channels: int, image_shape: tuple[int, int, int],
               seed: int = 0) -> dict[str, core.ModelParts]:
  """Our student, generator and teacher, initialised as `perf_table.dpdfd_steps` does."""
  key_s, key_g, key_t = jax.random.split(jax.random.key(seed), 3)
  student = models.create_classifier("datalens_cnn", num_classes=NUM_CLASSES,
                                     input_shape=image_shape, rngs=nnx.Rngs(key_s))
  generator = models.create_generator("dafl", latent_dim=LATENT_DIM, image_shape=image_shape,
                                      rngs=nnx.Rngs(key_g), base_channels=generator_channels)
  teacher = models.create_classifier("small_cnn", num_classes=NUM_CLASSES,
                                     input_shape=image_shape, rngs=nnx.Rngs(key_t))
  return {"student": core.split(student), "generator": core.split(generator),
          "teacher": core.split(teacher)}


class ConvNorm(nn.Module):
  """classifiers.ConvNorm, norm="batch" (running var: unbiased in torch, biased in flax; unread)."""

  def __init__(self, in_channels: int, out_channels: int, padding: int):
    super().__init__()
    self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=padding, bias=False)
    self.norm = nn.BatchNorm2d(out_channels, momentum=0.1)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.norm(self.conv(x))


class Classifier(nn.Module):
  """classifiers.DataLensCNN (VALID convs, one pool) or SmallCNN (SAME convs, two pools)."""

  def __init__(self, name: str, image_shape: tuple[int, int, int]):
    super().__init__()
    height, width, channels = image_shape
    if name == "datalens_cnn":
      padding, hidden, self.second_pool = 0, 64, False
      flat_shape = ((height - 2) // 2 - 2, (width - 2) // 2 - 2, 64)
    elif name == "small_cnn":
      padding, hidden, self.second_pool = 1, 128, True
      flat_shape = (height // 4, width // 4, 64)
    else:
      raise ValueError(f"no PyTorch twin of classifier {name!r}")
    self.flat_layers = {"fc": flat_shape}  # (h, w, c) of the NHWC map our fc flattens
    self.conv1 = ConvNorm(channels, 32, padding)
    self.conv2 = ConvNorm(32, 64, padding)
    self.fc = nn.Linear(math.prod(flat_shape), hidden)
    self.head = nn.Linear(hidden, NUM_CLASSES)

  def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C, H, W) -> (logits (B, K), features (B, hidden))."""
    x = F.max_pool2d(F.relu(self.conv1(x)), 2)
    x = F.relu(self.conv2(x))
    if self.second_pool:
      x = F.max_pool2d(x, 2)
    features = F.relu(self.fc(x.flatten(1)))  # NCHW flatten: `copy_from_jax` permutes fc
    return self.head(features), features


class DAFLGenerator(nn.Module):
  """generators.DAFLGenerator: dense -> BN -> up -> conv -> BN(eps .8) -> LReLU -> up -> conv
  -> BN(eps .8) -> LReLU -> conv -> tanh -> BN without affine."""

  def __init__(self, image_shape: tuple[int, int, int], base_channels: int):
    super().__init__()
    height, width, channels = image_shape
    self.init_shape = (height // 4, width // 4, base_channels)
    self.flat_layers = {"project": self.init_shape}  # our project's output is NHWC
    self.project = nn.Linear(LATENT_DIM, math.prod(self.init_shape))
    self.project_norm = nn.BatchNorm2d(base_channels, momentum=0.1)
    self.conv1 = nn.Conv2d(base_channels, base_channels, 3, padding=1)
    self.norm1 = nn.BatchNorm2d(base_channels, eps=0.8, momentum=0.1)
    self.conv2 = nn.Conv2d(base_channels, base_channels // 2, 3, padding=1)
    self.norm2 = nn.BatchNorm2d(base_channels // 2, eps=0.8, momentum=0.1)
    self.conv_out = nn.Conv2d(base_channels // 2, channels, 3, padding=1)
    self.output_norm = nn.BatchNorm2d(channels, momentum=0.1, affine=False)

  def forward(self, z: torch.Tensor) -> torch.Tensor:
    """(B, latent) -> (B, C, H, W)."""
    h, w, c = self.init_shape
    x = self.project(z).view(z.shape[0], c, h, w)  # `copy_from_jax` permutes project's rows
    x = F.interpolate(self.project_norm(x), scale_factor=2, mode="nearest")
    x = F.leaky_relu(self.norm1(self.conv1(x)), 0.2)
    x = F.interpolate(x, scale_factor=2, mode="nearest")
    x = F.leaky_relu(self.norm2(self.conv2(x)), 0.2)
    return self.output_norm(torch.tanh(self.conv_out(x)))


def _to_torch_layout(path: tuple[str, ...], value, flat: dict[str, tuple[int, int, int]]):
  """One flax array in torch's layout: HWIO -> OIHW, (in, out) -> (out, in), and the dense
  layers next to an NHWC reshape (`flat`: layer -> (h, w, c)) re-ordered for NCHW."""
  a, layer, leaf = np.asarray(value), path[0], path[-1]
  if leaf == "kernel" and a.ndim == 4:
    return a.transpose(3, 2, 0, 1)
  if leaf == "kernel" and layer == "project":  # output rows (h, w, c)
    return a.reshape(a.shape[0], *flat[layer]).transpose(3, 1, 2, 0).reshape(-1, a.shape[0])
  if leaf == "kernel" and layer in flat:  # input rows (h, w, c)
    return a.reshape(*flat[layer], -1).transpose(3, 2, 0, 1).reshape(a.shape[-1], -1)
  if leaf == "kernel":
    return a.T
  if leaf == "bias" and layer == "project":
    return a.reshape(flat[layer]).transpose(2, 0, 1).reshape(-1)
  return a


def torch_arrays(tree, flat: dict[str, tuple[int, int, int]]) -> dict[str, np.ndarray]:
  """A flax params or batch-stats pure dict as {torch state_dict name: array}."""
  return {".".join(path[:-1] + (_TORCH_NAME[path[-1]],)): _to_torch_layout(path, v, flat)
          for path, v in traverse_util.flatten_dict(tree).items()}


def copy_from_jax(net: nn.Module, parts: core.ModelParts) -> None:
  """Loads our weights and BatchNorm statistics into `net`; every tensor must be covered."""
  ours, theirs = models.count_params(parts.params), sum(p.numel() for p in net.parameters())
  if ours != theirs:
    raise AssertionError(f"{type(net).__name__}: {ours} JAX vs {theirs} PyTorch parameters")
  flat = net.flat_layers
  arrays = {**torch_arrays(parts.params, flat), **torch_arrays(parts.batch_stats, flat)}
  state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
  if set(arrays) != set(state):
    raise AssertionError(f"{type(net).__name__}: tensors differ: {set(arrays) ^ set(state)}")
  for name, tensor in state.items():
    if tuple(tensor.shape) != arrays[name].shape:
      raise AssertionError(f"{name}: torch {tuple(tensor.shape)} vs ours {arrays[name].shape}")
    with torch.no_grad():
      tensor.copy_(torch.from_numpy(np.array(arrays[name])))  # a writable copy


def dkd(s: torch.Tensor, t: torch.Tensor, labels: torch.Tensor, *, alpha: float, beta: float,
        temperature: float) -> torch.Tensor:
  """losses.dkd per row, (B, K) -> (B,): the same log-space split and exact gather."""
  def split(logits):
    z = logits / temperature
    positions = torch.arange(z.shape[1] - 1)[None, :]
    rest = torch.gather(z, 1, positions + (positions >= labels[:, None]))  # (B, K - 1)
    target = torch.gather(z, 1, labels[:, None])[:, 0]
    norm, rest_mass = torch.logsumexp(z, 1), torch.logsumexp(rest, 1)
    return torch.stack([target - norm, rest_mass - norm], 1), rest - rest_mass[:, None]

  kl = lambda log_t, log_p: (log_t.exp() * (log_t - log_p)).sum(1)  # noqa: E731
  (s_bin, s_rest), (t_bin, t_rest) = split(s), split(t)
  return (alpha * kl(t_bin, s_bin) + beta * kl(t_rest, s_rest)) * temperature ** 2


def per_sample_output_grads(cfg, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
  """g_i = d DKD(s_i, t_i, argmax t_i) / d s_i, (B, K), in ONE autograd call."""
  s = s.detach().requires_grad_()
  loss = dkd(s, t, t.argmax(1), alpha=cfg.dkd_alpha, beta=cfg.dkd_beta, temperature=cfg.temperature)
  return torch.autograd.grad(loss.sum(), s)[0]


def output_gradient_mechanism(cfg, g: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
  """mechanisms.output_gradient_mechanism: non-finite rows zeroed, overflow-safe row norms,
  rows normalized (or clipped) to C, plus sigma C `noise` ((B, K) standard normal)."""
  g = torch.where(torch.isfinite(g).all(1, keepdim=True), g, 0.0)
  max_abs = g.abs().amax(1)
  safe_max = torch.where(max_abs > 0, max_abs, 1.0)
  norms = torch.where(max_abs > 0, safe_max * (g / safe_max[:, None]).square().sum(1).sqrt(), 0.0)
  bound = cfg.l2_clip_norm
  if cfg.bound_method == "normalize":
    denominator = norms + cfg.stability
    positive = denominator > 0
    scale = torch.where(positive, bound / torch.where(positive, denominator, 1.0), 0.0)
  else:
    over = norms > bound
    scale = torch.where(over, bound / torch.where(over, norms, 1.0), 1.0)
  return g * scale[:, None] + cfg.noise_multiplier * bound * noise


def student_loss(cfg, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
  if cfg.student_loss == "ce":
    return -(target.softmax(1) * logits.log_softmax(1)).sum(1).mean()
  return 0.5 * (logits - target).square().sum(1).mean()


def generator_terms(cfg, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
  """methods.dpdfd.step.generator_loss_terms: one-hot CE, information entropy, feature norm."""
  log_mean = torch.logsumexp(logits.log_softmax(1), 0) - math.log(logits.shape[0])  # (K,)
  return {"one_hot": cfg.one_hot_weight * F.cross_entropy(logits, logits.argmax(1)),
          "entropy": cfg.entropy_weight * (log_mean.exp() * log_mean).sum(),
          "feature": -cfg.feature_weight * torch.linalg.vector_norm(features, dim=1).mean()}


class TorchDPDFD:
  """The twin: models initialised from ours, `step(z, noise)` as `build_train_step`."""

  def __init__(self, cfg, generator_channels: int, image_shape: tuple[int, int, int],
               parts: dict[str, core.ModelParts], optimizer: Callable | None = None,
               dtype: torch.dtype = torch.float32):
    self.cfg = cfg
    self.student = Classifier("datalens_cnn", image_shape).to(dtype).train()
    self.teacher = Classifier("small_cnn", image_shape).to(dtype).eval().requires_grad_(False)
    self.generator = DAFLGenerator(image_shape, generator_channels).to(dtype).train()
    for name in ("student", "teacher", "generator"):
      copy_from_jax(getattr(self, name), parts[name])
    make = optimizer or (lambda ps: torch.optim.Adam(ps, lr=LEARNING_RATE))
    self.student_opt = make(self.student.parameters())
    self.generator_params = list(self.generator.parameters())
    self.generator_opt = make(self.generator_params)
    self.student_norms = [m for m in self.student.modules() if isinstance(m, nn.BatchNorm2d)]

  def step(self, z: torch.Tensor, noise: torch.Tensor) -> dict[str, torch.Tensor]:
    """One step from latent `z` (B, latent) and mechanism `noise` (B, K); returns the metrics."""
    cfg = self.cfg
    x_g = self.generator(z)  # (B, C, H, W); its graph serves the generator update
    x = x_g.detach()
    with torch.no_grad():
      t = self.teacher(x)[0]
    s, _ = self.student(x)
    g = per_sample_output_grads(cfg, s, t)
    target = s.detach() - cfg.gamma * output_gradient_mechanism(cfg, g, noise)

    s_loss = student_loss(cfg, s, target)
    self.student_opt.zero_grad(set_to_none=True)
    s_loss.backward()
    self.student_opt.step()

    for norm in self.student_norms:  # ours discards these statistics: momentum 0 keeps them
      norm.momentum = 0.0
    logits, features = self.student(x_g)
    for norm in self.student_norms:
      norm.momentum = 0.1
    terms = generator_terms(cfg, logits, features)
    terms["student"] = student_loss(cfg, logits, target)
    g_loss = sum(terms.values())
    # Generator gradients only: autograd prunes the student's weight gradients.
    for p, grad in zip(self.generator_params, torch.autograd.grad(g_loss, self.generator_params)):
      p.grad = grad
    self.generator_opt.step()
    return {"student_loss": s_loss.detach(), "generator_loss": g_loss.detach(),
            **{f"lg_{k}": v.detach() for k, v in terms.items()}}


def build_torch_dpdfd_step(batch_size: int = 64, generator_channels: int = 64,
                           image_shape: tuple[int, int, int] = (28, 28, 1),
                           noise_multiplier: float = 1.0, seed: int = 0) -> Callable[[], None]:
  """The twin at perf_table's configuration, as a closure running one step per call (fresh z
  and noise from torch's generator, as ours draws them inside its step). Parameter counts and
  shapes are checked equal to ours while the weights are copied."""
  cfg = step_config(batch_size, noise_multiplier)
  twin = TorchDPDFD(cfg, generator_channels, image_shape,
                    jax_models(generator_channels, image_shape, seed))
  rng = torch.Generator().manual_seed(seed)

  def call() -> None:
    z = torch.randn(batch_size, cfg.latent_dim, generator=rng)
    twin.step(z, torch.randn(batch_size, NUM_CLASSES, generator=rng))

  call.twin = twin  # for tests
  return call


def torch_info() -> str:
  return f"torch {torch.__version__}, {torch.get_num_threads()} threads"


def _recording_sgd(lr: float) -> optax.GradientTransformation:
  """SGD whose state is the last gradient: ours then reports its exact gradients."""
  return optax.GradientTransformation(
      lambda params: jax.tree.map(jnp.zeros_like, params),
      lambda grads, state, params=None: (jax.tree.map(lambda g: -lr * g, grads), grads))


def _rel(a: np.ndarray, b: np.ndarray, scale: float = 0.0) -> float:
  """||a - b|| / ||b||, or / `scale` where ||b|| is below it."""
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), scale, 1e-30))


def check_against_ours(batch_size: int = 8, generator_channels: int = 8,
                       image_shape: tuple[int, int, int] = (28, 28, 1), lr: float = 0.01,
                       seed: int = 0, float64: bool = True) -> dict[str, float]:
  """One step of ours and of the twin from equal weights, z and noise (SGD(lr) in both).

  In float64 (the default: JAX's x64 mode within this call, the twin in double) the two agree
  to rounding. In float32 a few ReLU inputs lie within rounding of 0, and which side each code
  lands on decides whether gradient flows there: gradients may then differ by a few %.

  Returns:
    The worst relative L2 difference, twin vs ours, of the student's parameter gradients, of
    the generator's, and of the step's metrics (student loss, generator loss and its terms).
  """
  cfg = step_config(batch_size)
  with jax.enable_x64(float64):
    dtype = jnp.float64 if float64 else jnp.float32
    parts = {name: p._replace(params=jax.tree.map(lambda a: a.astype(dtype), p.params),
                              batch_stats=jax.tree.map(lambda a: a.astype(dtype), p.batch_stats))
             for name, p in jax_models(generator_channels, image_shape, seed).items()}
    tx = _recording_sgd(lr)
    state = ours_step.DPDFDState(TrainState.create(parts["student"], tx),
                                 TrainState.create(parts["generator"], tx))
    ensemble = ours_step.TeacherEnsemble.stack([parts["teacher"]])
    key = jax.random.key(seed + 1)
    new, metrics = jax.jit(ours_step.build_train_step(cfg.plan, cfg.config, ensemble.graphdef))(
        state, ensemble.params, ensemble.batch_stats, key)
    # The draws of our step: z from split(key)[0], the one teacher's noise from split(key)[1].
    z_key, noise_key = jax.random.split(key)
    z = np.asarray(jax.random.normal(z_key, (batch_size, cfg.latent_dim), dtype))
    noise = np.asarray(jax.random.normal(noise_key, (batch_size, NUM_CLASSES), dtype))
    new, metrics = jax.tree.map(np.asarray, (new, metrics))
  twin = TorchDPDFD(cfg, generator_channels, image_shape, parts,
                    optimizer=lambda ps: torch.optim.SGD(ps, lr=lr),
                    dtype=torch.float64 if float64 else torch.float32)
  theirs = twin.step(torch.from_numpy(z.copy()), torch.from_numpy(noise.copy()))
  worst = {}
  for name, net in (("student", twin.student), ("generator", twin.generator)):
    grads = torch_arrays(getattr(new, name).opt_state, net.flat_layers)
    # A conv bias right before BatchNorm has gradient 0 (rounding only): such tensors are
    # measured against 1e-3 of the model's gradient norm instead of their own.
    scale = 1e-3 * math.sqrt(sum(np.sum(np.square(g)) for g in grads.values()))
    worst[f"{name} gradients"] = max(_rel(p.grad.numpy(), grads[k], scale)
                                     for k, p in net.named_parameters())
  worst["metrics"] = max(_rel(v.numpy(), metrics[k]) for k, v in theirs.items())
  return worst


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--generator_channels", type=int, default=64)
  args = parser.parse_args()
  shape = (28, 28, 1)
  for bits in (64, 32):  # worst relative L2 differences, twin vs ours, after one SGD step
    worst = check_against_ours(args.batch_size, args.generator_channels, shape, float64=bits == 64)
    print(f"twin vs ours, float{bits}: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))


if __name__ == "__main__":
  main()
