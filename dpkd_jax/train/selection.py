"""Model selection on a validation hold-out, the test split read once at the end.

Selecting a configuration, a stopping point or a best-of on the test split overstates the
accuracy it reports; selecting on private records without noise costs privacy that ε does not
cover (docs/privacy.md, "Selection and tuning"). Every method therefore takes
`--validation_examples` (the config field `validation_examples`, as DP-SGD does): that many
records of its private training split are held out by one fixed split (seed 0, the same for
every method and for the teacher trainer, so a teacher trained with the same count never saw
the hold-out). With a hold-out:

* the evaluations during training (curves, evaluation windows) read the hold-out only, and its
  figures go to the private diagnostics (`outputs.PrivateDiagnosticsWriter`, tags
  `private_diagnostics/validation/...`; results.json's "private_diagnostics"): the hold-out is
  private data and its accuracy a noiseless statistic of it (ε = inf);
* the test split is read once, after training, for the released figures;
* the record says `selection: "validation"`.

Without one (`validation_examples = 0`, the default) a run keeps its evaluations on the test
split as before and its record says `selection: "none"` (the run selects nothing itself; how
its flags were chosen is the publisher's to state on a committed record).

`selection` values of a record (`records.SELECTIONS`): "validation" (chosen on a validation
hold-out), "test" (chosen by test accuracy: overstated), "paper_recipe" (the settings a paper
fixed, not tuned here), "none" (nothing selected).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.data import splits
from dpkd_jax.train import outputs

# The hold-out's split seed: fixed, so that tuning runs and teachers of every method share one.
VALIDATION_SEED = 0
FIELD = "validation_examples"


def hold_out_indices(num_examples: int, count: int) -> tuple[np.ndarray, np.ndarray]:
  """(kept indices, held-out indices), both sorted: `count` of `num_examples` records held out
  by `np.random.default_rng(VALIDATION_SEED).permutation` (the split DP-SGD has always used);
  a count that leaves no record is a UserError."""
  try:
    return splits.hold_out_indices(num_examples, count, seed=VALIDATION_SEED)
  except ValueError as e:
    if "leaves no training records" in str(e):
      raise errors.UserError(str(e)) from None
    raise


def config_json(config: Any) -> dict[str, Any]:
  """`dataclasses.asdict(config)` without `validation_examples` at 0: a run without a hold-out
  saves the config it saved before the field existed, so older workdirs keep resuming."""
  return omit_default(dataclasses.asdict(config))


def omit_default(config_json_: dict[str, Any]) -> dict[str, Any]:
  """`config_json_` without `validation_examples` when it is 0 (see `config_json`)."""
  if not config_json_.get(FIELD):
    config_json_.pop(FIELD, None)
  return config_json_


def hold_out(train: Any, count: int) -> tuple[Any, Any | None]:
  """(training records, validation records) of a dataset with `subset` and `len`; (train,
  None) for count = 0."""
  if count == 0:
    return train, None
  kept, held = hold_out_indices(len(train), count)
  return train.subset(kept), train.subset(held)


def validation_split(dataset: str, count: int, *, data_dir: str | None = None,
                     download: bool = False) -> Any | None:
  """The hold-out of `count` records of `dataset`'s training split (None for 0): for a method
  that does not otherwise read that split (its teachers trained on it)."""
  if not count:
    return None
  return hold_out(data.load(dataset, "train", data_dir=data_dir, download=download), count)[1]


def teachers_split_monitor(config: Any, workdir: str, test: Any, *,
                           resume_step: int | None) -> "Monitor":
  """The `Monitor` of a data-free run (DPDFD, SRR): its hold-out is `config.validation_examples`
  records of the training split its teachers were trained on (`validation_split`)."""
  return Monitor(workdir, test, validation_split(
      config.dataset, config.validation_examples, data_dir=config.data_dir,
      download=getattr(config, "download", False)), resume_step=resume_step)


class Monitor:
  """What a run evaluates while it trains, and the one test evaluation at the end.

  Attributes:
    test: the test split. validation: the hold-out, or None.
    last: the last figures of the hold-out ({} before any): private diagnostics.
  """

  def __init__(self, workdir: str, test: Any, validation: Any | None, *,
               resume_step: int | None = None):
    self.test, self.validation, self.last = test, validation, {}
    self._private = (None if validation is None else
                     outputs.PrivateDiagnosticsWriter(workdir, resume_step=resume_step))

  @property
  def selection(self) -> str:
    return "none" if self.validation is None else "validation"

  def during(self, evaluate: Callable[[Any], dict[str, float]], step: int,
             writer: Any, *, prefix: str = "test/") -> dict[str, float] | None:
    """Evaluates during training: on the test split (written to `writer` under `prefix`, as
    runs without a hold-out always did; returned), or on the hold-out (written to the private
    diagnostics under "validation/"; None returned: nothing released)."""
    if self.validation is None:
      metrics = evaluate(self.test)
      if writer is not None:  # None: the caller writes the test figures itself
        writer.write(step, metrics, prefix=prefix)
      return metrics
    self.last = dict(evaluate(self.validation))
    self._private.write(step, self.last, prefix="validation/")
    return None

  def accuracy(self, evaluate: Callable[[Any], dict[str, float]], step: int, writer: Any, *,
               prefix: str = "test/") -> float:
    """`during`'s accuracy: of the test split, or of the hold-out (private)."""
    metrics = self.during(evaluate, step, writer, prefix=prefix)
    return (self.last if metrics is None else metrics)["accuracy"]

  def private_values(self) -> dict[str, Any]:
    """The private diagnostics' entries of the hold-out ({} without one)."""
    if self.validation is None:
      return {}
    return {**{f"validation_{k}": v for k, v in self.last.items()},
            FIELD: len(self.validation)}

  def close(self) -> None:
    if self._private is not None:
      self._private.close()
