"""`--help` tells the truth: every flag of every CLI has its own one-line help, with no measured
figure in it; the DPDFD defaults shown are the ones the named dataset's run uses; a missing
data set is said first; every CLI fits in 100 lines."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import pathlib
import re

import pytest

from dpkd_jax import data
from dpkd_jax.data import sources
from experiments import _cli
from experiments import dpdfd as dpdfd_cli

_REPO = pathlib.Path(__file__).resolve().parent.parent
# (CLI module, the words before the flags): every parser a user can ask for --help.
COMMANDS = [("dpdfd", []), ("dpdfd", ["--mode=direct"]), ("dpdfd", ["sample"]), ("dpsgd", []),
            ("srr", []), ("srr", ["pretrain"]), ("rknn", []), ("rona", []), ("dfpate", []),
            ("teacher", []), ("teacher", ["import"]), ("teacher_ensemble", []), ("export", []),
            ("audit", [])]
# What a help line may say about its default (and the recipes'), left out of the checks below.
_DEFAULT = re.compile(r"\s*\((?:default|--no)[^()]*(?:\([^()]*\)[^()]*)*\)")
# A measured figure: a percentage, a number with two or more decimals, an accuracy.
_MEASURED = re.compile(r"\d\s*%|\b\d+\.\d{2,}|accura|measured", re.IGNORECASE)


def _help(module: str, words: list[str], monkeypatch) -> tuple[argparse.ArgumentParser, str]:
  """(the parser that printed `python -m experiments.<module> <words> --help`, its text)."""
  made = []
  init = _cli.Parser.__init__

  def record(self, *args, **kwargs):
    init(self, *args, **kwargs)
    made.append(self)

  monkeypatch.setattr(_cli.Parser, "__init__", record)
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
    importlib.import_module(f"experiments.{module}").main([*words, "--help"])
  assert exit_info.value.code == 0
  return [p for p in made if p.add_help][-1], out.getvalue()


def _flag_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
  """{flag: its help without what it says about the default}, -h and hidden flags aside."""
  return {action.option_strings[0]: _DEFAULT.sub("", action.help or "").strip()
          for action in parser._actions  # pylint: disable=protected-access
          if action.help != argparse.SUPPRESS and action.dest != "help"}


@pytest.mark.parametrize("module,words", COMMANDS, ids=[" ".join([m, *w]) for m, w in COMMANDS])
def test_every_flag_has_its_own_help_without_measured_figures(module, words, monkeypatch):
  parser, text = _help(module, words, monkeypatch)
  helps = _flag_helps(parser)
  assert not [flag for flag, line in helps.items() if not line], "flags without help"
  by_text: dict[str, list[str]] = {}
  for flag, line in helps.items():
    by_text.setdefault(line, []).append(flag)
  assert not [flags for flags in by_text.values() if len(flags) > 1], "flags sharing a help"
  assert {flag: line for flag, line in helps.items() if _MEASURED.search(line)} == {}
  assert text.splitlines()[0].startswith(f"usage: {parser.prog}") and "[flags]" in text


def _dpdfd_help(argv: list[str], monkeypatch) -> str:
  return " ".join(_help("dpdfd", argv, monkeypatch)[1].split())  # argparse's wrapping undone


def test_dpdfd_help_shows_the_named_datasets_defaults(monkeypatch):
  unnamed = _dpdfd_help([], monkeypatch)
  assert ("(default: --dataset=digits: configs/dpdfd/digits_quickstart.py, mnist: "
          "configs/dpdfd/mnist_engine.py, fashion_mnist: configs/dpdfd/fashion_mnist_engine.py)"
          in unnamed)
  assert "(default: 2000; at most" in unnamed
  mnist = _dpdfd_help(["--dataset=mnist"], monkeypatch)
  assert "overrides it (default: configs/dpdfd/mnist_engine.py)" in mnist
  assert "(default: 8000; the recipe's; at most" in mnist
  assert "stops at it (default: 10.0; the recipe's)" in mnist
  digits = _dpdfd_help(["--dataset=digits"], monkeypatch)
  assert "(default: 600; the recipe's; at most" in digits
  assert "that teacher's epochs (default: 10)" in digits
  # The file named by --config: its values, a flag given on top of it too.
  paper = _dpdfd_help(["--config=configs/dpdfd/mnist_paper_eps10.py"], monkeypatch)
  assert "output-gradient row (default: 1e-10; the recipe's)" in paper
  assert "overrides it (default: configs/dpdfd/mnist_paper_eps10.py)" in paper
  assert "(default: 200)" in _dpdfd_help(["--dataset=cifar10"], monkeypatch)


def test_every_method_cli_takes_a_recipe_file(monkeypatch):
  for module, words in COMMANDS:
    if module in ("dpdfd", "srr", "dpsgd", "rknn", "rona", "dfpate") and words in ([], ["pretrain"]):
      parser, _ = _help(module, words, monkeypatch)
      assert "--config" in _flag_helps(parser), module


@pytest.fixture
def no_data(tmp_path, monkeypatch):
  """No data anywhere: no $DPKD_DATA_DIR, tensorflow-datasets' folder empty (no network)."""
  monkeypatch.delenv(sources.DATA_DIR_ENV_VAR, raising=False)
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  monkeypatch.chdir(tmp_path)
  return tmp_path


@pytest.mark.parametrize("extra", [[], ["--data_dir=."]])
def test_dpdfd_says_first_that_the_data_is_missing(extra, no_data, capsys):
  with pytest.raises(SystemExit) as exit_info:
    dpdfd_cli.main(["--dataset=cifar10", *extra])  # no privacy flag either: said second
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1
  assert err.startswith("error: dataset 'cifar10'") and "not found" in err
  assert "--data_dir=DIR" in err and "noise_multiplier" not in err
  assert not (no_data / "runs").exists()


def test_check_available_reads_nothing(no_data):
  data.check_available("digits")
  data.check_available("cifar10", download=True)  # `load` tries the network, not this
  with pytest.raises(data.DataNotFoundError, match="'missing' does not exist"):
    data.check_available("cifar10", data_dir="missing")
  (no_data / "cifar10.npz").write_bytes(b"")  # found; `load` validates it
  data.check_available("cifar10", data_dir=str(no_data))
  (no_data / "tfds" / "svhn_cropped").mkdir(parents=True)  # prepared by tfds: `load` reads it
  data.check_available("svhn_cropped")
  with pytest.raises(data.DataNotFoundError, match="tensorflow-datasets has not prepared it"):
    data.check_available("cifar100")


# The reporting tools (results, plot) and the shared helpers (names starting with "_") aside,
# a CLI is its usage and its wiring: at most 100 lines.
_NOT_CLIS = {"results.py", "plot.py", "__init__.py"}


def test_every_cli_fits_in_100_lines():
  long = {path.name: n for path in sorted((_REPO / "experiments").glob("*.py"))
          if path.name not in _NOT_CLIS and not path.name.startswith("_")
          and (n := len(path.read_text(encoding="utf-8").splitlines())) > 100}
  assert long == {}
