"""dpkd_jax.methods.srr.summary: the closing summary of an SRR run and its chance line."""

import math

import pytest

from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import privacy
from dpkd_jax.methods.srr import summary as srr_summary
from dpkd_jax.privacy import randomized_response
from dpkd_jax.train import summary
from experiments import srr as srr_cli

def _results(accuracy: float, **config_flags) -> dict:
  """An SRR results dict as `train_srr` writes it (privacy block from the plan, no training)."""
  config = srr.SRRConfig(dataset="mnist", teacher_dir="t", stages=2, samples_per_stage=256,
                         **config_flags)
  plan = privacy.make_plan(config)
  return {"method": "srr", "test_accuracy": accuracy, "accuracy_per_stage": [accuracy] * 2,
          **privacy.report(plan, labels_epsilon=plan.labels_epsilon), "stages": plan.stages,
          "num_queries": plan.releases, "config": config.to_json()}


def test_keep_probability():
  assert float(randomized_response.keep_probability(math.inf, 10)) == 1.0
  assert float(randomized_response.keep_probability(0.0, 10)) == pytest.approx(0.1)
  assert float(randomized_response.keep_probability(1.0, 10)) == pytest.approx(
      math.e / (math.e + 9))


def test_above_chance_has_no_chance_line():
  results = _results(0.77, epsilon=10.0)
  lines = srr_summary.summary_lines(results, workdir="runs/w")
  assert lines == summary.summary_lines(results, workdir="runs/w")
  assert not any(line.startswith("why at chance") for line in lines)


def test_small_epsilon_per_query_prints_the_keep_probability():
  lines = srr_summary.summary_lines(_results(0.11, epsilon=0.5), workdir="runs/w")
  assert lines[-2] == "-> runs/w (results.json, record.json)"
  assert lines[-1].startswith("why at chance: the labels are mostly noise: stage 1's 10-ary "
                              "randomized response keeps the teacher's label with probability "
                              "0.1548 (chance 0.1) at epsilon 0.5 per query")
  assert lines[-1].endswith("try a larger --epsilon")
  # A larger student than lenet5 is also pointed to a smaller learning rate (measured fix).
  line = srr_summary.chance_reason(_results(0.1, epsilon=1.0, student_model="small_cnn"))
  assert line.endswith("try a larger --epsilon, or a --student_learning_rate below 0.001 (a "
                       "small_cnn student can fit such labels' noise: small_cnn collapsed on Fashion-MNIST "
                       f"at epsilon 1 with 1e-3 and learned with 3e-4, "
                       f"{srr_summary.STUDENT_ANCHOR})")


def test_a_record_level_target_says_it_set_the_epsilon_per_query():
  results = _results(0.10, target_epsilon=1.0, generator_prior="none")
  line = srr_summary.summary_lines(results)[-1]
  eps = results["epsilon_per_query"]
  assert line.startswith("why at chance: --generator_prior=none: the generator sees the teacher "
                         "only through the noisy labels, so its queries stay noise images")
  keep = float(randomized_response.keep_probability(eps, 10))
  assert f"keeps the teacher's label with probability {keep:.4g}" in line
  assert f"at epsilon {eps:.4g} per query, set by the record-level --target_epsilon=1 spread " \
      "over 512 queries" in line
  assert "experiments.dfpate" in line and srr_summary.RESULTS_ANCHOR in line
  # With the teacher prior, a mostly-noise target says fewer queries leave more ε to each.
  line = srr_summary.chance_reason({**results, "generator_prior": "teacher"})
  assert line.startswith("why at chance: the labels are mostly noise")
  assert "fewer queries (--stages, --samples_per_stage) leave more epsilon to each" in line


def test_nearly_noiseless_labels_point_to_the_generator():
  line = srr_summary.chance_reason(_results(0.12, epsilon=10.0))
  assert line.startswith("why at chance: stage 1's 10-ary randomized response keeps the "
                         "teacher's label with probability 0.9996 (chance 0.1) at epsilon 10 per "
                         "query, so the student did not learn from the generator's queries")
  assert srr_summary.ABLATION_ANCHOR in line
  noiseless = srr_summary.chance_reason(_results(0.1, epsilon=math.inf))
  assert "probability 1 (chance 0.1) at epsilon inf per query" in noiseless


def test_the_cli_prints_the_chance_line(monkeypatch, capsys):
  # The CLI's wiring only: the run is replaced by a results dict at chance.
  results = _results(0.1, epsilon=0.5)
  monkeypatch.setattr(srr_cli, "_check_inputs", lambda config, args: None)
  monkeypatch.setattr(srr_cli.srr, "train_srr", lambda *args, **kwargs: results)
  srr_cli.main(["--dataset=mnist", "--teacher_dir=t", "--epsilon=0.5", "--workdir=w",
                "--no_progress"])
  note, *out = capsys.readouterr().out.splitlines()
  assert note.startswith("note: plain RR at epsilon 0.5 keeps under half of the labels; "
                         "configs/srr/mnist_eps1.py")  # where most labels are noise
  assert out == srr_summary.summary_lines(results, workdir="w")
  assert out[-1] == srr_summary.chance_reason(results)
