"""Convolution kernel gradients on XLA CPU: XLA's own vs `fast_conv`'s, side by side.

    PYTHONPATH=. python benchmarks/conv_grads.py [--repeats=5] [--skip_models]

Per convolution shape (the DAFL generator's convs at B = 128, widths 64 and 128, for 28×28×1
and 32×32×3 images; small_cnn's convs at B = 256): the forward pass, XLA's kernel gradient (dW),
`fast_conv`'s GEMM dW (timed whatever its width threshold picks), the ratio XLA / GEMM, and
which of the two `fast_conv` takes by default. Then whole updates with plain convolutions and
with `fast_conv` at its default thresholds: the DAFL generator's (grad of a scalar loss w.r.t.
its parameters) and small_cnn's (batch gradient, and per-example gradients with `vmap(grad)` as
DP-SGD takes them).

Every function is jitted and warmed up first; the variants of one row are then timed
interleaved, `--repeats` rounds, so they see the same machine load: compare the ratios, not
absolute times across runs. Prints markdown tables (min / median / max ms per call).
"""

from __future__ import annotations

import argparse
import pathlib as _pathlib
import sys as _sys
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from dpkd_jax.kernels.xla_cpu import fast_conv
from dpkd_jax.models import core, registry

_SPECS = ("NHWC", "HWIO", "NHWC")


def conv_shapes() -> list[tuple[str, int, int, int, int]]:
  """(label, batch, side, in_channels, out_channels) of every 3×3 SAME stride-1 conv timed."""
  shapes = []
  for side, channels in ((28, 1), (32, 3)):
    for width in (64, 128):
      label = f"DAFL gen {side}×{side}×{channels} w{width}"
      shapes += [(f"{label} conv1", 128, side // 2, width, width),
                 (f"{label} conv2", 128, side, width, width // 2),
                 (f"{label} conv_out", 128, side, width // 2, channels)]
  shapes += [("small_cnn conv1", 256, 28, 1, 32), ("small_cnn conv2", 256, 14, 32, 64)]
  return shapes


def time_interleaved(fns: dict[str, Callable[..., jax.Array]], args: tuple,
                     repeats: int) -> dict[str, list[float]]:
  """Warms up every jitted function, then times them in `repeats` interleaved rounds.

  Returns:
    name → list of wall-clock milliseconds per call.
  """
  for fn in fns.values():
    jax.block_until_ready(fn(*args))
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append((time.perf_counter() - start) * 1e3)
  return times


def _stats(times: list[float]) -> str:
  return f"{min(times):.0f} / {statistics.median(times):.0f} / {max(times):.0f}"


def gemm_kernel_grad(x: jax.Array, w: jax.Array, dy: jax.Array) -> jax.Array:
  """`fast_conv`'s GEMM dW of a 3×3 SAME conv, whatever the width threshold would pick."""
  spec = fast_conv._supported_spec(x, w, (1, 1), "SAME", None, None, _SPECS, 1, 1, None, None,
                                   None)  # pylint: disable=protected-access
  return fast_conv._cpu_kernel_grad(x, dy, w.shape, spec)  # pylint: disable=protected-access


def default_takes_gemm(in_channels: int, out_channels: int) -> bool:
  """Whether `fast_conv`'s thresholds send this kernel to the GEMM dW (else XLA's)."""
  return (in_channels >= fast_conv._MIN_IN_CHANNELS  # pylint: disable=protected-access
          and in_channels * out_channels >= fast_conv._MIN_CHANNEL_PRODUCT)  # pylint: disable=protected-access


def conv_table(repeats: int) -> None:
  """Prints forward, XLA dW and the GEMM dW per conv shape, and which one the default takes."""
  print("| conv (B, H=W, C→O) | forward ms | XLA dW ms | GEMM dW ms | XLA / GEMM (median) "
        "| default |")
  print("|---|---|---|---|---|---|")
  for label, batch, side, in_channels, out_channels in conv_shapes():
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (batch, side, side, in_channels))
    w = jax.random.normal(keys[1], (3, 3, in_channels, out_channels))
    dy = jax.random.normal(keys[2], (batch, side, side, out_channels))

    def kernel_grad(conv):
      return jax.jit(lambda x, w, dy: jax.vjp(
          lambda kernel: conv(x, kernel, (1, 1), "SAME", dimension_numbers=_SPECS), w)[1](dy)[0])

    fns = {"forward": jax.jit(lambda x, w, dy: lax.conv_general_dilated(
               x, w, (1, 1), "SAME", dimension_numbers=_SPECS)),
           "xla": kernel_grad(lax.conv_general_dilated),
           "fast": jax.jit(gemm_kernel_grad)}
    reference, fast = fns["xla"](x, w, dy), fns["fast"](x, w, dy)
    error = float(jnp.abs(fast - reference).max() / jnp.abs(reference).max())
    if error > 1e-4:  # float32 sums in another order
      raise AssertionError(f"{label}: GEMM dW differs from XLA's, relative error {error:.1e}")
    t = time_interleaved(fns, (x, w, dy), repeats)
    ratio = statistics.median(t["xla"]) / statistics.median(t["fast"])
    default = "GEMM" if default_takes_gemm(in_channels, out_channels) else "XLA"
    print(f"| {label} ({batch}, {side}, {in_channels}→{out_channels}) | {_stats(t['forward'])} "
          f"| {_stats(t['xla'])} | {_stats(t['fast'])} | {ratio:.2f}× | {default} |", flush=True)


def use_plain_convs(model: nnx.Module) -> nnx.Module:
  """Switches every `nnx.Conv` of `model` back to `lax.conv_general_dilated` (in place)."""
  for _, module in nnx.iter_modules(model):
    if isinstance(module, nnx.Conv):
      module.conv_general_dilated = lax.conv_general_dilated
  return model


def _twins(build: Callable[[], nnx.Module]) -> dict[str, core.ModelParts]:
  """The same model (same parameters) with plain and with fast convolutions."""
  return {"xla": core.split(use_plain_convs(build())), "fast": core.split(build())}


def model_table(repeats: int) -> None:
  """Prints whole-model gradient times with plain vs fast convolutions."""
  print("\n| update | XLA convs ms | fast_conv (default thresholds) ms | XLA / fast (median) |")
  print("|---|---|---|---|")
  rows = []
  for side, channels in ((28, 1), (32, 3)):
    for width in (64, 128):
      def build(side=side, channels=channels, width=width):
        return registry.create_generator("dafl", latent_dim=100, image_shape=(side, side, channels),
                                         rngs=nnx.Rngs(jax.random.key(0)), base_channels=width)
      z = jax.random.normal(jax.random.key(1), (128, 100))
      target = jax.random.normal(jax.random.key(2), (128, side, side, channels))

      def generator_grad(parts, z=z, target=target):
        def loss(params):
          images, _ = core.apply(parts.graphdef, params, parts.batch_stats, z, train=True)
          return jnp.mean((images - target) ** 2)
        return jax.jit(jax.grad(loss)), (parts.params,)

      rows.append((f"DAFL generator {side}×{side}×{channels} w{width}, B=128, grad",
                   _twins(build), generator_grad))

  def build_cnn():
    return registry.create_classifier("small_cnn", num_classes=10, input_shape=(28, 28, 1),
                                      norm="group", rngs=nnx.Rngs(jax.random.key(0)))
  images = jax.random.normal(jax.random.key(3), (256, 28, 28, 1))
  labels = jax.random.randint(jax.random.key(4), (256,), 0, 10)

  def cnn_loss(parts, params, x, y):
    out, _ = core.apply(parts.graphdef, params, parts.batch_stats, x, train=True)
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(out.logits), y[:, None], axis=1))

  def batch_grad(parts):
    return jax.jit(jax.grad(lambda p: cnn_loss(parts, p, images, labels))), (parts.params,)

  def per_example_grads(parts, batch=64):
    # DP-SGD's form: the gradient of one example at a time, vmapped over the batch.
    one = jax.grad(lambda p, x, y: cnn_loss(parts, p, x[None], y[None]))
    fn = jax.vmap(one, in_axes=(None, 0, 0))
    return jax.jit(fn), (parts.params, images[:batch], labels[:batch])

  cnn = _twins(build_cnn)
  rows += [("small_cnn (GroupNorm) 28×28×1, B=256, batch grad", cnn, batch_grad),
           ("small_cnn (GroupNorm) 28×28×1, B=64, per-example grads (vmap)", cnn,
            per_example_grads)]
  for label, twins, make in rows:
    (xla_fn, args), (fast_fn, _) = make(twins["xla"]), make(twins["fast"])
    t = time_interleaved({"xla": xla_fn, "fast": fast_fn}, args, repeats)
    ratio = statistics.median(t["xla"]) / statistics.median(t["fast"])
    print(f"| {label} | {_stats(t['xla'])} | {_stats(t['fast'])} | {ratio:.2f}× |", flush=True)


def main() -> None:
  _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parent))
  import protocol  # pylint: disable=g-import-not-at-top  (sibling script)
  protocol.guard_script()  # speed is only measured on an idle machine
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--skip_convs", action="store_true", help="only the whole-model table")
  parser.add_argument("--skip_models", action="store_true", help="only the per-conv table")
  args = parser.parse_args()
  print(f"# {jax.devices()[0].platform}, {jax.device_count()} device(s), jax {jax.__version__}; "
        f"min / median / max of {args.repeats} interleaved calls\n")
  if not args.skip_convs:
    conv_table(args.repeats)
  if not args.skip_models:
    model_table(args.repeats)


if __name__ == "__main__":
  main()
