"""Privacy–utility plots: results.json parsing, trajectories, the PNG and the CLI."""

import json
import math
import os

import matplotlib.image
import numpy as np
import pytest

from dpkd_jax import plotting
from experiments import plot as plot_cli


def _write_run(root, name, results, metrics_rows=None):
  """Writes a fake run workdir; metrics_rows: [(step, name, value), ...] for metrics.csv."""
  run_dir = os.path.join(str(root), name)
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, "results.json"), "w") as f:
    json.dump(results, f)  # json writes math.inf as `Infinity`, as the runs do
  if metrics_rows is not None:
    with open(os.path.join(run_dir, "metrics.csv"), "w") as f:
      f.write("step,name,value\n")
      f.writelines(f"{s},{n},{v}\n" for s, n, v in metrics_rows)
  return run_dir


@pytest.fixture
def dpdfd_runs(tmp_path):
  trajectory = [(100, "train/epsilon", 4.0), (100, "test/accuracy", 0.2),
                (100, "train/loss", 3.0),  # other tags are ignored
                (200, "train/epsilon", 9.5), (200, "test/accuracy", 0.3)]
  return [
      _write_run(tmp_path, "eps10", {"method": "dpdfd", "epsilon": 9.5, "test_accuracy": 0.3,
                                      "delta": 1e-5, "paper_epsilon": 0.6}, trajectory),
      _write_run(tmp_path, "eps1", {"method": "dpdfd", "epsilon": 1.0, "test_accuracy": 0.15,
                                     "delta": 1e-5, "paper_epsilon": None}),
      _write_run(tmp_path, "nonprivate", {"method": "dpdfd", "epsilon": math.inf,
                                           "test_accuracy": 0.5, "delta": 1e-5}),
  ]


def test_load_run_reads_epsilon_accuracy_and_trajectory(dpdfd_runs):
  run = plotting.load_run(dpdfd_runs[0])
  assert run.label == "eps10" and run.method == "dpdfd"
  assert run.epsilon == 9.5 and run.accuracy == 0.3 and run.delta == 1e-5
  assert run.paper_epsilon == 0.6
  assert run.trajectory == ((4.0, 0.2), (9.5, 0.3))  # step order, unrelated tags dropped


def test_private_diagnostics_are_never_read(tmp_path):
  results = {"method": "rona", "epsilon": 2.0, "test_accuracy": 0.6, "delta": 1e-5,
             "private_diagnostics": {"_note": "NOT covered by epsilon",
                                     "teacher_test_accuracy": 0.99}}
  run_dir = _write_run(tmp_path, "rona", results, [(1, "test/accuracy", 0.6)])
  with open(os.path.join(run_dir, "private_diagnostics.csv"), "w") as f:
    f.write("step,name,value\n1,private_diagnostics/train/epsilon,7.0\n")
  run = plotting.load_run(run_dir)
  assert (run.epsilon, run.accuracy, run.trajectory) == (2.0, 0.6, ())


def test_infinite_epsilon_and_missing_paper_figure(dpdfd_runs):
  nonprivate = plotting.load_run(dpdfd_runs[2])
  assert math.isinf(nonprivate.epsilon) and nonprivate.paper_epsilon is None
  assert plotting.load_run(dpdfd_runs[1]).trajectory == ()  # no metrics.csv


@pytest.mark.parametrize("method, results, expected_epsilon, expected_accuracy", [
    ("rknn", {"epsilon": 0.1, "student_accuracy": 0.9, "label_accuracy": 0.8}, 0.1, 0.9),
    ("srr", {"record_level_epsilon": math.inf, "labels_epsilon": 5e5, "test_accuracy": 0.77,
             "paper_label_epsilon_per_query": 10.0}, math.inf, 0.77),
    ("dpsgd", {"epsilon": 0.99, "test_accuracy": 0.95}, 0.99, 0.95),
    ("some_future_method", {"epsilon": 2.0, "test_accuracy": 0.5}, 2.0, 0.5),
])
def test_method_registry_picks_the_right_fields(tmp_path, method, results, expected_epsilon,
                                                expected_accuracy):
  run = plotting.load_run(_write_run(tmp_path, method, {"method": method, **results}))
  assert run.epsilon == expected_epsilon and run.accuracy == expected_accuracy


def test_rknn_trajectory_uses_round_tags(tmp_path):
  rows = [(1, "round/epsilon", 0.05), (1, "round/student_accuracy", 0.89),
          (2, "round/epsilon", 0.1), (2, "round/student_accuracy", 0.93)]
  run_dir = _write_run(tmp_path, "rknn", {"method": "rknn", "epsilon": 0.1,
                                          "student_accuracy": 0.93}, rows)
  assert plotting.load_run(run_dir).trajectory == ((0.05, 0.89), (0.1, 0.93))


@pytest.mark.parametrize("results, message", [
    ({"method": "dpdfd", "test_accuracy": 0.3}, "'epsilon'"),
    ({"method": "rknn", "epsilon": 0.1, "test_accuracy": 0.3}, "'student_accuracy'"),
    ({"method": "dpdfd", "epsilon": 1.0, "test_accuracy": 30.0}, "accuracy"),
    ({"method": "dpdfd", "epsilon": -1.0, "test_accuracy": 0.3}, "epsilon"),
])
def test_bad_results_raise_value_error(tmp_path, results, message):
  with pytest.raises(ValueError, match=message):
    plotting.load_run(_write_run(tmp_path, "bad", results))


def test_missing_results_raise_or_are_skipped(tmp_path, dpdfd_runs):
  unfinished = tmp_path / "unfinished"
  unfinished.mkdir()
  with pytest.raises(FileNotFoundError, match="results.json"):
    plotting.load_runs([dpdfd_runs[0], str(unfinished)])
  runs = plotting.load_runs([dpdfd_runs[0], str(unfinished)], skip_unfinished=True)
  assert [r.label for r in runs] == ["eps10"]
  with pytest.raises(ValueError, match="no run"):
    plotting.load_runs([str(unfinished)], skip_unfinished=True)


def _png_shape(path):
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  return matplotlib.image.imread(path).shape


@pytest.mark.parametrize("trajectories, paper_epsilon", [(False, False), (True, True)])
def test_plot_writes_a_png(tmp_path, dpdfd_runs, trajectories, paper_epsilon):
  out = str(tmp_path / "curve.png")
  runs = plotting.load_runs(dpdfd_runs)
  assert plotting.plot_privacy_utility(runs, out, trajectories=trajectories,
                                       paper_epsilon=paper_epsilon) == out
  height, width, _ = _png_shape(out)
  assert height > 300 and width > 500


def test_plot_only_infinite_runs_and_empty_input(tmp_path, dpdfd_runs):
  out = str(tmp_path / "inf.png")
  plotting.plot_privacy_utility([plotting.load_run(dpdfd_runs[2])], out)
  assert os.path.getsize(out) > 0
  with pytest.raises(ValueError, match="at least one"):
    plotting.plot_privacy_utility([], out)


def test_plot_differs_with_data(tmp_path, dpdfd_runs):
  # The image depends on the runs: a plot that ignored its input would pass the other tests.
  first, second = str(tmp_path / "a.png"), str(tmp_path / "b.png")
  plotting.plot_privacy_utility(plotting.load_runs(dpdfd_runs[:2]), first)
  plotting.plot_privacy_utility(plotting.load_runs(dpdfd_runs[1:]), second)
  a, b = matplotlib.image.imread(first), matplotlib.image.imread(second)
  assert a.shape != b.shape or not np.array_equal(a, b)


def test_cli(tmp_path, dpdfd_runs, capsys):
  out = str(tmp_path / "cli.png")
  plot_cli.main(["--runs", *dpdfd_runs, "--out", out, "--trajectories", "--paper_epsilon"])
  printed = capsys.readouterr().out
  assert "eps10: dpdfd, eps 9.5, accuracy 0.3000" in printed
  assert "nonprivate: dpdfd, eps inf (no guarantee)" in printed
  assert _png_shape(out)[0] > 0
  with pytest.raises(SystemExit):  # argparse error, not a traceback
    plot_cli.main(["--runs", str(tmp_path / "missing"), "--out", out])


def test_runs_without_a_guarantee_share_one_legend_entry_per_method(tmp_path, monkeypatch):
  import matplotlib.figure  # pylint: disable=g-import-not-at-top
  texts = []
  save = matplotlib.figure.Figure.savefig

  def spy(fig, *args, **kwargs):
    texts.extend(t.get_text() for ax in fig.axes if ax.get_legend()
                 for t in ax.get_legend().get_texts())
    return save(fig, *args, **kwargs)

  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
  runs = [plotting.RunSummary(label=f"dpdfd__digits__engine_{i}", method="dpdfd",
                              epsilon=math.inf, accuracy=0.5 + i / 10, delta=1e-5,
                              paper_epsilon=None, trajectory=()) for i in range(3)]
  runs.append(plotting.RunSummary(label="dpdfd__digits__eps10", method="dpdfd", epsilon=10.0,
                                  accuracy=0.8, delta=1e-5, paper_epsilon=None, trajectory=()))
  plotting.plot_privacy_utility(runs, str(tmp_path / "utility.png"))
  assert [t for t in texts if "∞" in t] == ["dpdfd: ε = ∞, no guarantee (3 runs)"]
  assert not any("__" in t for t in texts)  # no record names in the legend
