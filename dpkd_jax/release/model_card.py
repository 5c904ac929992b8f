"""The model card of a finished run: model_card.md (for people) and model_card.json (for tools).

`write_model_card(workdir)` reads the run's record.json (`train.records`: method, dataset, test
accuracy, the sound (ε, δ) and its neighbouring relation, the accounting, the paper's figure)
and results.json (accountant, seed kind, the *names* of the private diagnostics) and writes
both files; `train.outputs.finish_run` calls it at the end of every run. The export command
(`release.bundle`) writes the same card beside the exported files, with their sha256, the
checks against JAX and the measured latency.

What a card never holds: a private diagnostic's value, the seed, the command line (it may
hold the seed) or the config (it holds the seed and the private data's location). Sections:

  released      the student and its public-test accuracy: what (ε, δ) covers
  selection     the record's `selection` and the data it was made on (a validation hold-out
                of N private records, the test split, a paper's recipe, or nothing)
  privacy       sound ε ("inf" when there is no guarantee; rounded up to 3 significant digits
                in model_card.md), δ, relation, accounting, accountant, the sensitivity in
                words, the paper's own figure beside (3 significant digits in the Markdown),
                labelled as not a guarantee, warnings; on an
                export, the checkpoint step exported and the ε covering it
                (`students.covered_epsilon`: never below that checkpoint's ledger)
  guarantee     what it covers and does NOT cover (tuning on private data, private
                diagnostics, a chosen seed, the non-private teacher, public splits)
  input/output  shape, dtype, layout, how the images were made (`data.PREPROCESSING`),
                normalisation (mean/std), class names
  provenance    library version, the commit that ran, the commit that wrote the card
  exports       files with sha256 and their check against JAX (export command only)
  measured      latency with the load average (export command only)
  audit         the run's one-run canary audit (`dpkd_jax.audit`: ε lower bound, AUROC), when
                one was run
"""

from __future__ import annotations

import decimal
import json
import math
import os
from typing import Any

import dpkd_jax
from dpkd_jax import data
from dpkd_jax.release import students
from dpkd_jax.train import records

CARD_MD, CARD_JSON = "model_card.md", "model_card.json"
PAPER_LABEL = "the paper's own accounting of this run: NOT a privacy guarantee"
TEACHER_METHODS = ("dpdfd", "srr", "rona", "dfpate")
_RELATIONS = {"replace-one": "replace-one: one record replaced by another",
              "add-remove": "add-remove: one record added or removed"}
_PUBLIC_DATA = {
    "rona": "the public split of the training data (RONA's public/sensitive split): only "
            "sensitive records are protected",
    "rknn": "the public split of the test data that the votes label: only the private "
            "training records are protected",
    "dfpate": "the query images: procedural images are public randomness; DP query-model "
              "samples are covered (their releases are charged)",
}


def _read(path: str) -> dict[str, Any]:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


# What one private record can change in a release, in words (the formula is the accountant's).
_SENSITIVITY = {
    "dpdfd": "one private record may change a (non-private) teacher arbitrarily, so each of the "
             "B rows a step releases (the teacher's output gradients on synthetic images, each "
             "clipped to L2 norm C) can move by up to 2C, or 2C*m when the record reached m "
             "teachers whose rows are summed; one step's release then moves by at most "
             "2C*m*sqrt(B) in L2 norm, and the Gaussian noise is scaled to that",
    "dpsgd": "each example's gradient is clipped to L2 norm C, so one record moves the summed "
             "gradient of a step by at most C when it is added or removed, 2C when it is "
             "replaced by another; the Gaussian noise is scaled to that",
}


def _significant(value: float, digits: int = 3, up: bool = False) -> str:
  """`value` to `digits` significant digits; `up`: never below it (an epsilon is rounded up:
  a rounded guarantee must not claim more privacy than the run has)."""
  text = f"{value:.{digits - 1}e}"
  rounded = decimal.Decimal(text)
  if up and float(rounded) < value:
    rounded += decimal.Decimal(1).scaleb(rounded.as_tuple().exponent)
  return f"{float(rounded):.{digits}g}"


def _epsilon_text(value: Any) -> str:
  if value in ("inf", None) or (isinstance(value, float) and math.isinf(value)):
    return "inf" if value is not None else "n/a"
  return _significant(float(value), up=True)


def _seed(results: dict[str, Any]) -> dict[str, str]:
  """The seed's kind and what it means; never its value."""
  seed = results.get("seed")
  if isinstance(seed, str) and "secret" in seed:
    return {"kind": "secret", "note": "a secret seed from OS entropy (>= 64 bits); it is "
            "stored in the run's checkpoints: never publish the checkpoints directory"}
  if isinstance(seed, int) and not isinstance(seed, bool):
    return {"kind": "user-chosen", "note": "the seed was chosen by the user (its value is not "
            "in this card): anyone who knows it can regenerate the noise, and the guarantee "
            "does not hold against them; keep it secret"}
  return {"kind": "unknown", "note": "the run does not say how its seed was chosen"}


def _private_names(results: dict[str, Any]) -> list[str]:
  section = results.get("private_diagnostics") or {}
  return sorted(k for k in section if k not in ("_note", "files"))


def _paper(record: dict[str, Any], results: dict[str, Any]) -> dict[str, Any] | None:
  if record.get("paper_epsilon") is None and record.get("paper_row") is None:
    return None
  paper = {"label": PAPER_LABEL, "epsilon": record.get("paper_epsilon"),
           "row": record.get("paper_row"), "accuracy": record.get("paper_accuracy")}
  for key in ("paper_epsilon_scope",):
    if key in record:
      paper["scope"] = record[key]
  if isinstance(results.get("paper_epsilon_warning"), str):
    paper["warning"] = results["paper_epsilon_warning"]
  return paper


def _privacy(record: dict[str, Any], results: dict[str, Any],
             checkpoint: dict[str, Any] | None) -> dict[str, Any]:
  eps = record.get("sound_epsilon")
  if checkpoint is not None:  # the exported weights' checkpoint: its ε, never the record's alone
    eps = records.epsilon_json(checkpoint["epsilon"])
  accountant = results.get("epsilon_accountant") or results.get("accountant")
  covered = {} if checkpoint is None else {"checkpoint_step": checkpoint["step"]}
  return {"sound_epsilon": eps, **covered, "delta": record.get("delta"),
          "neighbouring": record.get("neighbouring"),
          "private": eps is not None and eps != "inf",
          "accounting": record.get("accounting"),
          "accounting_meaning": "which accounting chose the noise or the budget; the epsilon "
                                "above is always the sound one (dp_accounting events of the "
                                "noise executed)",
          "accountant": accountant if isinstance(accountant, str) else None,
          "sensitivity": _SENSITIVITY.get(record.get("method")),
          "paper": _paper(record, results), "warnings": list(record.get("warnings") or [])}


def _guarantee(record: dict[str, Any], results: dict[str, Any], privacy: dict[str, Any],
               seed: dict[str, str]) -> dict[str, Any]:
  method, dataset = record.get("method"), record.get("dataset")
  if privacy["private"]:
    relation = _RELATIONS.get(privacy["neighbouring"], privacy["neighbouring"])
    detail = results.get("neighbouring_relation")
    if isinstance(detail, str) and detail != privacy["neighbouring"]:
      relation += f"; this method's relation: {detail}"
    covers = (f"the released student (its weights, every output computed from them, and "
              f"these files) and its accuracy on the public test split, at (epsilon, delta) = "
              f"({_epsilon_text(privacy['sound_epsilon'])}, {privacy['delta']:g}) for any two "
              f"private training sets of {dataset} that differ in one record ({relation})")
  else:
    covers = "nothing: epsilon = inf, this run is NOT private"
  not_covered = ["hyper-parameters and choices tuned on the private data: the guarantee "
                 "assumes they were fixed without looking at it"]
  names = _private_names(results)
  if names:
    where = "results.json" + (" and record.json" if record.get("private_diagnostics") else "")
    not_covered.append(f"the private diagnostics of {where} ({', '.join(names)}): "
                       "noiseless, never publish them")
  not_covered.append(f"the seed: {seed['note']}")
  if method in TEACHER_METHODS:
    not_covered.append("the teacher(s): trained on the private data WITHOUT privacy (one "
                       "record may change a teacher arbitrarily); never release a teacher or "
                       "its outputs")
  if method in _PUBLIC_DATA:
    not_covered.append(_PUBLIC_DATA[method])
  teachers = ", teacher directories" if method in TEACHER_METHODS else ""
  not_covered.append(f"the rest of the run directory (checkpoints, private_diagnostics.csv"
                     f"{teachers})")
  return {"covers": covers, "does_not_cover": not_covered}


def _io(spec: students.StudentSpec | None) -> dict[str, Any] | None:
  if spec is None:
    return None
  info = spec.info
  inside = ("; the model computes their ScatterNet features (J = 2, L = 8) itself"
            if spec.features == "scatternet" else "")
  return {"input": {"name": "images", "shape": ["batch", *info.image_shape], "dtype": "float32",
                    "layout": "NHWC",
                    "preprocessing": data.PREPROCESSING.get(info.name, "not stated"),
                    "normalisation": "(pixels / 255 - mean) / std per "
                    f"channel, pixels uint8 in [0, 255]{inside}", "mean": list(info.mean),
                    "std": list(info.std)},
          "output": {"name": "logits", "shape": ["batch", info.num_classes], "dtype": "float32",
                     "meaning": "unnormalised class scores; argmax is the predicted class",
                     "class_names": list(info.class_names)}}


def build_card(workdir: str, *, exports: list[dict[str, Any]] | None = None,
               measured: dict[str, Any] | None = None,
               checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
  """The card of the finished run in `workdir` as a JSON-able dict (module docstring).

  `checkpoint`: {"step", "epsilon"} of the exported weights (`students.covered_epsilon`);
  None: the run's record alone (the card written when the run finishes).
  """
  record = _read(os.path.join(workdir, "record.json"))
  results = _read(os.path.join(workdir, "results.json"))
  spec = students.spec_of(record.get("method"), record.get("dataset"), results.get("config"))
  privacy, seed = _privacy(record, results, checkpoint), _seed(results)
  student = None if spec is None else {"model": spec.model, "norm": spec.norm,
                                       "num_classes": spec.info.num_classes}
  return {
      "card_version": 1, "method": record.get("method"), "dataset": record.get("dataset"),
      "student": student,
      "released": {"test_accuracy": record.get("test_accuracy"),
                   "evaluated_on": f"the public test split of {record.get('dataset')}"},
      "selection": _selection(record, results),
      "privacy": privacy, "guarantee": _guarantee(record, results, privacy, seed),
      "seed": {"kind": seed["kind"]}, "io": _io(spec),
      "provenance": {"library": "dpkd-jax", "version": dpkd_jax.__version__,
                     "run_commit": record.get("commit"), "card_commit": records.current_commit(),
                     "record": "record.json of the run (its command may hold the seed)"},
      "exports": list(exports or []), "measured": measured, "audit": record.get("audit"),
      "audit_threat_models": record.get("audit_threat_models"),
  }


def _figure(value: Any) -> Any:
  """A paper's figure as people read it: 3 significant digits (None stays None)."""
  return _significant(float(value)) if isinstance(value, (int, float)) else value


def _number(value: Any, spec: str = ".4g") -> str:
  """A figure of the (JSON-ready) card: numbers formatted, "inf"/"nan" as they are."""
  return format(value, spec) if isinstance(value, (int, float)) else str(value)


def _md_privacy(card: dict[str, Any]) -> list[str]:
  privacy, guarantee = card["privacy"], card["guarantee"]
  eps = _epsilon_text(privacy["sound_epsilon"])
  if privacy["private"]:
    head = (f"**Sound epsilon = {eps}, delta = {privacy['delta']:g}**, neighbouring relation: "
            f"{privacy['neighbouring']}; accounting that chose the noise: "
            f"{privacy['accounting']}.")
  else:
    head = (f"**NOT private: sound epsilon = {eps}** (no differential-privacy guarantee); "
            f"delta = {privacy['delta']}, relation {privacy['neighbouring']}.")
  lines = ["## Privacy", "", head]
  if "checkpoint_step" in privacy:
    lines.append("This epsilon accounts for every release charged up to the exported "
                 f"checkpoint (step {privacy['checkpoint_step']}).")
  if privacy["accountant"]:
    lines.append(f"Accountant: {privacy['accountant']}.")
  if privacy.get("sensitivity"):
    lines.append(f"Sensitivity, in words: {privacy['sensitivity']}.")
  paper = privacy["paper"]
  if paper:
    shown = {**paper, "epsilon": _figure(paper.get("epsilon")),
             "accuracy": _figure(paper.get("accuracy"))}
    figure = ", ".join(f"{k} {shown[k]}" for k in ("epsilon", "row", "accuracy", "scope")
                       if shown.get(k) is not None)
    lines.append(f"Beside it, {paper['label']}: {figure}."
                 + (f" ({paper['warning']})" if paper.get("warning") else ""))
  lines += [f"Warning: {w}" for w in privacy["warnings"]]
  lines += ["", "### What the guarantee covers", "", guarantee["covers"], "",
            "### What it does NOT cover", ""]
  return lines + [f"- {item}" for item in guarantee["does_not_cover"]] + [""]


def _md_io(card: dict[str, Any]) -> list[str]:
  io = card["io"]
  if io is None:
    return ["## Input and output", "", "This run releases no classifier student we know.", ""]
  x, y = io["input"], io["output"]
  return ["## Input and output", "",
          f"- input `{x['name']}`: {x['dtype']} {x['layout']} of shape {x['shape']}, "
          f"normalised {x['normalisation']}, mean {x['mean']}, std {x['std']}",
          f"- images before normalisation: {x['preprocessing']}",
          f"- output `{y['name']}`: {y['dtype']} of shape {y['shape']}: {y['meaning']}; "
          f"classes {y['class_names']}", ""]


def _md_exports(card: dict[str, Any]) -> list[str]:
  if not card["exports"]:
    return ["## Files", "", "Not exported: `python -m experiments.export --run=<this run> "
            "--out=<dir>` writes ONNX and StableHLO files with this card.", ""]
  lines = ["## Files", "", "| file | format | sha256 | max abs / rel diff to JAX | converter |",
           "| --- | --- | --- | --- | --- |"]
  for e in card["exports"]:
    check = e["check"]
    lines.append(f"| {e['file']} | {e['format']} | `{e['sha256']}` | "
                 f"{_number(check['max_abs_diff'], '.2e')} / "
                 f"{_number(check['max_rel_diff'], '.2e')} "
                 f"({check['num_inputs']} inputs) | {e['converter']} |")
  return lines + [""]


def _md_audit(card: dict[str, Any]) -> list[str]:
  """The run's one-run canary audit (`dpkd_jax.audit`), one line per threat model scored."""
  audit = card.get("audit")
  if not audit:
    return []
  lines = [f"- {b.get('threat', b['threat_model'])}: epsilon >= "
           f"{_number(b['epsilon_lower_bound'], '.3f')} (f-DP: "
           f"{_number(b['epsilon_lower_bound_fdp'], '.3f')}), AUROC {_number(b['auroc'], '.3f')}"
           f", TPR at 1% FPR {_number(b['tpr_at_1pct_fpr'], '.3f')} ({b['threat_model']})"
           for b in (card.get("audit_threat_models") or {"": audit}).values()]
  return ["## Audit", "", f"One-run canary audit ({audit['canaries']}; {audit['m']} canaries, "
          f"{audit['confidence']:.0%} confidence, delta {audit['delta']:g}; at most "
          f"{_number(audit['epsilon_ceiling'], '.3g')} measurable with this m):", "", *lines, "",
          "A lower bound, not a guarantee: the sound epsilon above is the guarantee.", ""]


def _md_measured(card: dict[str, Any]) -> list[str]:
  measured = card["measured"]
  if not measured:
    return []
  load = ", ".join(f"{v:.2f}" for v in measured["load_average_1min"])
  lines = ["## Measured", "", f"CPU latency per image, {measured['note']}: 1-minute load "
           f"average {load} (before, after), {measured['cpu_count']} cores.", "",
           "| runtime | batch | median ms/image | min ms/image | repeats |",
           "| --- | --- | --- | --- | --- |"]
  for runtime, rows in measured["results"].items():
    lines += [f"| {runtime} | {r['batch']} | {_number(r['median_ms_per_image'])} | "
              f"{_number(r['min_ms_per_image'])} | {r['repeats']} |" for r in rows]
  return lines + [""]


# What a record's `selection` says the run's settings / checkpoint were chosen on.
_SELECTION_TEXT = {
    "validation": "chosen on a validation hold-out of {n} private training records (the test "
                  "split was read once, at the end; the selection itself is not covered by "
                  "epsilon: docs/privacy.md, \"Selection and tuning\")",
    "test": "chosen by test accuracy: the test figure is optimistic",
    "paper_recipe": "a paper's fixed recipe (not tuned here)",
    "none": "nothing selected by this run (its settings as given; if they were tuned on the "
            "test split the figure is optimistic)",
}


def _selection(record: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
  """{kind, data}: the record's `selection` and, in words, the data it was made on."""
  kind = record.get("selection", "none")
  held = (results.get("config") or {}).get("validation_examples") or "N"
  return {"kind": kind, "data": _SELECTION_TEXT.get(kind, "not stated").format(n=held)}


def render_markdown(card: dict[str, Any]) -> str:
  """model_card.md of `card` (from `build_card`)."""
  student = card["student"]
  what = f"{student['model']} (norm {student['norm']})" if student else "no classifier student"
  accuracy = card["released"]["test_accuracy"]
  lines = [f"# Model card: {card['method']} on {card['dataset']}", "",
           f"Student: {what}. Test accuracy: "
           f"{'n/a' if accuracy is None else f'{accuracy:.4f}'} ({card['released']['evaluated_on']}).",
           "", f"Selection of the hyper-parameters and stopping point: "
           f"{card['selection']['data']}.", "", *_md_privacy(card),
           *_md_io(card), *_md_exports(card), *_md_measured(card),
           *_md_audit(card),
           "## Provenance", ""]
  prov = card["provenance"]
  lines += [f"- {prov['library']} {prov['version']}; run at commit {prov['run_commit']}; card "
            f"written at commit {prov['card_commit']}", f"- seed: {card['seed']['kind']}",
            f"- full record: {prov['record']}", ""]
  return "\n".join(lines)


def _jsonable(value: Any) -> Any:
  """`value` with non-finite floats as the strings "inf", "-inf", "nan" (valid JSON)."""
  if isinstance(value, float) and not math.isfinite(value):
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def _write(path: str, text: str) -> None:
  """Atomically (a crash leaves the old file or the new one), with the umask's permissions."""
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def write_model_card(workdir: str, *, out_dir: str | None = None,
                     exports: list[dict[str, Any]] | None = None,
                     measured: dict[str, Any] | None = None,
                     checkpoint: dict[str, Any] | None = None) -> tuple[str, str]:
  """Writes model_card.md and model_card.json of the run in `workdir` into `out_dir`
  (default `workdir`); returns their paths. `checkpoint`: see `build_card`."""
  card = _jsonable(build_card(workdir, exports=exports, measured=measured,
                              checkpoint=checkpoint))
  out_dir = workdir if out_dir is None else out_dir
  os.makedirs(out_dir, exist_ok=True)
  md_path, json_path = os.path.join(out_dir, CARD_MD), os.path.join(out_dir, CARD_JSON)
  _write(json_path, json.dumps(card, indent=2, allow_nan=False) + "\n")
  _write(md_path, render_markdown(card))
  return md_path, json_path
