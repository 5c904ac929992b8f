"""Which names a run releases, and the one place that sends private statistics apart.

A noiseless function of private data (a model's accuracy on held-out private training
records, a non-private teacher's test accuracy, ...) has ε = ∞: it must never sit beside the
released figures. This module declares those names once, and every writer of a run's files
routes by it, so a method that adds such a statistic gets it kept apart without further code:

  * `train.metrics.MetricsWriter` sends a private metric name (`is_private_metric`:
    "validation/accuracy", ...) to `PRIVATE_CSV` / `PRIVATE_TB_DIR`, tags prefixed
    `PRIVATE_TAG_PREFIX`, never to metrics.csv / tb/.
  * `train.outputs.finish_run` moves a private field (`is_private_field`:
    "validation_accuracy", "teacher_test_accuracy", ...) of results.json's top level into its
    `PRIVATE_KEY` block, and `train.records.make_record` moves one of a record's extra fields
    into the record's own `PRIVATE_KEY` block (`{"_note": PRIVATE_NOTE, name: value, ...}`);
    `records.validate_record` refuses a record that holds one at its top level.
  * `train.report` never plots a private metric; `release.model_card` names the private
    diagnostics, never their values.

`RELEASED_RECORD_FIELDS` is the allow-list of a record's top-level fields (the schema's
`records.RECORD_FIELDS`, the settings and figures the methods release, and the publishing
fields of docs/results/): `tests/test_released_fields.py` holds every committed record and a
real run's files to it. A new released field is added here, with what it is.

Selection on a private validation hold-out: the setting (`validation_examples`, how many
records were held out) is released; the validation statistics are private.
"""

from __future__ import annotations

from typing import Any, Mapping

PRIVATE_KEY = "private_diagnostics"
PRIVATE_NOTE = ("noiseless functions of private data or of the non-private teacher: NOT "
                "covered by epsilon, do not publish")
PRIVATE_CSV = "private_diagnostics.csv"
PRIVATE_TB_DIR = "private_diagnostics_tb"
PRIVATE_TAG_PREFIX = "private_diagnostics/"

# Top-level names of results.json / record.json that are noiseless private statistics.
PRIVATE_FIELDS = frozenset({
    "validation_accuracy", "validation_loss",  # a model on held-out private training records
    "teacher_test_accuracy", "teacher_accuracy",  # the non-private teacher(s)
    "teacher_mean", "teacher_plurality", "teacher_ensemble", "teachers",
    "teachers_before_self_training",
})
# Any field or metric whose name starts so is a statistic of a private hold-out ...
PRIVATE_PREFIXES = ("validation_", "validation/")
# ... except these settings: what was held out, not what was measured on it.
RELEASED_SETTINGS = frozenset({"validation_examples"})

# The allow-list of a record's top-level fields (beyond `PRIVATE_KEY`, the private block).
RELEASED_RECORD_FIELDS = frozenset({
    # the schema (records.RECORD_FIELDS; a test checks that they are all here)
    "method", "dataset", "command", "commit", "test_accuracy", "sound_epsilon", "delta",
    "neighbouring", "accounting", "paper_epsilon", "paper_row", "paper_accuracy",
    "cpu_seconds", "wall_seconds",
    # a run's own record: warnings, the cost across resumes, the settings its tables show
    "warnings", "segments", "commits", "clock_incomplete",
    "model", "features", "norm", "noise_multiplier", "steps", "expected_batch_size",
    "l2_clip_norm", "learning_rate", "epochs", "lr_schedule", "standardize_noise_multiplier",
    "param_averaging_decay", "param_averaging_start_step", "augmult", "augmult_max_shift",
    "validation_examples", "params", "param_count", "pretrain_steps", "final_metrics",
    # released figures: ε under another relation or accounting, the paper's own scope
    "epsilon_add_remove", "pure_epsilon", "pure_delta", "paper_epsilon_per_query",
    "paper_epsilon_scope", "release_epsilon_given_generator", "epsilon_note",
    # a one-run canary audit of the released classifier (dpkd_jax/audit): bounds and attack
    # figures computed from the release and the auditor's canary design; the design (its key,
    # the inclusion bits, the canaries' records) stays in the audit's secret canaries/ folder
    "audit",
    # how a figure was chosen (a description of the selection, never a private value)
    "selection",
    # publishing fields of docs/results/ (docs/results/README.md)
    "tables", "columns", "text", "bold", "single_seed", "regenerated", "source", "seed_of",
    "combined_from", "name", "command_note", "record_note",
})


def is_private_field(name: str) -> bool:
  """True if the top-level field `name` of results.json / record.json is a private statistic."""
  return name not in RELEASED_SETTINGS and (
      name in PRIVATE_FIELDS or name.startswith(PRIVATE_PREFIXES))


def is_private_metric(name: str) -> bool:
  """True if the metric `name` (metrics.csv, e.g. "validation/accuracy") is a private
  statistic: its first path component is a private field or a private prefix."""
  head = name.split("/", 1)[0]
  return name.startswith(PRIVATE_PREFIXES) or is_private_field(head)


def split_fields(fields: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """(released, private): `fields` split by `is_private_field`, order kept."""
  released = {k: v for k, v in fields.items() if not is_private_field(k)}
  return released, {k: v for k, v in fields.items() if is_private_field(k)}


def with_private(section: Mapping[str, Any] | None, values: Mapping[str, Any]
                 ) -> dict[str, Any]:
  """A `PRIVATE_KEY` block: `section` (or a new one with its note) with `values` added."""
  block = dict(section) if section else {"_note": PRIVATE_NOTE}
  block.setdefault("_note", PRIVATE_NOTE)
  files = block.pop("files", None)  # the files stay last
  block.update(values)
  if files is not None:
    block["files"] = files
  return block


def move_private_fields(payload: dict[str, Any]) -> dict[str, Any]:
  """Moves the private top-level fields of `payload` (results.json or a record) into its
  `PRIVATE_KEY` block, in place; returns `payload`. Without one it is left as it is."""
  _, private = split_fields({k: v for k, v in payload.items() if k != PRIVATE_KEY})
  if private:
    for key in private:
      del payload[key]
    payload[PRIVATE_KEY] = with_private(payload.get(PRIVATE_KEY), private)
  return payload
