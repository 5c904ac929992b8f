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

Threat model, in words, per kind of artefact: `THREAT_MODELS`.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from dpkd_jax import data
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.models import core
from dpkd_jax.release import students
from dpkd_jax.train import evaluate

SCORE = "log-odds of the canary's wrong label under the released classifier"
THREAT_MODELS = {
    "student": "black-box final model: the released student's logits on the canary images",
    "teacher": "black-box final model: the non-private teacher's logits on the canary images "
               "(power reference: no privacy claimed)",
}


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


def released_scores(workdir: str, kind: str, images: np.ndarray,
                    labels: np.ndarray) -> np.ndarray:
  """(m,) scores from the artefact a finished run in `workdir` releases.

  Args:
    workdir: the run's directory.
    kind: "student" (a private method's run) or "teacher" (a teacher's run).
    images, labels: the public view of the design (`canaries.public_view`).
  """
  if kind == "student":
    student = students.load_student(workdir)
    return model_scores(student.parts, student.spec.info, images, labels)
  if kind == "teacher":
    loaded = teacher_lib.load_teacher(workdir)
    info = data.DATASETS[loaded.card["dataset"]]
    return model_scores(loaded.parts, info, images, labels)
  raise ValueError(f"kind must be one of {sorted(THREAT_MODELS)}, got {kind!r}")
