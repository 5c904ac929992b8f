"""dpkd_jax.methods.srr.config_migration: every saved form of an SRR config loads as the same
config; a newer or unknown one is refused in one line."""

import json
import pathlib

import pytest

from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import config_migration

_REPO = pathlib.Path(__file__).resolve().parent.parent
_OLD_NAMES = {"pretrain_learning_rate": "pretrain_lr", "student_learning_rate": "student_lr",
              "generator_learning_rate": "generator_lr"}  # version 1's names, written here


def _config(**kw):
  base = dict(dataset="digits", teacher_dir="t", epsilon=1.0, stages=2, samples_per_stage=32,
              batch_size=16, latent_dim=8, generator_channels=8)
  return srr.SRRConfig(**{**base, **kw})


def _version1(config: srr.SRRConfig) -> dict:
  """`config` as the version-1 `to_json` saved it: flat, the old names, and the fields added
  later left out at their default."""
  out = {_OLD_NAMES.get(k, k): v for k, v in config.to_json().items() if k != "version"}
  for name in ("student_replay", "query_pool", "student_schedule", "validation_examples"):
    field_default = srr.SRRConfig.__dataclass_fields__[name].default
    if out[name] == field_default:
      del out[name]
  return out


@pytest.mark.parametrize("kw", [{}, dict(student_replay=True, query_pool=4,
                                         student_schedule="constant", validation_examples=50,
                                         student_learning_rate=3e-4, pretrain_learning_rate=2e-3)])
def test_every_saved_form_loads_as_the_same_config(kw):
  config = _config(**kw)
  saved, old = config.to_json(), _version1(config)
  assert "version" not in old and "student_lr" in old
  for form in (saved, old):
    assert config_migration.migrate(form) == saved
    assert srr.SRRConfig.from_json(form) == config
  assert json.loads(json.dumps(saved)) == saved


def test_the_renames_are_the_cli_aliases():
  assert config_migration.V1_RENAMED == {old: new for new, old in _OLD_NAMES.items()}
  assert srr.SRRConfig.RENAMED == config_migration.V1_RENAMED


def test_an_unreadable_form_is_refused_in_one_line():
  saved = _config().to_json()
  with pytest.raises(ValueError, match="newer dpkd-jax"):
    srr.SRRConfig.from_json({**saved, "version": 3})
  with pytest.raises(ValueError, match="version must be an integer"):
    config_migration.migrate({**saved, "version": "2"})
  with pytest.raises(ValueError, match="does not know: colour"):
    srr.SRRConfig.from_json({**saved, "colour": 1})


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
