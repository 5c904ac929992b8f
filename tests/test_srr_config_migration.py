"""dpkd_jax.methods.srr.config_migration: every saved form of an SRR config loads as the same
config; a newer or unknown one is refused in one line."""

import dataclasses
import json
import pathlib

import pytest

from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import config_migration

_REPO = pathlib.Path(__file__).resolve().parent.parent
_OLD_NAMES = {"pretrain_learning_rate": "pretrain_lr", "student_learning_rate": "student_lr",
              "generator_learning_rate": "generator_lr"}  # version 1's names, written here
_ENGINE = ("student_loss", "student_schedule", "student_shift", "student_replay",
           "query_pool")  # the fields version 3 nests under "engine", written here


def _config(engine=None, **kw):
  base = dict(dataset="digits", teacher_dir="t", epsilon=1.0, stages=2, samples_per_stage=32,
              batch_size=16, latent_dim=8, generator_channels=8)
  return srr.SRRConfig(**{**base, **kw}, engine=srr.EngineOptions(**(engine or {})))


def _version2(config: srr.SRRConfig) -> dict:
  """`config` as version 2 saved it: every field flat, "version": 2."""
  saved = config.to_json()
  flat = {k: v for k, v in saved.items() if k not in ("version", "engine")}
  return {"version": 2, **flat, **saved["engine"]}


def _version1(config: srr.SRRConfig) -> dict:
  """`config` as the version-1 `to_json` saved it: flat, the old names, and the fields added
  later left out at their default."""
  out = {_OLD_NAMES.get(k, k): v for k, v in _version2(config).items() if k != "version"}
  for name, default in config_migration.V1_OMITTED.items():
    if out[name] == default:
      del out[name]
  return out


@pytest.mark.parametrize("engine,kw", [
    ({}, {}),
    (dict(student_replay=True, query_pool=4, student_schedule="constant",
          student_loss="rr_likelihood", student_shift=2),
     dict(validation_examples=50, student_learning_rate=3e-4, pretrain_learning_rate=2e-3)),
])
def test_every_saved_form_loads_as_the_same_config(engine, kw):
  config = _config(engine, **kw)
  saved, v2, old = config.to_json(), _version2(config), _version1(config)
  assert saved["version"] == config_migration.VERSION == 3
  assert set(saved["engine"]) == set(_ENGINE) == set(config_migration.V3_ENGINE_FIELDS)
  assert "version" not in old and "student_lr" in old and "engine" not in v2
  for form in (saved, v2, old):
    assert config_migration.migrate(form) == saved
    assert srr.SRRConfig.from_json(form) == config
  assert json.loads(json.dumps(saved)) == saved


def test_the_engine_options_are_the_ones_the_paper_leaves_out():
  assert {f.name for f in dataclasses.fields(srr.EngineOptions)} == set(_ENGINE)
  assert not set(_ENGINE) & {f.name for f in dataclasses.fields(srr.SRRConfig)}
  paper = srr.EngineOptions()  # the paper's choices, but the measured cosine schedule
  assert (paper.student_loss, paper.student_shift, paper.student_replay,
          paper.query_pool) == ("kl", 0, False, 1)


def test_the_engine_options_stay_flat_flags(capsys):
  from experiments import srr as srr_cli  # pylint: disable=import-outside-toplevel
  config, _ = srr_cli.parse_config(
      ["--dataset=digits", "--teacher_dir=t", "--epsilon=1", "--student_loss=rr_likelihood",
       "--student_replay", "--query_pool=3", "--student_schedule=constant",
       "--student_shift=1"])
  assert config.engine == srr.EngineOptions(
      student_loss="rr_likelihood", student_replay=True, query_pool=3,
      student_schedule="constant", student_shift=1)
  with pytest.raises(SystemExit) as exit_info:
    srr_cli.main(["--dataset=digits", "--teacher_dir=t", "--epsilon=1", "--query_pool=0"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "query_pool" in err and err.count("\n") == 1, err


def test_the_renames_are_the_cli_aliases():
  assert config_migration.V1_RENAMED == {old: new for new, old in _OLD_NAMES.items()}
  assert srr.SRRConfig.RENAMED == config_migration.V1_RENAMED


def test_an_unreadable_form_is_refused_in_one_line():
  saved = _config().to_json()
  with pytest.raises(ValueError, match="newer dpkd-jax"):
    srr.SRRConfig.from_json({**saved, "version": 4})
  with pytest.raises(ValueError, match="version must be an integer"):
    config_migration.migrate({**saved, "version": "2"})
  with pytest.raises(ValueError, match="does not know: colour"):
    srr.SRRConfig.from_json({**saved, "colour": 1})
  with pytest.raises(ValueError, match="does not know: tint"):  # inside the engine's options
    srr.SRRConfig.from_json({**saved, "engine": {**saved["engine"], "tint": 1}})
  v2 = _version2(_config())
  del v2["query_pool"]
  with pytest.raises(ValueError, match="lacks query_pool"):
    config_migration.migrate(v2)


def test_the_flat_configs_the_cli_resolved_before_load():
  baselines = json.loads((_REPO / "tests" / "cli_baselines.json").read_text(encoding="utf-8"))
  flat = {command: case["config"] for command, case in baselines.items()
          if command.startswith("srr")}
  assert flat
  for command, saved in flat.items():
    config = srr.SRRConfig.from_json(saved)
    assert (config.student_learning_rate, config.generator_learning_rate,
            config.pretrain_learning_rate) == (
                saved["student_lr"], saved["generator_lr"], saved["pretrain_lr"]), command
    assert dataclasses.asdict(config.engine) == {name: saved[name] for name in _ENGINE}, command
