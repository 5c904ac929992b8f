"""The recipe files (configs/) and `--config` (experiments/_recipes.py).

Every recipe loads as a complete config of its method, states its record (which exists), the
record's wall time and selection, and a command that resolves to the same config as the
command recorded in that record. `--config=<file>` alone resolves to the file's config in
every method CLI; a flag given overrides it. A default command (no --config) resolves to the
config the CLI resolved when its defaults were dictionaries merged at run time: those configs
are in tests/cli_baselines.json, written by that CLI.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import pathlib
import re
import shlex

import pytest

import configs
from dpkd_jax.methods import dfpate
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import rona
from dpkd_jax.methods import srr
from experiments import _recipes

_REPO = pathlib.Path(__file__).resolve().parent.parent
_RECIPES = configs.recipes()
_SELECTED_ON = {"test": "test split", "validation": "validation hold-out",
                "paper_recipe": "the paper's fixed recipe"}
# Where the recording machine kept a run's inputs (data, the teacher's workdir): not the recipe.
_INPUT_LOCATIONS = {"data_dir", "teacher_dirs"}


def _plain(value):
  """A config as plain JSON values (nested configs as dicts, tuples as lists, inf as text)."""
  if dataclasses.is_dataclass(value):
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if isinstance(value, float) and not math.isfinite(value):
    return repr(value)
  return value


def _as_baseline(method: str, plain: dict) -> dict:
  """A config as tests/cli_baselines.json holds it: the engine options of DPDFD and SRR (their
  nested `engine` now) were top-level fields, and the renamed fields had their version-1 names
  (each config's `RENAMED`, its migration's `V1_RENAMED`), when those baselines were written."""
  renamed = {"dpdfd": dpdfd.DPDFDConfig, "srr": srr.SRRConfig, "rona": rona.RONAConfig,
             "dfpate": dfpate.DFPATEConfig}
  if isinstance(plain.get("engine"), dict):
    plain = {**{k: v for k, v in plain.items() if k != "engine"}, **plain["engine"]}
  old = {new: old for old, new in getattr(renamed.get(method), "RENAMED", {}).items()}
  return {old.get(name, name): value for name, value in plain.items()}


def _method(path: str) -> str:
  return path.split("/")[1]


def _parse(method: str, argv: list[str]):
  return importlib.import_module(f"experiments.{method}").parse_config(list(argv))


def _record(path: str) -> dict:
  record = configs.fields(_RECIPES[path])["Record"].split()[0]
  return json.loads((_REPO / record).read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", sorted(_RECIPES))
def test_every_recipe_states_its_record_command_hardware_time_and_selection(path):
  module, method = _RECIPES[path], _method(path)
  fields = configs.fields(module)
  assert set(fields) == set(configs.FIELDS), path
  assert (_REPO / path).is_file()
  record_path = fields["Record"].split()[0]
  assert record_path.startswith("docs/results/") and (_REPO / record_path).is_file()
  record = _record(path)
  assert record["method"] == method
  assert fields["Command"].startswith(f"python -m experiments.{method} --config={path}")
  assert fields["Selected on"] == _SELECTED_ON[record["selection"]]
  minutes = fields["Time"].split()[0]
  if record["wall_seconds"] is None:
    assert fields["Time"] == "not recorded"
  else:
    assert int(minutes) == round(float(record["wall_seconds"]) / 60), (path, minutes)
  config = module.get_config()
  assert type(config).__name__.lower().startswith(method.replace("_", "")), config
  assert config.seed is None  # a recipe holds no public seed: the commands name --seed=0


@pytest.mark.parametrize("path", sorted(_RECIPES))
def test_config_flag_alone_resolves_to_the_recipe(path):
  config, _ = _parse(_method(path), [f"--config={path}"])
  assert _plain(config) == _plain(_RECIPES[path].get_config())


@pytest.mark.parametrize("path", sorted(_RECIPES))
def test_the_recipe_command_resolves_as_the_records_command(path):
  method = _method(path)
  command = shlex.split(configs.fields(_RECIPES[path])["Command"])
  recorded = [word for word in shlex.split(_record(path)["command"])
              if word.startswith("--") and not word.startswith(("--workdir", "--no_progress"))]
  new, _ = _parse(method, command[3:])
  old, _ = _parse(method, recorded)
  new, old = _plain(new), _plain(old)
  for name in _INPUT_LOCATIONS:
    new.pop(name, None), old.pop(name, None)
  assert new == old


# The default command of each case in tests/cli_baselines.json, as it is written now: the
# dataset's default recipe file, or the recipe file that holds the merge rule's values.
_NOW = {
    "dpdfd --dataset=mnist --accounting=paper --target_epsilon=10": [
        "--config=configs/dpdfd/mnist_paper_eps10.py", "--teacher_dirs=runs/teacher/mnist_small_cnn",
        "--eval_every=1000"],
    "dpdfd --dataset=fashion_mnist --accounting=paper --target_epsilon=10": [
        "--config=configs/dpdfd/fashion_mnist_paper_eps10.py", "--eval_every=1000"],
    "dpdfd --dataset=mnist --teacher_ensemble_dir=E --target_epsilon=10": [
        "--config=configs/dpdfd/mnist_ensemble_eps10.py", "--teacher_ensemble_dir=E"],
    "srr --dataset=mnist --teacher_dir=T --epsilon=1": [
        "--config=configs/srr/mnist_eps1.py", "--teacher_dir=T"],
    "srr --dataset=fashion_mnist --teacher_dir=T --epsilon=1": [
        "--config=configs/srr/fashion_mnist_eps1.py", "--teacher_dir=T"],
}
_BASELINES = json.loads((_REPO / "tests" / "cli_baselines.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("command", sorted(_BASELINES))
def test_default_commands_resolve_as_before(command, capsys):
  method, *argv = command.split()
  config, flags = _parse(method, _NOW.get(command, argv))
  expected = _BASELINES[command]
  assert _as_baseline(method, _plain(config)) == expected["config"]
  if "teacher_config" in expected and "--teacher_dirs" not in " ".join(_NOW.get(command, [])):
    assert _plain(flags.teacher_config) == expected["teacher_config"]


def test_a_flag_overrides_the_recipe_and_resets_its_partner():
  path = "configs/dpdfd/digits_quickstart.py"
  config, _ = _parse("dpdfd", [f"--config={path}", "--steps=5", "--noise_multiplier=1"])
  assert (config.steps, config.noise_multiplier, config.target_epsilon) == (5, 1.0, None)
  both, _ = _parse("dpdfd", [f"--config={path}", "--noise_multiplier=1", "--target_epsilon=3"])
  assert (both.noise_multiplier, both.target_epsilon) == (1.0, 3.0)
  assert _recipes.given(["--nocpu_kernels", "--steps", "5"]) >= {"cpu_kernels", "steps"}
  short, _ = _parse("dpdfd", [f"--config={path}", "--noise_mult=1"])  # argparse's abbreviation
  assert (short.noise_multiplier, short.target_epsilon) == (1.0, None)


@pytest.mark.parametrize("argv,words", [
    (["--config=configs/dpdfd/missing.py"], "no recipe file"),
    (["--config=configs/srr/mnist_eps10.py"], "is a SRRConfig recipe, not a DPDFDConfig one"),
    (["--config=README.md"], "is not a recipe file"),
])
def test_a_bad_config_is_one_line_and_exit_2(argv, words, capsys):
  from experiments import dpdfd as dpdfd_cli  # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit) as exit_info:
    dpdfd_cli.main(argv)
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1 and words in err, err


def test_a_recipe_path_resolves_from_any_working_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # no configs/ here: the installed package's module
  config, _ = _parse("srr", ["--config", "configs/srr/mnist_eps1.py"])
  assert config == _RECIPES["configs/srr/mnist_eps1.py"].get_config()


def test_a_recipe_file_outside_the_package_loads(tmp_path):
  own = tmp_path / "my_recipe.py"
  own.write_text((_REPO / "configs/dpdfd/digits_quickstart.py").read_text(encoding="utf-8")
                 .replace("steps=600", "steps=7"), encoding="utf-8")
  config, flags = _parse("dpdfd", [f"--config={own}"])
  assert config.steps == 7 and flags.teacher_epochs == 10


def test_every_recipe_the_docs_show_is_a_file():
  for doc in ("README.md", "docs/RESULTS.md", "docs/CHOOSING.md"):
    text = (_REPO / doc).read_text(encoding="utf-8")
    for word in text.split():
      if "--config=" in word:
        path = word.split("--config=", 1)[1].strip("`),.;")
        if "<" not in path:  # `configs/<method>/<name>.py`: the form, not a file
          assert path in _RECIPES, (doc, path)


def test_every_headline_cell_has_a_recipe():
  """Each record a cell of the README's headline table links is some recipe's `Record`: every
  headline figure is one `--config` command away."""
  text = (_REPO / "README.md").read_text(encoding="utf-8")
  table = text.split("results-table:headline begin", 1)[1].split("results-table:headline end")[0]
  linked = set(re.findall(r"docs/results/([\w.-]+)\.json", table))
  assert linked
  assert not linked - set(configs.record_commands())
