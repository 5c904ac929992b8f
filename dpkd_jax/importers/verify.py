"""Every import is checked: the source model and the imported teacher run on the same inputs and
their logits must agree, else the import is refused before anything is written.

A converter that holds a runnable source model (a PyTorch `torch.export` program, TorchScript
or a module built by the user's own code; a Keras model) returns a `Reference`: its logits on
inputs in the teacher's own normalisation. `check` feeds both models the same pixels (the
dataset's first test images and random ones), the source through the teacher's normalisation and
the imported teacher through the dataset's and its input adapter, exactly as a method will feed
it, and measures the largest relative logit difference

    max |imported - source| / max |source|   over every logit of every input.

Beyond `TOLERANCE` (float32 round-off of a faithful import is about 1e-6) the import is refused
with one line naming the difference, the argmax agreement and the source layers the zoo model has
no counterpart for. The measurement goes on the card (`import.check`). A bare PyTorch state_dict
holds no forward function: it is imported only when the user accepts that (`unverified`), and
the card says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.models import core
from dpkd_jax.train import evaluate

TOLERANCE = 1e-4  # largest relative logit difference accepted
NUM_DATASET_INPUTS = 32  # the first test images of the dataset
NUM_RANDOM_INPUTS = 16  # uniformly random pixels (seeded): inputs off the data distribution


@dataclasses.dataclass(frozen=True)
class Reference:
  """A runnable source model.

  Attributes:
    logits: (N, H, W, C) float32 inputs in the teacher's own normalisation (what its training
      pipeline fed it; before a Keras `Rescaling`) -> (N, classes) float logits.
    kind: what it is, for messages and the card (e.g. "torch.export program").
    unrepresented: the source's layer types the zoo model has no counterpart for (named in a
      refusal: the likely cause of a difference).
  """

  logits: Callable[[np.ndarray], np.ndarray]
  kind: str
  unrepresented: tuple[str, ...] = ()


def check_pixels(test_images: np.ndarray, info: data.DatasetInfo, seed: int = 0) -> np.ndarray:
  """The uint8 pixels both models are run on: test images first, then random ones."""
  rng = np.random.default_rng(seed)
  noise = rng.integers(0, 256, (NUM_RANDOM_INPUTS, *info.image_shape), dtype=np.uint8)
  return np.concatenate([np.asarray(test_images[:NUM_DATASET_INPUTS], np.uint8), noise])


def compare(reference: Reference, parts: core.ModelParts, pixels: np.ndarray,
            info: data.DatasetInfo, mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
  """The imported teacher against the source on `pixels`: difference and argmax agreement."""
  mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
  teacher_input = ((pixels.astype(np.float32) / 255.0 - mean) / std).astype(np.float32)
  want = np.asarray(reference.logits(teacher_input), np.float64)
  with jax.default_matmul_precision("highest"):  # TPUs default to bfloat16 passes
    got = np.asarray(evaluate.predict_logits(parts, pixels, info, batch_size=len(pixels)),
                     np.float64)
  if want.shape != got.shape:
    raise errors.UserError(f"--checkpoint: the {reference.kind} returns logits of shape "
                           f"{want.shape[1:]} per input, the imported teacher {got.shape[1:]}")
  scale = float(np.abs(want).max())
  difference = float(np.abs(got - want).max()) / (scale if scale > 0 else 1.0)
  return {"max_relative_logit_difference": difference,
          "argmax_agreement": float(np.mean(got.argmax(-1) == want.argmax(-1))),
          "num_inputs": int(len(pixels))}


def _significant(value: float) -> float:
  return float(f"{value:.2g}")


def check(reference: Reference | None, parts: core.ModelParts, test_images: np.ndarray,
          info: data.DatasetInfo, teacher_norm: tuple[Sequence[float], Sequence[float]], *,
          model: str, tolerance: float = TOLERANCE, unverified: str | None = None
          ) -> dict[str, Any]:
  """The card's `check`, or a one-line refusal.

  Args:
    reference: the runnable source model, or None (a bare state_dict).
    parts: the imported teacher (with its input adapter, if any).
    test_images: the dataset's test images (uint8); the first `NUM_DATASET_INPUTS` are used.
    info: the dataset.
    teacher_norm: (mean, std) per channel of the teacher's own normalisation.
    model: the zoo model's name, for the message.
    tolerance: the largest relative logit difference accepted.
    unverified: without a reference, why it cannot be checked; None refuses the import.

  Raises:
    errors.UserError: logits beyond `tolerance` (or of another shape than the teacher's).
    RuntimeError: no reference and no `unverified` reason (the caller refuses such an import
      unless the user consented: `run.import_teacher`).
  """
  if reference is None:
    if unverified is None:
      raise RuntimeError("a converter without a reference must say why")
    return {"verified": False, "reason": unverified}
  measured = compare(reference, parts, check_pixels(test_images, info), info, *teacher_norm)
  measured["num_dataset_inputs"] = min(len(test_images), NUM_DATASET_INPUTS)
  difference = measured["max_relative_logit_difference"]
  if not difference <= tolerance:  # NaN refuses too
    layers = (f"; source layers {model} has no counterpart for: "
              f"{', '.join(reference.unrepresented)}" if reference.unrepresented else "")
    raise errors.UserError(
        f"--checkpoint: the imported {model} does not compute what the {reference.kind} does: "
        f"largest relative logit difference {difference:.3g} (tolerance {tolerance:g}) on "
        f"{measured['num_inputs']} inputs ({measured['num_dataset_inputs']} {info.name} test "
        f"images and {NUM_RANDOM_INPUTS} random ones), argmax agreeing on "
        f"{measured['argmax_agreement']:.0%}{layers}; check --arch (nothing written)")
  return {"verified": True, "source": reference.kind, "tolerance": tolerance,
          **measured, "max_relative_logit_difference": _significant(difference)}
