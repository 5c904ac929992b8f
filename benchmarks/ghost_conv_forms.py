"""Per-example convolution kernel gradients: three exact forms side by side (ghost clipping).

    PYTHONPATH=. python benchmarks/ghost_conv_forms.py [--repeats=15] [--batch=256]

Ghost clipping (`models.ghost`) materialises a convolution's per-example kernel gradients
G_i = a_i^T g_i, (B, *window, C, O), when that is the cheapest exact norm form (T positions
with 2T² ≥ d·p: every conv of lenet5 and small_cnn). Three ways compute the same array:

* `patches`: the (B, T, C·k²) input patches (`ghost_clipping.conv_patches`: one strided slice
  per tap, stacked), then one batched dot over T;
* `taps`: one batched dot over T per kernel tap, (B, T, C) × (B, T, O) → (B, C, O), stacked
  into the kernel layout: no patch array;
* `vmap_dw`: `vmap` over the examples of XLA's own kernel gradient of a one-example
  convolution (XLA turns it into one batch-grouped convolution).

Each row times norms + per-example gradients (what the norm pass needs) for the conv layers of
the models DP-SGD benchmarks (`peers_dpsgd`), checks the three agree, and names the fastest;
`ghost_clipping.conv_grad_form` is the routing this measures. Interleaved rounds; idle machine
only (`protocol.guard_script`).
"""

from __future__ import annotations

import argparse
import pathlib as _pathlib
import statistics
import sys as _sys

import jax
import jax.numpy as jnp
from jax import lax

from dpkd_jax.privacy import ghost_clipping

_SPECS = ("NHWC", "HWIO", "NHWC")


def layer_shapes() -> list[tuple[str, int, int, int, int, object]]:
  """(label, side, in_channels, out_channels, kernel, padding) of every conv timed."""
  return [("lenet5 conv1", 28, 1, 6, 5, ((2, 2), (2, 2))),
          ("lenet5 conv2", 14, 6, 16, 5, "VALID"),
          ("small_cnn conv1", 28, 1, 32, 3, "SAME"),
          ("small_cnn conv2", 14, 32, 64, 3, "SAME"),
          ("1→16 k5 (crossover)", 28, 1, 16, 5, "SAME"),
          ("16→32 k3 (crossover)", 14, 16, 32, 3, "SAME"),
          ("8→16 k3 (crossover)", 14, 8, 16, 3, "SAME")]


def forms(kernel: int, padding: object) -> dict:
  """form name → jitted (x, g) → (sq_norms (B,), per-example grads (B, k, k, C, O))."""
  conv = dict(window=(kernel, kernel), strides=(1, 1), padding=padding, lhs_dilation=None,
              rhs_dilation=None, dimension_numbers=_SPECS, groups=1)

  def make(form):
    def run(x, g):
      grads = ghost_clipping.per_example_conv_kernel_grads(x, g, form=form, **conv)
      return jnp.sum(jnp.square(grads), axis=(1, 2, 3, 4)), grads
    return jax.jit(run)

  return {form: make(form) for form in ghost_clipping.CONV_GRAD_FORMS}


def main() -> None:
  _sys.path.insert(0, str(_pathlib.Path(__file__).resolve().parent))
  import protocol  # pylint: disable=g-import-not-at-top  (sibling script)
  from conv_grads import time_interleaved  # pylint: disable=g-import-not-at-top
  protocol.guard_script()  # speed is only measured on an idle machine
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--batch", type=int, default=256)
  args = parser.parse_args()
  print(f"# {jax.devices()[0].platform}, {jax.device_count()} device(s), jax {jax.__version__}; "
        f"B = {args.batch}; min / median ms of {args.repeats} interleaved calls\n")
  names = ghost_clipping.CONV_GRAD_FORMS
  print("| conv (H=W, C→O, k) | " + " | ".join(names) + " | fastest | routed to |")
  print("|---" * (len(names) + 3) + "|")
  for label, side, cin, cout, kernel, padding in layer_shapes():
    keys = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(keys[0], (args.batch, side, side, cin))
    out = lax.conv_general_dilated(x, jnp.zeros((kernel, kernel, cin, cout)), (1, 1), padding,
                                   dimension_numbers=_SPECS)
    g = jax.random.normal(keys[1], out.shape)
    fns = forms(kernel, padding)
    reference = fns["patches"](x, g)[1]
    for name, fn in fns.items():
      error = float(jnp.abs(fn(x, g)[1] - reference).max() / jnp.abs(reference).max())
      if error > 1e-5:
        raise AssertionError(f"{label}: form {name} differs, relative error {error:.1e}")
    times = time_interleaved(fns, (x, g), args.repeats)
    medians = {name: statistics.median(t) for name, t in times.items()}
    cells = " | ".join(f"{min(times[n]):.2f} / {medians[n]:.2f}" for n in names)
    routed = ghost_clipping.conv_grad_form((kernel, kernel), cin, cout, groups=1)
    print(f"| {label} ({side}, {cin}→{cout}, {kernel}) | {cells} | "
          f"{min(medians, key=medians.get)} | {routed} |", flush=True)


if __name__ == "__main__":
  main()
