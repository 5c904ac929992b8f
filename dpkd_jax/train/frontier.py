"""The sound privacy–utility frontier: the best releasable student at each ε, per setting.

A user who must release a model asks: at my ε, with what I hold, which method gives the best
student? The answer is computed here, from the committed results records only
(`docs/results/*.json`, `dpkd_jax.train.records`), and drawn / written by
`python -m experiments.plot frontier` (`dpkd_jax.plotting.plot_frontier`,
`dpkd_jax.train.frontier_doc`):

* `METHOD_SETTINGS` is the one map method -> setting (what the user holds); `EXCLUDED_METHODS`
  names the methods whose records are never frontier points, and why. A method in neither is
  an error, so a new method cannot slip onto (or off) the plot unnoticed.
* A frontier point is a record with sound accounting, a finite sound ε, replace-one
  neighbouring, δ <= `DELTA` and a test accuracy (`exclusion` says why a record is not one).
  A paper-accounting record is at most a separate marker at its paper's ε (`paper_points`),
  never a frontier point.
* `best_at_or_below`: at each ε of the grid, the best point with sound ε <= that ε (a run at
  ε 0.1 is also a run at ε <= 10).
* `ANCHORS`: published figures the issue compares against, each with its citation and the
  guarantee it states (often add/remove or a paper's own accounting): hollow markers, never
  frontier points.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

from dpkd_jax.errors import UserError

Record = dict[str, Any]

EPSILON_GRID = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
DELTA = 1e-5  # the δ of the comparison tables; a record at a larger δ is no frontier point
NEIGHBOURING = "replace-one"  # the relation of the comparison tables


@dataclasses.dataclass(frozen=True)
class Setting:
  """What the user holds besides the model to release.

  Attributes:
    key: identifier used by `METHOD_SETTINGS` and the anchors.
    label: short display name (plot legend, table header).
    holds: one sentence: the data the methods of this setting need.
  """

  key: str
  label: str
  holds: str


SETTINGS = (
    Setting("private", "private data only",
            "the labelled private data, nothing public (the model is trained on it under DP)"),
    Setting("public_unlabelled", "private + public unlabelled",
            "the labelled private data and unlabelled public data of the same domain"),
    Setting("public_labelled", "private + public labelled",
            "a private teacher (or its data) and labelled public data (RONA's self learning "
            "trains on the public labels)"),
    Setting("teachers", "teachers only (data-free)",
            "teachers trained on the private data, and no data at all at distillation time"),
)
_SETTING_KEYS = tuple(s.key for s in SETTINGS)

# The one map method -> setting of the frontier. RONA needs labelled public data: its self
# learning is cross-entropy on the public labels (methods/rona), so it is not placed with the
# methods that need only unlabelled public data.
METHOD_SETTINGS: dict[str, str] = {
    "dpsgd": "private",
    "rknn": "public_unlabelled",
    "rona": "public_labelled",
    "dfpate": "teachers",
    "dpdfd": "teachers",
    "srr": "teachers",
}
# Methods with records that are never frontier points, and why.
EXCLUDED_METHODS: dict[str, str] = {
    "dpdfd_direct": "DPDFD direct mode is not DP (sound ε = ∞)",
    "teacher": "a non-private teacher, not a released student",
    "srr_generator": "an SRR generator pretrained against the teacher, not a released student",
}
METHOD_LABELS = {"dpsgd": "DP-SGD", "rknn": "reverse k-NN", "rona": "RONA",
                 "dfpate": "data-free PATE", "dpdfd": "DPDFD", "srr": "SRR"}
DATASET_ORDER = ("mnist", "fashion_mnist", "digits")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Point:
  """One record as a frontier point (or, in `paper_points`, a paper-accounting marker).

  Attributes:
    name: the record's file name without .json.
    method, dataset, setting: of the record; setting is a `SETTINGS` key.
    epsilon: sound ε (for a paper marker: the paper's ε, NOT a guarantee).
    accuracy: the student's test accuracy.
    single_seed: the record is one seed (records say `single_seed`; absent counts as one).
    record: the record itself, numbers as read (for display with the record's digits).
  """

  name: str
  method: str
  dataset: str
  setting: str
  epsilon: float
  accuracy: float
  single_seed: bool
  record: Record = dataclasses.field(compare=False, repr=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anchor:
  """A published figure drawn beside the frontier (hollow marker), never a frontier point.

  Attributes:
    dataset, setting: where it is drawn (`SETTINGS` key).
    label: short name for the legend.
    accuracy, epsilon, delta: the published figure.
    guarantee: the relation and accounting behind its ε, as published.
    citation: where the figure comes from.
  """

  dataset: str
  setting: str
  label: str
  accuracy: float
  epsilon: float
  delta: float
  guarantee: str
  citation: str


_TEMPERED = ("Papernot, Thakurta, Song, Chien, Erlingsson, \"Tempered Sigmoid Activations for "
             "Deep Learning with Differential Privacy\", AAAI 2021 (arXiv:2007.14191)")
_SCATTER = ("Tramèr & Boneh, \"Differentially Private Learning Needs Better Features (or Much "
            "More Data)\", ICLR 2021 (arXiv:2011.11660); its figure is for ε about 3, drawn at "
            "the ε of the tempered-sigmoid row it is compared with")
_RKNN = ("Li et al., \"Fine-grained private knowledge distillation\" (arXiv:2207.13253), "
         "40 queries on DTI clusters of 5,000 public test images")
_RONA = ("Wang et al., \"Private Model Compression via Knowledge Distillation\" (RONA), "
         "AAAI 2019")
_PATE = ("Papernot et al., \"Scalable Private Learning with PATE\", ICLR 2018 (Confident-GNMax, "
         "public unlabelled data; the anchor of the data-free PATE row)")
_DPSGD_GUARANTEE = "add/remove, RDP of subsampled Gaussian (the paper's accounting)"

# The published anchors, one place for the plot and for docs/CHOOSING.md.
ANCHORS = (
    Anchor(dataset="mnist", setting="private", label="tempered-sigmoid CNN", accuracy=0.981,
           epsilon=2.93, delta=1e-5, guarantee=_DPSGD_GUARANTEE, citation=_TEMPERED),
    Anchor(dataset="fashion_mnist", setting="private", label="tempered-sigmoid CNN",
           accuracy=0.861, epsilon=2.7, delta=1e-5, guarantee=_DPSGD_GUARANTEE,
           citation=_TEMPERED),
    Anchor(dataset="mnist", setting="private", label="ScatterNet features", accuracy=0.987,
           epsilon=2.93, delta=1e-5, guarantee=_DPSGD_GUARANTEE, citation=_SCATTER),
    Anchor(dataset="fashion_mnist", setting="private", label="ScatterNet features",
           accuracy=0.897, epsilon=2.7, delta=1e-5, guarantee=_DPSGD_GUARANTEE,
           citation=_SCATTER),
    Anchor(dataset="mnist", setting="public_unlabelled", label="reverse k-NN paper",
           accuracy=0.991, epsilon=0.1, delta=0.0,
           guarantee="pure ε, central Laplace votes (the paper's statement)", citation=_RKNN),
    Anchor(dataset="mnist", setting="public_unlabelled", label="reverse k-NN paper, local DP",
           accuracy=0.985, epsilon=0.4, delta=0.0,
           guarantee="pure local ε per record (the paper's statement)", citation=_RKNN),
    Anchor(dataset="mnist", setting="public_unlabelled", label="PATE with public data",
           accuracy=0.985, epsilon=1.97, delta=1e-5,
           guarantee="data-dependent ε of Confident-GNMax (the paper's accounting)",
           citation=_PATE),
    Anchor(dataset="mnist", setting="public_labelled", label="RONA paper", accuracy=0.9864,
           epsilon=7.68, delta=1e-5,
           guarantee="the paper's own accounting (not this library's sound figure)",
           citation=_RONA),
)


def setting_of(method: str) -> str | None:
  """The `SETTINGS` key of `method`; None for an excluded method.

  Raises:
    UserError: a method in neither `METHOD_SETTINGS` nor `EXCLUDED_METHODS`.
  """
  if method in METHOD_SETTINGS:
    return METHOD_SETTINGS[method]
  if method in EXCLUDED_METHODS:
    return None
  raise UserError(f"records of method {method!r}: dpkd_jax/train/frontier.py places it in no "
                  "setting; add it to METHOD_SETTINGS or EXCLUDED_METHODS")


def _epsilon(value: Any) -> float:
  return math.inf if value == "inf" else float(value)


def exclusion(record: Record) -> str | None:
  """Why `record` is not a frontier point (one short reason), or None if it is one."""
  if setting_of(record["method"]) is None:
    return EXCLUDED_METHODS[record["method"]]
  if record.get("audit"):
    return "an audit run (trained with mislabelled canaries inserted: dpkd_jax/audit)"
  if record.get("seed_of"):
    return f"one seed of {record['seed_of']} (the mean over its seeds is the point)"
  if record.get("validation_examples"):
    return "a tuning run (trained beside a validation hold-out; picking it by test accuracy "\
           "would tune on the test split)"
  if record["accounting"] != "sound":
    return "paper accounting (its ε is not a guarantee)"
  if math.isinf(_epsilon(record["sound_epsilon"])):
    return "no guarantee (sound ε = ∞)"
  if record["test_accuracy"] is None:
    return "no student accuracy"
  if record["neighbouring"] != NEIGHBOURING:
    return f"{record['neighbouring']} neighbouring, not {NEIGHBOURING}"
  if float(record["delta"]) > DELTA:
    return f"δ above {DELTA:g}"
  return None


def _point(name: str, record: Record, epsilon: float) -> Point:
  return Point(name=name, method=record["method"], dataset=record["dataset"],
               setting=METHOD_SETTINGS[record["method"]], epsilon=epsilon,
               accuracy=float(record["test_accuracy"]),
               single_seed=record.get("single_seed", True) is not False, record=record)


def frontier_points(records: dict[str, Record]) -> list[Point]:
  """The records that are frontier points, in name order."""
  return [_point(name, r, _epsilon(r["sound_epsilon"])) for name, r in sorted(records.items())
          if exclusion(r) is None]


def paper_points(records: dict[str, Record]) -> list[Point]:
  """Paper-accounting records of frontier methods, at their paper's ε (NOT a guarantee): at
  most separate markers, never frontier points."""
  found = []
  for name, r in sorted(records.items()):
    paper = r["paper_epsilon"]
    if (r["accounting"] == "paper" and setting_of(r["method"]) is not None
        and r["test_accuracy"] is not None and paper not in (None, "inf")
        and 0 < float(paper) < math.inf):
      found.append(_point(name, r, float(paper)))
  return found


def _rank(point: Point) -> tuple:
  # Best first: higher accuracy, then less ε spent, then several seeds, then by name.
  return (-point.accuracy, point.epsilon, point.single_seed, point.name)


def best_at_or_below(points: Iterable[Point], grid: Sequence[float] = EPSILON_GRID
                     ) -> tuple[Point | None, ...]:
  """At each ε of `grid`, the best point with sound ε <= that ε (None: no such point)."""
  ranked = sorted(points, key=_rank)
  return tuple(next((p for p in ranked if p.epsilon <= eps), None) for eps in grid)


def datasets(records: dict[str, Record]) -> list[str]:
  """The datasets with a frontier point or an anchor: mnist, fashion_mnist, digits first."""
  found = {p.dataset for p in frontier_points(records)} | {a.dataset for a in ANCHORS}
  return sorted(found, key=lambda d: (DATASET_ORDER.index(d) if d in DATASET_ORDER
                                      else len(DATASET_ORDER), d))


def frontier(records: dict[str, Record], grid: Sequence[float] = EPSILON_GRID
             ) -> dict[str, dict[str, tuple[Point | None, ...]]]:
  """{dataset: {setting key: best point at or below each grid ε}} for `datasets(records)`."""
  points = frontier_points(records)
  return {d: {s: best_at_or_below([p for p in points if p.dataset == d and p.setting == s],
                                  grid)
              for s in _SETTING_KEYS}
          for d in datasets(records)}


def exclusion_counts(records: dict[str, Record], dataset: str) -> dict[str, int]:
  """{reason: number of records of `dataset`} of the records that are no frontier point."""
  counts: dict[str, int] = {}
  for record in records.values():
    reason = exclusion(record) if record["dataset"] == dataset else None
    if reason is not None:
      counts[reason] = counts.get(reason, 0) + 1
  return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def anchors_of(dataset: str) -> list[Anchor]:
  """The anchors drawn for `dataset`."""
  return [a for a in ANCHORS if a.dataset == dataset]


def setting_label(key: str) -> str:
  """The display label of setting `key`."""
  return next(s.label for s in SETTINGS if s.key == key)
