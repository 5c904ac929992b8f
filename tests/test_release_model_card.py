"""Tests of release.model_card: the card's fields come from record.json / results.json, ε = inf
is said plainly, and nothing private (diagnostic values, the seed, the command) gets in."""

import json
import os

import pytest

import dpkd_jax
from dpkd_jax import data
from dpkd_jax.release import model_card
from dpkd_jax.train import outputs
from dpkd_jax.train import records

TEACHER_ACCURACY = 0.987654321  # a private diagnostic: its value must never reach the card
SEED = 4242424242  # a user-chosen seed: its value must never reach the card


def _run(tmp_path, *, method="dpdfd", epsilon=2.5, seed=SEED, paper_epsilon=0.7,
         dataset="digits", config=None):
  """A finished run's directory written by `outputs.finish_run`, as every method does."""
  workdir = str(tmp_path / method)
  os.makedirs(workdir, exist_ok=True)
  config = config or {"student_model": "lenet5_half", "student_norm": "batch",
                      "seed": seed, "data_dir": "/secret/place"}
  results = {"method": method, "epsilon": epsilon, "seed": seed, "config": config,
             "epsilon_accountant": "dp_accounting PLD", "paper_epsilon_warning": "not valid",
             outputs.PRIVATE_KEY: outputs.private_section(
                 {"teacher_test_accuracy": TEACHER_ACCURACY})}
  outputs.finish_run(workdir, results, run=None, clock=outputs.RunClock(), dataset=dataset,
                     test_accuracy=0.91, sound_epsilon=epsilon, delta=1e-5,
                     paper_epsilon=paper_epsilon, target_epsilon=3.0,
                     extra={"paper_epsilon_scope": "per query"})
  return workdir


def _card(workdir):
  with open(os.path.join(workdir, model_card.CARD_JSON)) as f:
    card = json.load(f)
  with open(os.path.join(workdir, model_card.CARD_MD)) as f:
    return card, f.read()


def test_finish_run_writes_the_card_with_the_records_figures(tmp_path):
  workdir = _run(tmp_path)
  card, markdown = _card(workdir)
  record = records.read_record(os.path.join(workdir, "record.json"))
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  privacy = card["privacy"]
  assert privacy["sound_epsilon"] == record["sound_epsilon"] == results["epsilon"] == 2.5
  assert (privacy["delta"], privacy["neighbouring"], privacy["accounting"]) == (
      1e-5, "replace-one", "sound")
  assert privacy["private"] and privacy["accountant"] == "dp_accounting PLD"
  assert privacy["paper"] == {"label": model_card.PAPER_LABEL, "epsilon": 0.7, "row": None,
                              "accuracy": None, "scope": "per query", "warning": "not valid"}
  assert card["released"]["test_accuracy"] == 0.91
  assert (card["method"], card["dataset"]) == ("dpdfd", "digits")
  assert card["student"] == {"model": "lenet5_half", "norm": "batch", "num_classes": 10}
  info = data.DATASETS["digits"]
  assert card["io"]["input"]["shape"] == ["batch", *info.image_shape]
  assert (card["io"]["input"]["mean"], card["io"]["input"]["std"]) == (list(info.mean),
                                                                       list(info.std))
  assert card["provenance"]["version"] == dpkd_jax.__version__
  assert card["provenance"]["run_commit"] == record["commit"]
  assert card["exports"] == [] and card["measured"] is None
  assert "Sound epsilon = 2.5, delta = 1e-05" in markdown and "NOT a privacy guarantee" in markdown


def test_nothing_private_reaches_the_card(tmp_path):
  card, markdown = _card(_run(tmp_path))
  text = json.dumps(card) + markdown
  for secret in (str(TEACHER_ACCURACY), "0.9877", str(SEED), "/secret/place"):
    assert secret not in text
  assert "command" not in json.dumps(card["provenance"]).replace("its command may", "")
  # The released section holds the released figures only; private names are only warned of.
  assert set(card["released"]) == {"test_accuracy", "evaluated_on"}
  assert any("teacher_test_accuracy" in line and "never publish" in line
             for line in card["guarantee"]["does_not_cover"])


def test_seed_kind_and_what_is_not_covered(tmp_path):
  chosen, _ = _card(_run(tmp_path / "a"))
  assert chosen["seed"] == {"kind": "user-chosen"}
  not_covered = " ".join(chosen["guarantee"]["does_not_cover"])
  assert "tuned on the private data" in not_covered and "regenerate the noise" in not_covered
  assert "teacher(s): trained on the private data WITHOUT privacy" in not_covered
  secret, _ = _card(_run(tmp_path / "b", seed="os-entropy (secret; stored only in the "
                         "checkpoint)", method="dpsgd", config={"model": "lenet5", "norm": "group"}))
  assert secret["seed"] == {"kind": "secret"}
  not_covered = " ".join(secret["guarantee"]["does_not_cover"])
  assert "never publish the checkpoints" in not_covered
  assert "teacher(s)" not in not_covered and "teacher directories" not in not_covered  # DP-SGD


def test_infinite_epsilon_is_said_plainly(tmp_path):
  card, markdown = _card(_run(tmp_path, epsilon=float("inf"), paper_epsilon=1.0))
  assert card["privacy"]["sound_epsilon"] == "inf" and not card["privacy"]["private"]
  assert card["guarantee"]["covers"].startswith("nothing")
  assert outputs.NOT_PRIVATE in card["privacy"]["warnings"]
  assert "**NOT private: sound epsilon = inf**" in markdown
  assert "Infinity" not in json.dumps(card) + markdown


@pytest.mark.parametrize("method,dataset", [("dpdfd_direct", "digits"), ("dpsgd", "toy")])
def test_a_run_without_a_known_student_still_gets_a_card(tmp_path, method, dataset):
  card, markdown = _card(_run(tmp_path, method=method, dataset=dataset))
  assert card["student"] is None and card["io"] is None
  assert "releases no classifier student we know" in markdown


def test_exports_and_measured_sections(tmp_path):
  workdir = _run(tmp_path)
  check = {"ok": True, "max_abs_diff": 1e-6, "max_rel_diff": 2e-7, "num_inputs": 72}
  exports = [{"format": "onnx", "file": "student.onnx", "sha256": "ab" * 32, "check": check,
              "converter": "jax2onnx"}]
  measured = {"note": "measured now", "load_average_1min": [1.5, 1.25], "cpu_count": 2,
              "results": {"onnxruntime": [{"batch": 256, "repeats": 3,
                                           "median_ms_per_image": 0.05,
                                           "min_ms_per_image": float("inf")}]}}
  md_path, json_path = model_card.write_model_card(workdir, out_dir=str(tmp_path / "out"),
                                                   exports=exports, measured=measured)
  assert os.path.dirname(md_path) == os.path.dirname(json_path) == str(tmp_path / "out")
  card, markdown = _card(str(tmp_path / "out"))
  assert card["exports"][0]["sha256"] == "ab" * 32 and "ab" * 32 in markdown
  assert card["measured"]["results"]["onnxruntime"][0]["min_ms_per_image"] == "inf"
  assert "1-minute load average 1.50, 1.25" in markdown and "| onnxruntime | 256 |" in markdown


def test_an_exported_checkpoint_states_the_epsilon_covering_it(tmp_path):
  # Before: an export took the record's epsilon, whatever checkpoint its weights came from.
  workdir = _run(tmp_path, epsilon=2.5)
  model_card.write_model_card(workdir, out_dir=str(tmp_path / "out"),
                              checkpoint={"step": 46, "epsilon": 2.75})
  card, markdown = _card(str(tmp_path / "out"))
  assert card["privacy"]["sound_epsilon"] == 2.75 and card["privacy"]["checkpoint_step"] == 46
  assert "Sound epsilon = 2.75," in markdown and "exported checkpoint (step 46)" in markdown
  assert "(2.75, 1e-05)" in card["guarantee"]["covers"]
  model_card.write_model_card(workdir, out_dir=str(tmp_path / "inf"),
                              checkpoint={"step": 46, "epsilon": float("inf")})
  card, _ = _card(str(tmp_path / "inf"))
  assert card["privacy"]["sound_epsilon"] == "inf" and not card["privacy"]["private"]
  assert "checkpoint_step" not in _card(workdir)[0]["privacy"]  # the run's own card


def test_the_card_names_the_selection_data(tmp_path):
  # A run with a validation hold-out: its record says "validation" and the card names the
  # hold-out (never its accuracy); a run without one says it selected nothing.
  held = _run(tmp_path / "held", config={"student_model": "lenet5_half",
                                         "student_norm": "batch", "validation_examples": 300})
  card, markdown = _card(held)
  assert records.read_record(os.path.join(held, "record.json"))["selection"] == "validation"
  assert card["selection"]["kind"] == "validation"
  assert "validation hold-out of 300 private training records" in markdown
  card, markdown = _card(_run(tmp_path / "plain"))
  assert card["selection"]["kind"] == "none"
  assert "Selection of the hyper-parameters and stopping point: nothing selected by this run" \
      in markdown


def test_figures_are_rounded_as_people_read_them(tmp_path):
  # The sound epsilon rounds up (a rounded guarantee never claims more privacy than the run
  # has); the paper's figure, not a guarantee, to 3 significant digits; the JSON keeps both.
  card, markdown = _card(_run(tmp_path, epsilon=0.6071706342363071,
                              paper_epsilon=0.6071706342363071))
  assert card["privacy"]["paper"]["epsilon"] == 0.6071706342363071
  assert "Sound epsilon = 0.608, delta = 1e-05" in markdown and "epsilon 0.607" in markdown
  assert "0.6071" not in markdown and "(0.608, 1e-05)" in card["guarantee"]["covers"]
  assert [model_card._significant(v, up=True) for v in (2.5, 1000.5, 0.1)] == [
      "2.5", "1.01e+03", "0.1"]


def test_the_card_says_how_inputs_were_made_and_the_sensitivity_in_words(tmp_path):
  card, markdown = _card(_run(tmp_path))
  assert card["io"]["input"]["preprocessing"] == data.PREPROCESSING["digits"]
  assert ("images before normalisation: scikit-learn's 8x8 handwritten digits (values 0..16) "
          "scaled to 0..255, upsampled 3x bilinearly to 24x24") in markdown
  assert "zero-padded by 2 pixels on each side to 28x28x1" in markdown
  assert "2C*m*sqrt(B) in L2 norm" in card["privacy"]["sensitivity"]
  assert "Sensitivity, in words: one private record may change" in markdown
