"""The closing summary of an SRR run: `train.summary.summary_lines`, and a line saying why when
the student ends at chance.

SRR prints its three privacy figures together (`train.summary`), so it keeps that headline
rather than `summary.conversion_lines` (one sound ε); the chance line is the same kind as
DPDFD's (`dpdfd.quickstart.chance_reason`): the cause, with the figure that shows it, and what
to try.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from dpkd_jax import data
from dpkd_jax.methods.srr import config as config_lib
from dpkd_jax.privacy import randomized_response
from dpkd_jax.train import summary

RESULTS_ANCHOR = "docs/RESULTS.md#srr"
ABLATION_ANCHOR = "docs/RESULTS.md#srr-ablation"
STUDENT_ANCHOR = "docs/RESULTS.md#srr-engine"


def chance_reason(results: Mapping[str, Any]) -> str:
  """Why an SRR student is at chance, and what to try (one line).

  The cases, first match: `--generator_prior=none` (queries that stay noise images); a small
  ε per query (stage 1 keeps few teacher labels; a record-level target spread over many
  queries says so); else nearly noiseless labels on queries that do not teach (the generator).
  """
  config = results.get("config", {})
  k = data.DATASETS[config["dataset"]].num_classes
  eps = results.get("epsilon_per_query", config.get("epsilon"))
  eps = math.inf if eps is None else eps
  # Stage 1 has the uniform prior (every class a candidate): plain K-ary RR; 1 at ε = inf.
  keep = float(randomized_response.keep_probability(eps, k))
  labels = (f"stage 1's {k}-ary randomized response keeps the teacher's label with probability"
            f" {keep:.4g} (chance {1 / k:.3g}) at epsilon {eps:.4g} per query")
  target = config.get("target_epsilon")
  if target is not None and config.get("epsilon") is None:
    labels += (f", set by the record-level --target_epsilon={target:g} spread over "
               f"{results.get('num_queries', '?')} queries")
  if results.get("generator_prior") == "none":
    return ("why at chance: --generator_prior=none: the generator sees the teacher only "
            f"through the noisy labels, so its queries stay noise images ({RESULTS_ANCHOR}); "
            f"{labels}; no sound SRR recipe learns yet: try python -m experiments.dfpate")
  if config_lib.labels_mostly_noise(eps, k):
    more = ("fewer queries (--stages, --samples_per_stage) leave more epsilon to each"
            if target is not None and config.get("epsilon") is None else "a larger --epsilon")
    student = config.get("student_model", "lenet5")
    lr = config.get("student_learning_rate", config.get("student_lr", 1e-3))  # (version 1)
    smaller = ("" if student == "lenet5" else
               f", or a --student_learning_rate below {lr:g} (a {student} student can fit such labels' "
               "noise: small_cnn collapsed on Fashion-MNIST at epsilon 1 with 1e-3 and learned "
               f"with 3e-4, {STUDENT_ANCHOR})")
    return (f"why at chance: the labels are mostly noise: {labels}; a student trained on them "
            f"is a poor prior for the later stages; try {more}{smaller}")
  return (f"why at chance: {labels}, so the student did not learn from the generator's "
          f"queries; check the generator pretraining (its BN term matters: {ABLATION_ANCHOR})"
          ", or more --pretrain_steps and --stages")


def summary_lines(results: Mapping[str, Any], workdir: str | None = None) -> list[str]:
  """`train.summary.summary_lines`, then `chance_reason` when the student is at chance."""
  lines = summary.summary_lines(results, workdir=workdir)
  k = data.DATASETS[results["config"]["dataset"]].num_classes
  if summary.at_chance(results["test_accuracy"], k):
    lines.append(chance_reason(results))
  return lines
