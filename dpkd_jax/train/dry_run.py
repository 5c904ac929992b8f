"""A step's cost on paper: XLA's FLOPs, bytes and memory of one jitted step from shapes alone,
and its wall time on one accelerator chip as a roofline estimate.

`step_cost(jitted, *abstract_args)` (`jax.ShapeDtypeStruct` leaves: nothing is allocated):
  * FLOPs: XLA's cost analysis of the step lowered for CUDA (`ACCELERATOR_PLATFORM`; the TPU
    lowering is the same program): the lowering for this machine's CPU may take CPU-only
    convolution forms whose products XLA's analysis does not count.
  * bytes accessed and memory: the step compiled for this machine's backend (`backend`: "cpu"
    here), its cost analysis after XLA's fusions (the lowered, unfused figure, every op's
    operands and results, is kept beside as an upper bound), and `memory_analysis()`.
`estimate(flops, bytes, chip, utilisation)`: the roofline, max(FLOPs / peak, bytes /
bandwidth), divided by the utilisation assumed of both peaks.
`CHIPS`: the peaks assumed (vendor datasheets, dense) and the precision that JAX's default
float32 matmul and convolution precision runs at on each chip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import jax

ACCELERATOR_PLATFORM = "cuda"
DEFAULT_UTILISATION = 0.4  # of both peaks (40% MFU, and 40% of the HBM bandwidth)
MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                 "temp_size_in_bytes")


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip as the estimate assumes it.

  Attributes:
    name: the chip.
    peak_flops: FLOP/s at `precision`, the rate a float32 step runs at under JAX's defaults.
    precision: what JAX's default float32 matmul/convolution precision runs as on this chip.
    hbm_bytes_per_s: memory bandwidth.
    peaks: (precision, FLOP/s) of every peak printed beside, for reference.
  """

  name: str
  peak_flops: float
  precision: str
  hbm_bytes_per_s: float
  peaks: tuple[tuple[str, float], ...] = ()


H100 = Chip("NVIDIA H100 SXM", 494.7e12,
            "TF32 (JAX's default float32 matmul/conv precision on H100 tensor cores)", 3.35e12,
            (("bf16", 989e12), ("TF32", 494.7e12), ("FP32", 66.9e12)))
TPU_V5E = Chip("TPU v5e", 197e12,
               "bf16, one pass (JAX's default float32 matmul/conv precision on TPU)", 819e9,
               (("bf16", 197e12),))
CHIPS = (H100, TPU_V5E)


@dataclasses.dataclass(frozen=True)
class StepCost:
  """XLA's figures of one step.

  Attributes:
    flops: of the step lowered for `ACCELERATOR_PLATFORM` (a multiply-add counts 2).
    transcendentals: exp, log, ... evaluations, same lowering.
    bytes_accessed: of the step compiled for `backend`, after its fusions.
    bytes_accessed_unfused: of the lowered step before any fusion (an upper bound).
    memory: `memory_analysis()` of the compiled step, bytes per `MEMORY_FIELDS` entry.
    backend: the backend it was compiled for.
  """

  flops: float
  transcendentals: float
  bytes_accessed: float
  bytes_accessed_unfused: float
  memory: Mapping[str, int]
  backend: str

  @property
  def peak_memory_bytes(self) -> int:
    """Live bytes while the step runs: its arguments, its outputs not written over a donated
    argument, and its temporaries."""
    m = self.memory
    return (m["argument_size_in_bytes"] + m["output_size_in_bytes"] - m["alias_size_in_bytes"]
            + m["temp_size_in_bytes"])


def _analysis(analysis: Any) -> Mapping[str, float]:
  # One dict; some jax versions gave a list with one dict per computation.
  if isinstance(analysis, Sequence) and not isinstance(analysis, Mapping):
    analysis = analysis[0] if analysis else {}
  return analysis or {}


def step_cost(jitted: Callable, *args: Any) -> StepCost:
  """XLA's cost of `jitted(*args)` (module docstring); `args` may be shapes only."""
  traced = jitted.trace(*args)
  accelerator = _analysis(traced.lower(lowering_platforms=(ACCELERATOR_PLATFORM,))
                          .cost_analysis())
  lowered = traced.lower()
  compiled = lowered.compile()
  fused = _analysis(compiled.cost_analysis())
  stats = compiled.memory_analysis()
  return StepCost(
      flops=float(accelerator["flops"]),
      transcendentals=float(accelerator.get("transcendentals", 0.0)),
      bytes_accessed=float(fused["bytes accessed"]),
      bytes_accessed_unfused=float(_analysis(lowered.cost_analysis())["bytes accessed"]),
      memory={name: int(getattr(stats, name)) for name in MEMORY_FIELDS},
      backend=jax.default_backend())


def estimate(flops: float, bytes_accessed: float, chip: Chip,
             utilisation: float = DEFAULT_UTILISATION) -> dict[str, Any]:
  """Seconds per step on `chip`: compute-bound, memory-bound, and the roofline (their max)
  divided by `utilisation`; "bound" names the larger."""
  if not 0 < utilisation <= 1:
    raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")
  compute, memory = flops / chip.peak_flops, bytes_accessed / chip.hbm_bytes_per_s
  return {"compute_bound_s": compute, "memory_bound_s": memory,
          "bound": "compute" if compute >= memory else "memory",
          "step_s": max(compute, memory) / utilisation}


def chip_record(chip: Chip) -> dict[str, Any]:
  """The peaks assumed of `chip`, as a record prints them."""
  return {"name": chip.name, "precision": chip.precision, "peak_flops": chip.peak_flops,
          "hbm_bytes_per_s": chip.hbm_bytes_per_s, "peaks": dict(chip.peaks)}


def duration(seconds: float) -> str:
  """`seconds` in the largest unit that keeps it >= 1 (s, min, h, d)."""
  for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
    if seconds >= size:
      return f"{seconds / size:.3g} {unit}"
  return f"{seconds:.3g} s"
