"""Canary scores from released artefacts only.

The attacker of these audits holds what a run releases, its classifier (the student's weights
as `release.students.load_student` reads them for export; for the power reference, the
non-private teacher's as `teacher.load_teacher` reads them), and the public part of the design:
the canary images and their wrong labels (`canaries.public_view`). Not the inclusion bits,
not the training data, not the checkpoint's optimizer state or key data.

Score of canary i: the log-odds the released model gives its wrong label,

  s_i = z_{y'_i}(x_i) - logsumexp_{j != y'_i} z_j(x_i) = log p(y'_i | x_i) - log(1 - p(y'_i | x_i))

(the logit margin of the canary label; monotone in the loss on it). A model that memorised
(x_i, y'_i) gives it a high score; one trained on (x_i, y_i) a low one.

Two more threat models, for what some runs release besides the final classifier:

  white_box   DP-SGD: the final parameters and the public initialisation (the model built
              from the run's public seed, before any step). Score: the decrease of the
              canary's loss at its wrong label, log p_T(y'_i | x_i) - log p_0(y'_i | x_i):
              what training did to that record, with the initialisation's own preference for
              y'_i removed (a white-box attacker can compute both).
  generator   DPDFD: `GENERATOR_SAMPLES` images drawn from the released generator (fixed
              public sampling seed, as `dpdfd.release.sample` releases them). Score: the
              negative Euclidean distance (pixels in [0, 1]) from the canary image to its
              nearest released sample. Student-free: it reads the samples only, not their
              student labels, so it measures what the generator alone carries. The canary
              image is in both worlds (only its label changes), so a sample lands near it
              only through the teacher's answer on it: a teacher that memorised (x_i, y'_i)
              has an island of class y'_i at x_i, and a generator rewarded for images the
              teacher classifies confidently and for covering every class can be drawn there.

Threat model, in words, per kind of artefact: `THREAT_MODELS`; its short name, the table's
column: `THREATS`.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from scipy import special

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpdfd import release as dpdfd_release
from dpkd_jax.methods.dpsgd import step as dpsgd_step
from dpkd_jax.privacy import seeds
from dpkd_jax.models import core
from dpkd_jax.release import students
from dpkd_jax.train import evaluate

SCORE = "log-odds of the canary's wrong label under the released classifier"
SCORES = {
    "student": SCORE, "teacher": SCORE,
    "white_box": "decrease of the loss at the canary's wrong label from the public "
                 "initialisation to the released final parameters",
    "generator": "negative distance from the canary image to its nearest released generator "
                 "sample",
}
THREAT_MODELS = {
    "student": "black-box final model: the released student's logits on the canary images",
    "teacher": "black-box final model: the non-private teacher's logits on the canary images "
               "(power reference: no privacy claimed)",
    "white_box": "white-box last iterate: the released final parameters and the public "
                 "initialisation",
    "generator": "generator samples: images drawn from the released generator, no student",
}
THREATS = {"student": "black-box final model", "teacher": "black-box final model",
           "white_box": "white-box last iterate", "generator": "generator samples"}
GENERATOR_SAMPLES = 10_000  # a released synthetic set of a test split's size
GENERATOR_SEED = 0  # public: sampling a released generator is post-processing


def log_odds(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """(m,) z_y - logsumexp_{j != y} z_j of (m, K) logits at (m,) labels (float64)."""
  logits = np.asarray(logits, np.float64)
  rows = np.arange(len(labels))
  own = logits[rows, labels]
  others = logits.copy()
  others[rows, labels] = -np.inf
  return own - special.logsumexp(others, axis=-1)


def model_scores(parts: core.ModelParts, info: data.DatasetInfo, images: np.ndarray,
                 labels: np.ndarray) -> np.ndarray:
  """(m,) scores of (m, H, W, C) uint8 canary images at their (m,) canary labels."""
  return log_odds(evaluate.predict_logits(parts, images, info), labels)


def _log_probs(parts: core.ModelParts, info: data.DatasetInfo, images: np.ndarray,
               labels: np.ndarray) -> np.ndarray:
  logits = np.asarray(evaluate.predict_logits(parts, images, info), np.float64)
  return logits[np.arange(len(labels)), labels] - special.logsumexp(logits, axis=-1)


def white_box_scores(workdir: str, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """(m,) log p_T(y'|x) - log p_0(y'|x) of a DP-SGD run: final parameters against the
  initialisation its public seed gives (`dpsgd.run`: split(root key, 3)[0] initialises)."""
  student = students.load_student(workdir)
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    results = json.load(f)
  if student.spec.method != "dpsgd" or student.spec.features != "pixels":
    raise errors.UserError("the white-box score knows DP-SGD runs on pixels only")
  if not isinstance(results.get("seed"), int):
    raise errors.UserError("the white-box audit needs the public initialisation: give the "
                           "DP-SGD run a --seed (its seed is secret)")
  config = dpsgd.DPSGDConfig(**results["config"])
  initial = dpsgd_step.init_model(config, jax.random.split(seeds.root_key(results["seed"]),
                                                           3)[0])
  info = student.spec.info
  return (_log_probs(student.parts, info, images, labels)
          - _log_probs(initial, info, images, labels))


def nearest_distances(images: np.ndarray, samples: np.ndarray, *,
                      chunk: int = 2000) -> np.ndarray:
  """(m,) Euclidean distance of each (m, H, W, C) uint8 image to its nearest of the (n, H, W,
  C) uint8 samples, pixels scaled to [0, 1] (float64; in chunks of samples)."""
  x = np.asarray(images, np.float64).reshape(len(images), -1) / 255.0
  best = np.full(len(x), np.inf)
  for start in range(0, len(samples), chunk):
    g = np.asarray(samples[start:start + chunk], np.float64).reshape(-1, x.shape[1]) / 255.0
    sq = (x ** 2).sum(1)[:, None] + (g ** 2).sum(1)[None, :] - 2.0 * x @ g.T
    best = np.minimum(best, sq.min(axis=1))
  return np.sqrt(np.maximum(best, 0.0))


def generator_scores(workdir: str, images: np.ndarray) -> np.ndarray:
  """(m,) minus the distance to the nearest of the samples the run's generator releases
  (`dpdfd.release.sample`, written beside the run as released_samples.npz)."""
  path = dpdfd_release.sample(workdir, GENERATOR_SAMPLES, seed=GENERATOR_SEED,
                              out_path=os.path.join(os.path.dirname(os.path.abspath(
                                  workdir)), "released_samples.npz"))
  with np.load(path) as released:
    return -nearest_distances(images, released["x"])


def released_scores(workdir: str, kind: str, images: np.ndarray,
                    labels: np.ndarray) -> np.ndarray:
  """(m,) scores from the artefact a finished run in `workdir` releases.

  Args:
    workdir: the run's directory.
    kind: "student" (a private method's run), "teacher" (a teacher's run), "white_box" (a
      DP-SGD run) or "generator" (a DPDFD run): `THREAT_MODELS`.
    images, labels: the public view of the design (`canaries.public_view`).
  """
  if kind == "student":
    student = students.load_student(workdir)
    return model_scores(student.parts, student.spec.info, images, labels)
  if kind == "white_box":
    return white_box_scores(workdir, images, labels)
  if kind == "generator":
    return generator_scores(workdir, images)
  if kind == "teacher":
    loaded = teacher_lib.load_teacher(workdir)
    info = data.DATASETS[loaded.card["dataset"]]
    return model_scores(loaded.parts, info, images, labels)
  raise ValueError(f"kind must be one of {sorted(THREAT_MODELS)}, got {kind!r}")
