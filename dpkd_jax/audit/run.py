"""`run_audit`: one training run with canaries, scored from its release, audited.

Workdir layout (`<workdir>` is the audit's):

  canaries/   SECRET: canary_design.json (the audit key's seed, the inclusion bits) and
              <dataset>.npz (the training split with the canaries inserted, the test split
              unchanged): the run's data_dir. Never released.
  run/        the method's own workdir, as its CLI writes it; its record.json (and
              results.json / model_card.* where the method writes them) gain an `audit` block
              (the first threat model's) and `audit_threat_models` (every threat model's).
  audit.json  the audit blocks alone, by threat model.
  threat_models/<kind>/record.json
              for each further threat model (DP-SGD's white-box last iterate, DPDFD's
              generator samples): the run's record with that threat model's block as its
              `audit`, to publish as a row of its own.

The audit block is a statistic of the released artefact and of the design (not of the private
data beyond what the release already carries), so it is released with the run: bounds, AUROC,
TPR, m, δ, confidence, score, threat model, and whether the bound exceeds the sound claim. The
inclusion bits and the key stay in canaries/.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable

import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.audit import canaries as canaries_lib
from dpkd_jax.audit import scores as scores_lib
from dpkd_jax.audit import statistics
from dpkd_jax.release import model_card
from dpkd_jax.train import records

CANARY_DIR, RUN_DIR, AUDIT_FILE, THREAT_DIR = "canaries", "run", "audit.json", "threat_models"
AUDIT_KEY, THREATS_KEY = "audit", "audit_threat_models"


def prepare(workdir: str, dataset: str, *, data_dir: str | None, m: int, seed: int | None,
            design_from: str | None = None, rows: Callable[[int], np.ndarray] | None = None
            ) -> tuple[canaries_lib.CanaryDesign, str]:
  """(design, the run's data_dir): draws the design and writes the canary data, or reads back
  the design of an earlier invocation in `workdir` or, given, of the audit in `design_from`
  (same m and, if given, seed): a conversion audited with its audited teacher's canaries.

  The run reads `<dataset>.npz` from the returned directory, so a dataset that is not read
  from a file (the embedded `digits`) is refused: its run would train without the canaries.
  `rows(N)`, the method's private rows of the N training records (`methods.AuditedMethod`),
  restricts the canaries to them; a reused design with a canary outside them is refused.
  """
  if dataset == "digits":
    raise errors.UserError("--dataset=digits is built in, not read from a .npz, so its run "
                           "cannot be given canaries; audit mnist or fashion_mnist")
  train = data.load(dataset, "train", data_dir=data_dir)
  test = data.load(dataset, "test", data_dir=data_dir)
  secret = os.path.join(workdir, CANARY_DIR)
  source = secret if design_from is None else os.path.join(design_from, CANARY_DIR)
  if design_from is not None and not os.path.exists(
      os.path.join(source, canaries_lib.DESIGN_FILE)):
    raise errors.UserError(f"{design_from!r} holds no audit design ({CANARY_DIR}/"
                           f"{canaries_lib.DESIGN_FILE}); give the --workdir of a finished "
                           "`experiments.audit --method=teacher`")
  eligible = np.arange(len(train)) if rows is None else np.asarray(rows(len(train)))
  if os.path.exists(os.path.join(source, canaries_lib.DESIGN_FILE)):
    design = canaries_lib.load_design(source)
    if design.m != m or (seed is not None and seed != design.seed):
      raise errors.UserError(f"{workdir!r} holds an audit of {design.m} canaries with another "
                             "key; give the same --canaries and --audit_seed, or a fresh workdir")
    if not np.isin(design.indices, eligible).all():
      raise errors.UserError(f"the audit design in {source!r} has canaries outside this run's "
                             "private training records (e.g. in its public part); audit this "
                             "method without --teacher_audit")
  else:
    if not 2 <= m <= len(eligible):
      raise errors.UserError(f"--canaries={m} must be in [2, {len(eligible)}] (the private "
                             f"training records of {dataset} in this run)")
    design = canaries_lib.design_canaries(train.labels, train.info.num_classes, m, seed=seed,
                                          rows=None if rows is None else eligible)
  canaries_lib.write_dataset(secret, dataset, canaries_lib.insert(train, design), test)
  canaries_lib.save_design(secret, design)
  return design, secret


def audit_release(workdir: str, dataset: str, design: canaries_lib.CanaryDesign, *,
                  kinds: tuple[str, ...], data_dir: str | None,
                  confidence: float = statistics.CONFIDENCE) -> dict[str, Any]:
  """Scores the release in `<workdir>/run` (public view only) under each threat model of
  `kinds`, audits, writes the blocks (each with the CPU seconds of its scoring and statistics:
  the run's own are its record's). Returns the first kind's block."""
  train = data.load(dataset, "train", data_dir=data_dir)
  images, labels = canaries_lib.public_view(train, design)
  run_dir = os.path.join(workdir, RUN_DIR)
  record = records.read_record(os.path.join(run_dir, "record.json"))
  blocks = {kind: _block(run_dir, record, kind, design, images, labels, confidence)
            for kind in kinds}
  write_block(run_dir, blocks[kinds[0]], others=blocks)
  for kind in kinds[1:]:
    path = os.path.join(workdir, THREAT_DIR, kind)
    os.makedirs(path, exist_ok=True)
    records.write_record(os.path.join(path, "record.json"), {**record, AUDIT_KEY: blocks[kind]})
  with open(os.path.join(workdir, AUDIT_FILE), "w", encoding="utf-8") as f:
    json.dump(blocks, f, indent=2)
  return blocks[kinds[0]]


def _block(run_dir: str, record: dict[str, Any], kind: str,
           design: canaries_lib.CanaryDesign, images: np.ndarray, labels: np.ndarray,
           confidence: float) -> dict[str, Any]:
  """The audit block of one threat model (`scores.THREAT_MODELS`)."""
  start = time.process_time()
  scores = scores_lib.released_scores(run_dir, kind, images, labels)
  delta = record["delta"] or 1e-5  # a non-private run claims nothing: audit at δ = 1e-5
  result = statistics.audit_scores(scores, design.included, delta=delta, confidence=confidence,
                                   score=scores_lib.SCORES[kind],
                                   threat_model=scores_lib.THREAT_MODELS[kind])
  block = {**result.to_json(), "threat": scores_lib.THREATS[kind],
           "canaries": "mislabelled training records (dpkd_jax.audit)",
           "audit_cpu_seconds": round(time.process_time() - start, 1),
           "exceeds_sound_claim": _exceeds(result.epsilon_lower_bound, record["sound_epsilon"])}
  if record.get("paper_epsilon") is not None:
    block["exceeds_paper_claim"] = _exceeds(result.epsilon_lower_bound, record["paper_epsilon"])
  if block["exceeds_sound_claim"]:
    print(f"PRIVACY DEFECT: the audit's lower bound {result.epsilon_lower_bound:.3f} "
          f"({block['threat']}) exceeds the sound epsilon {record['sound_epsilon']} of "
          f"{run_dir}", file=sys.stderr)
  return block


def _exceeds(bound: float, claim: Any) -> bool:
  return claim != "inf" and not (isinstance(claim, (int, float)) and math.isinf(claim)) and (
      bound > float(claim))


def write_block(run_dir: str, block: dict[str, Any],
                others: dict[str, dict[str, Any]] | None = None) -> None:
  """Adds `block` under `audit` (and, with more than one threat model, `others` under
  `audit_threat_models`) to the run's record.json and results.json, rewrites its card."""
  extra = {THREATS_KEY: others} if others and len(others) > 1 else {}
  record_path = os.path.join(run_dir, "record.json")
  record = records.read_record(record_path)
  records.write_record(record_path, {**record, AUDIT_KEY: block, **extra})
  results_path = os.path.join(run_dir, "results.json")
  if os.path.exists(results_path):
    with open(results_path, encoding="utf-8") as f:
      results = json.load(f)
    with open(results_path, "w", encoding="utf-8") as f:
      json.dump({**results, AUDIT_KEY: block, **extra}, f, indent=2)
    model_card.write_model_card(run_dir)


def run_audit(train: Callable[[str, str], Any], *, workdir: str, dataset: str,
              data_dir: str | None, kinds: tuple[str, ...], m: int, seed: int | None = None,
              confidence: float = statistics.CONFIDENCE, design_from: str | None = None,
              rows: Callable[[int], np.ndarray] | None = None) -> dict[str, Any]:
  """Inserts m canaries, trains once, audits the release (module docstring).

  Args:
    train: `train(canary_data_dir, run_workdir)` runs the method end to end on `dataset` read
      from `canary_data_dir`, writing its run into `run_workdir` (resuming one there).
    workdir, dataset, data_dir: the audit's directory; the dataset and where it is read.
    kinds: the threat models scored (`scores.THREAT_MODELS`); the first is the record's
      `audit`.
    m, seed: canaries and the audit key's seed (None: secret).
    confidence: of the bounds.
    design_from: an audit workdir whose design to reuse (its teacher's canaries).
    rows: `rows(N)`, the rows of the N training records the run keeps private and trains on
      (None: all); the canaries are drawn among them.

  Returns:
    The first threat model's audit block (also in `<workdir>/run/record.json`).
  """
  unknown = [kind for kind in kinds if kind not in scores_lib.THREAT_MODELS]
  if not kinds or unknown:
    raise ValueError(f"kinds must be of {sorted(scores_lib.THREAT_MODELS)}, got {kinds!r}")
  design, canary_dir = prepare(workdir, dataset, data_dir=data_dir, m=m, seed=seed,
                               design_from=design_from, rows=rows)
  train(canary_dir, os.path.join(workdir, RUN_DIR))
  return audit_release(workdir, dataset, design, kinds=tuple(kinds), data_dir=data_dir,
                       confidence=confidence)
