"""The printed end-of-run summary of every CLI, from the run's results dict alone.

`summary_lines(results, workdir=...)` gives the method's headline (accuracy and the sound ε
beside any paper figure), then one `WARNING:` line per privacy warning (ε = inf, sound ε above
the target), then where the private diagnostics are (never their values: stdout is an output
too), then the workdir. The CLIs print these lines and nothing else at the end of a run.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping

from dpkd_jax.train import checkpoint
from dpkd_jax.train import outputs
from dpkd_jax.train import records

Results = Mapping[str, Any]


def _eps(value: float | None) -> str:
  if value is None:
    return "n/a"
  return "inf" if math.isinf(value) else f"{value:.4g}"


def _dataset(r: Results) -> str:
  return r.get("dataset") or r.get("config", {}).get("dataset", "?")


def _dpdfd(r: Results) -> list[str]:
  paper = r.get("paper_epsilon")
  return [f"DPDFD {_dataset(r)}: test accuracy {r['test_accuracy']:.4f} after {r['steps']} steps;"
          f" sound epsilon {_eps(r['epsilon'])} (delta={r['delta']:g})"
          + ("" if paper is None
             else f"; paper-formula epsilon {_eps(paper)} (NOT a valid guarantee)")]


def _direct(r: Results) -> list[str]:
  return [f"DPDFD direct {_dataset(r)}: test accuracy {r['test_accuracy']:.4f}; NOT DP (ε = inf);"
          f" paper-formula ε {_eps(r.get('paper_epsilon'))} (not a guarantee)"]


def _dpsgd(r: Results) -> list[str]:
  # `epsilon` is replace-one (the tables' relation); the add/remove figure is shown beside it.
  add_remove = r.get("epsilon_add_remove")
  beside = "" if add_remove is None else f"; add/remove ε={_eps(add_remove)}"
  return [f"dpsgd {r['model']} on {_dataset(r)}: test accuracy {r['test_accuracy']:.4f} at "
          f"ε={_eps(r['epsilon'])} (replace-one{beside}), δ={r['delta']:g} "
          f"(z={r['noise_multiplier']:.4g}, q={r['sampling_rate']:.5f}, "
          f"{r['steps']}/{r['planned_steps']} steps)"]


def _srr(r: Results) -> list[str]:
  teacher = r.get("generator_prior") == "teacher"
  return [f"SRR {_dataset(r)} ({r.get('generator_prior')} prior): test accuracy"
          f" {r['test_accuracy']:.4f} after {r['stages']} stages, {r['num_queries']} queries",
          f"  paper: label-DP per query ε = {_eps(r['paper_label_epsilon_per_query'])}",
          f"  record-level ε = {_eps(r['record_level_epsilon'])} (δ={r['delta']:g})",
          f"  RR composition ε = {_eps(r['labels_epsilon'])}"
          + (" (labels only, conditional on the generator)" if teacher else "")]


def _rknn(r: Results) -> list[str]:
  return [f"rknn {r['mode']} on {_dataset(r)} ({r['representation']}, s={r['num_queries']},"
          f" k={r['k']}): Acc_pl {r['label_accuracy']:.4f}, Acc_pc {r['student_accuracy']:.4f}"
          f" at ε={r['epsilon']:g} (δ=0; ledger {_eps(r['ledger_epsilon'])} at"
          f" δ={r['ledger_delta']:g})"]


def _rona(r: Results) -> list[str]:
  paper, per_query = r.get("paper_epsilon_composed"), r.get("paper_epsilon_per_query")
  lines = [f"rona {r['student_model']} on {_dataset(r)}: test accuracy {r['test_accuracy']:.4f}"
           f" at sound ε={_eps(r['epsilon'])}, δ={r['delta']:g} (σ={r['noise_multiplier']:.4g},"
           f" {r['num_queries_executed']}/{r['num_queries']} queries)"]
  if paper is not None:  # results of earlier versions hold the per-query figure only
    lines.append(f"  paper (NOT a guarantee): Theorem 2 ε {_eps(paper)} over the queries, "
                 f"{_eps(per_query)} per query")
  elif per_query is not None:
    lines[0] += f"; paper per-query ε {_eps(per_query)} (NOT a guarantee)"
  report = r.get("compression")
  if report:
    lines.append(
        f"  teacher {report['teacher']['params']:,} params; student "
        f"{report['student']['params']:,} params; {report['param_ratio']:.1f}x fewer params, "
        f"{report['flops_ratio']:.1f}x fewer FLOPs, {report['speedup_batch1']:.1f}x / "
        f"{report['speedup_batch256']:.1f}x faster at batch 1 / 256")
  return lines


def _dfpate(r: Results) -> list[str]:
  return [f"DF-PATE {_dataset(r)}: test accuracy {r['test_accuracy']:.4f} "
          f"(per round {[round(a, 4) for a in r.get('accuracy_per_round', [])]})",
          f"  sound ε = {_eps(r['epsilon'])} (δ={r['delta']:g}), σ = {r['noise_std']:.4g}, "
          f"{r['num_queries']} queries, {r['answered_queries']} used"]


def _generic(r: Results) -> list[str]:
  return [f"{r.get('method', 'run')}: test accuracy {r.get('test_accuracy')}, "
          f"ε = {_eps(r.get('epsilon'))}"]


HEADLINES: dict[str, Callable[[Results], list[str]]] = {
    "dpdfd": _dpdfd, "dpdfd_direct": _direct, "dpsgd": _dpsgd, "srr": _srr, "rknn": _rknn,
    "rona": _rona, "dfpate": _dfpate,
}


def private_diagnostics_line(results: Results, workdir: str | None = None) -> str | None:
  """"private diagnostics (not covered by epsilon) in <files>", or None if the run has none."""
  section = results.get(outputs.PRIVATE_KEY, {})
  if not outputs.has_private_values(results):
    return None
  join = (lambda p: os.path.join(workdir, p)) if workdir else (lambda p: p)  # noqa: E731
  where = []
  if any(k not in ("_note", "files") for k in section):
    where.append(f"{join('results.json')} [\"{outputs.PRIVATE_KEY}\"]")
  where += [join(p) for p in section.get("files", [])]
  return f"private diagnostics (not covered by epsilon) in {', '.join(where)}"


def summary_lines(results: Results, *, workdir: str | None = None) -> list[str]:
  """The end-of-run lines of `results` (module docstring)."""
  lines = HEADLINES.get(results.get("method"), _generic)(results)
  lines += [f"WARNING: {w}" for w in results.get("warnings", [])]
  private = private_diagnostics_line(results, workdir)
  if private:
    lines.append(private)
  if workdir:
    lines.append(f"-> {workdir} (results.json, record.json)")
  return lines


CHANCE_MARGIN = 0.05  # accuracy within this of 1/num_classes counts as chance


def at_chance(accuracy: float, num_classes: int, margin: float = CHANCE_MARGIN) -> bool:
  """True if `accuracy` is no better than 1/num_classes + margin (or is not a number)."""
  return not accuracy > 1.0 / num_classes + margin


def _relation(workdir: str) -> str:
  path = os.path.join(workdir, "record.json")
  if not os.path.isfile(path):
    return "relation unknown (no record.json)"
  return f"{records.read_record(path)['neighbouring']} neighbouring"


def file_lines(workdir: str) -> list[str]:
  """Where the student checkpoint, the run report and the model card of `workdir` are."""
  lines = []
  step = checkpoint.latest_step(os.path.join(workdir, "checkpoints"))
  if step is not None:
    lines.append(f"student checkpoint: {os.path.join(workdir, 'checkpoints', str(step))}")
  for name, what in (("report.md", "run report"), ("model_card.md", "model card")):
    if os.path.isfile(os.path.join(workdir, name)):
      lines.append(f"{what}: {os.path.join(workdir, name)}")
  return lines


def conversion_lines(results: Results, *, workdir: str, num_classes: int,
                     chance_reason: str) -> list[str]:
  """The closing summary of a conversion: the student's test accuracy, the sound (ε, δ) with
  its relation, warnings, the files, where the private diagnostics are (the teachers' accuracy
  is one: its value stays in results.json's "private_diagnostics", never printed), and
  `chance_reason` last when the student is at chance.

  Args:
    results: the run's results.json.
    workdir: the run's directory (record.json for the relation, the files).
    num_classes: of the dataset, for the chance check.
    chance_reason: the line printed when the student is at chance (why, what to try).
  """
  accuracy = results["test_accuracy"]
  # The teachers' accuracy is a private diagnostic: named by the last lines, never shown.
  lines = [f"student test accuracy: {accuracy:.4f} ({_dataset(results)} test split)"]
  lines.append(f"privacy: sound epsilon {_eps(results['epsilon'])} at delta "
               f"{results['delta']:g}, {_relation(workdir)} (dp_accounting)")
  paper = results.get("paper_epsilon")
  if results.get("accounting_used_for_budget") == "paper" and paper is not None:
    lines.append(f"paper-formula epsilon {_eps(paper)}: chose the noise, NOT a valid guarantee")
  lines += [f"WARNING: {w}" for w in results.get("warnings", [])]
  lines += file_lines(workdir)
  private = private_diagnostics_line(results, workdir)
  if private:
    lines.append(private)
  if at_chance(accuracy, num_classes):
    lines.append(chance_reason)
  return lines
