"""Canary design and insertion: m mislabelled training records, each included with probability 1/2.

A canary is a training record (x_i, y_i) of the private split whose label the auditor may
replace by a wrong label y'_i. Its inclusion bit S_i ~ Bernoulli(1/2) decides which of the two
records the run trains on:

  S_i = 1: (x_i, y'_i)    the mislabelled canary, which a model can only fit by memorising it
  S_i = 0: (x_i, y_i)     the record as it was

So the two training sets of one bit are replace-one neighbours (one record replaced by
another, the library's relation) of the same size N: the plan's N and sampling rate do not
change with the bits, and every other record is the original data. Steinke, Nasr and
Jagielski's one-run theorem needs only that the run be (ε, δ)-DP in each bit S_i with the
others fixed, which a replace-one guarantee gives.

Three draws, each from its own `fold_in` tag of the audit key (never `split`):
  which m records become canaries (a permutation of the N indices, its first m),
  y'_i = (y_i + 1 + u_i) mod K with u_i uniform in {0, ..., K-2} (never the true label),
  S_i ~ Bernoulli(1/2).
The draws read only N, K and the labels of the chosen records (to skip the true label), never
the images. `CanaryDesign` holds all three; the public part (images and wrong labels, what a
scorer may see) is `public_view`; the inclusion bits and the key are the auditor's secret.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np

from dpkd_jax import data
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint

# fold_in tags of the audit key, one per draw.
INDEX_TAG, LABEL_TAG, INCLUSION_TAG = 0x696478, 0x6C6162, 0x696E63
DESIGN_FILE = "canary_design.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CanaryDesign:
  """m canaries of one training split.

  Attributes:
    indices: (m,) int, distinct rows of the training split that are canaries.
    true_labels: (m,) int, their labels in the data.
    canary_labels: (m,) int, the wrong labels y'_i (never equal to `true_labels`).
    included: (m,) bool, S_i: the run trains on (x_i, y'_i) where True, on (x_i, y_i) else.
    seed: the audit key's 64-bit seed (secret unless the user chose it).
    seed_secret: whether `seed` came from OS entropy.
  """

  indices: np.ndarray
  true_labels: np.ndarray
  canary_labels: np.ndarray
  included: np.ndarray
  seed: int
  seed_secret: bool

  def __post_init__(self):
    m = len(self.indices)
    if m < 2:
      raise ValueError(f"an audit needs at least 2 canaries, got {m}")
    for name in ("true_labels", "canary_labels", "included"):
      if len(getattr(self, name)) != m:
        raise ValueError(f"{name} has {len(getattr(self, name))} entries, indices {m}")
    if np.any(self.true_labels == self.canary_labels):
      raise ValueError("a canary label equals its record's true label")
    if len(np.unique(self.indices)) != m:
      raise ValueError("canary indices repeat")

  @property
  def m(self) -> int:
    return len(self.indices)

  def to_json(self) -> dict[str, Any]:
    return {"seed": str(self.seed), "seed_secret": self.seed_secret,
            **{name: getattr(self, name).astype(int).tolist()
               for name in ("indices", "true_labels", "canary_labels", "included")}}

  @classmethod
  def from_json(cls, payload: dict[str, Any]) -> "CanaryDesign":
    arrays = {name: np.asarray(payload[name], np.int64)
              for name in ("indices", "true_labels", "canary_labels")}
    return cls(**arrays, included=np.asarray(payload["included"], bool),
               seed=int(payload["seed"]), seed_secret=bool(payload["seed_secret"]))


def design_canaries(labels: np.ndarray, num_classes: int, m: int, *,
                    seed: int | None = None, rows: np.ndarray | None = None) -> CanaryDesign:
  """Draws the design of m canaries among the N records with `labels` (module docstring).

  Args:
    labels: (N,) int labels of the training split.
    num_classes: K >= 2.
    m: number of canaries, 2 <= m <= len(rows).
    seed: the audit key's seed (None: 64 secret bits from OS entropy, `privacy.seeds`).
    rows: (R,) distinct rows of the split that the run keeps private and trains on (the
      method's `private_rows`: not a public part, not a validation hold-out); None: all N.
  """
  n = len(labels)
  rows = np.arange(n) if rows is None else np.asarray(rows, np.int64)
  if not 2 <= m <= len(rows):
    raise ValueError(f"canaries must be in [2, {len(rows)}] (the private training records), "
                     f"got {m}")
  if num_classes < 2:
    raise ValueError(f"a wrong label needs num_classes >= 2, got {num_classes}")
  resolved = seeds.resolve_seed(seed)
  key = seeds.root_key(resolved)
  # A permutation of the eligible rows (of all N by default: the draw of earlier designs).
  indices = rows[np.asarray(jax.random.permutation(jax.random.fold_in(key, INDEX_TAG),
                                                   len(rows)))[:m]]
  true_labels = np.asarray(labels)[indices].astype(np.int64)
  offset = np.asarray(jax.random.randint(jax.random.fold_in(key, LABEL_TAG), (m,), 0,
                                         num_classes - 1))
  canary_labels = (true_labels + 1 + offset) % num_classes
  included = np.asarray(jax.random.bernoulli(jax.random.fold_in(key, INCLUSION_TAG), 0.5, (m,)))
  return CanaryDesign(indices=indices.astype(np.int64), true_labels=true_labels,
                      canary_labels=canary_labels.astype(np.int64), included=included,
                      seed=resolved.value, seed_secret=resolved.secret)


def insert(train: data.ArrayDataset, design: CanaryDesign) -> data.ArrayDataset:
  """The training split the run reads: the canaries' labels set to y'_i where S_i = 1."""
  if int(design.indices.max()) >= len(train):
    raise ValueError(f"canary index {int(design.indices.max())} outside {len(train)} records")
  if not np.array_equal(np.asarray(train.labels)[design.indices], design.true_labels):
    raise ValueError("the canary design was drawn on another training split")
  labels = np.array(train.labels, copy=True)
  labels[design.indices] = np.where(design.included, design.canary_labels, design.true_labels)
  return data.ArrayDataset(images=np.asarray(train.images), labels=labels, info=train.info)


def public_view(train: data.ArrayDataset, design: CanaryDesign) -> tuple[np.ndarray, np.ndarray]:
  """(images (m, H, W, C) uint8, canary labels (m,)): all a scorer is given (no inclusion)."""
  return np.asarray(train.images)[design.indices], design.canary_labels.copy()


# The canary directory holds the secret key, the inclusion bits and a copy of the private
# training split: owner-only, with the modes of the checkpoints that hold a run's seed.
def _private_file(path: str, mode: str):
  """`path` opened for writing, created (or truncated) owner-only."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, checkpoint.FILE_MODE)
  os.chmod(path, checkpoint.FILE_MODE)  # an existing file keeps its mode through os.open
  return os.fdopen(fd, mode)


def write_dataset(directory: str, dataset: str, train: data.ArrayDataset,
                  test: data.ArrayDataset) -> str:
  """`<directory>/<dataset>.npz` (the `data.load` format) holding the canary training split and
  the unchanged test split, owner-only; returns `directory`, the run's data_dir."""
  checkpoint.private_directory(directory)
  with _private_file(os.path.join(directory, f"{dataset}.npz"), "wb") as f:
    np.savez(f, x_train=np.asarray(train.images), y_train=np.asarray(train.labels),
             x_test=np.asarray(test.images), y_test=np.asarray(test.labels))
  return directory


def save_design(directory: str, design: CanaryDesign) -> str:
  """Writes the design (secret: it holds the key and the inclusion bits) to `directory`,
  owner-only."""
  checkpoint.private_directory(directory)
  path = os.path.join(directory, DESIGN_FILE)
  with _private_file(path, "w") as f:
    json.dump(design.to_json(), f)
  return path


def load_design(directory: str) -> CanaryDesign:
  with open(os.path.join(directory, DESIGN_FILE), encoding="utf-8") as f:
    return CanaryDesign.from_json(json.load(f))
