"""dpkd_jax.methods.rona.config_migration: every saved form of a RONA config loads as the same
config, and a checkpoint holding the old form is resumed; a newer or unknown form is refused
in one line."""

import json
import os
import pathlib

import numpy as np
import pytest

from dpkd_jax import errors
from dpkd_jax.methods import rona
from dpkd_jax.methods.rona import config_migration
from dpkd_jax.train import checkpoint
from dpkd_jax.train import workdir as workdir_lib

_REPO = pathlib.Path(__file__).resolve().parent.parent
_OLD_NAMES = {"hint_l2_clip_norm": "hint_l2_bound",
              "distill_l2_clip_norm": "distill_l2_bound"}  # version 1's names, written here


def _config(**kw):
  base = dict(noise_multiplier=2.0, dataset="digits", bound_mode="fixed",
              hint_l2_clip_norm=5.0, distill_l2_clip_norm=0.5, seed=0)
  return rona.RONAConfig(**{**base, **kw})


def _version1(config: rona.RONAConfig) -> dict:
  """`config` as version 1 saved it: flat, the old names, `validation_examples` left out
  at 0."""
  out = {_OLD_NAMES.get(k, k): v for k, v in config.to_json().items() if k != "version"}
  if out["validation_examples"] == 0:
    del out["validation_examples"]
  return out


@pytest.mark.parametrize("kw", [{}, dict(validation_examples=50), dict(
    bound_mode="adaptive", hint_l2_clip_norm=None, distill_l2_clip_norm=None)])
def test_every_saved_form_loads_as_the_same_config(kw):
  config = _config(**kw)
  saved, old = config.to_json(), _version1(config)
  assert saved["version"] == config_migration.VERSION == 2
  assert "version" not in old and "hint_l2_bound" in old
  for form in (saved, old):
    assert config_migration.migrate(form) == saved
    assert rona.RONAConfig.from_json(form) == config
  assert json.loads(json.dumps(saved)) == saved


def test_the_renames_are_the_cli_aliases(capsys):
  from experiments import rona as rona_cli  # pylint: disable=import-outside-toplevel
  assert config_migration.V1_RENAMED == {old: new for new, old in _OLD_NAMES.items()}
  assert rona.RONAConfig.RENAMED == config_migration.V1_RENAMED
  flags = ["--dataset=digits", "--noise_multiplier=2", "--bound_mode=fixed", "--seed=0"]
  new, _ = rona_cli.parse_config(flags + ["--hint_l2_clip_norm=5", "--distill_l2_clip_norm=0.5"])
  assert capsys.readouterr().err == ""
  old, _ = rona_cli.parse_config(flags + ["--hint_l2_bound=5", "--distill_l2_bound=0.5"])
  assert old == new == _config()
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 2 and all("deprecated" in line for line in err), err


def test_an_unreadable_form_is_refused_in_one_line():
  saved = _config().to_json()
  with pytest.raises(ValueError, match="newer dpkd-jax"):
    rona.RONAConfig.from_json({**saved, "version": 3})
  with pytest.raises(ValueError, match="version must be an integer"):
    config_migration.migrate({**saved, "version": "2"})
  with pytest.raises(ValueError, match="does not know: colour"):
    rona.RONAConfig.from_json({**saved, "colour": 1})


@pytest.mark.filterwarnings("ignore:.*run_clock.json' is missing")  # no earlier process here
def test_a_checkpoint_of_the_old_form_resumes(tmp_path):
  # What train_rona opens its workdir with: the checkpoint's config is compared after the
  # migration, so a version-1 checkpoint of the same run resumes and one of another is refused.
  config = _config()
  workdir = str(tmp_path / "run")
  checkpoint.save(os.path.join(workdir, "checkpoints"), 1, {"x": np.zeros(2, np.float32)},
                  {"config": _version1(config), "unit": 1})
  run = workdir_lib.open_run(workdir, kind="RONA", config=config.to_json(), resume=True,
                             migrate=config_migration.migrate)
  assert run.resuming and run.step == 1
  run.close()
  other = _config(distill_l2_clip_norm=0.25).to_json()
  with pytest.raises(errors.UserError, match="another config"):
    workdir_lib.open_run(workdir, kind="RONA", config=other, resume=True,
                         migrate=config_migration.migrate)


def test_the_flat_config_the_cli_resolved_before_loads():
  baselines = json.loads((_REPO / "tests" / "cli_baselines.json").read_text(encoding="utf-8"))
  flat = {command: case["config"] for command, case in baselines.items()
          if command.startswith("rona")}
  assert flat
  for command, saved in flat.items():
    config = rona.RONAConfig.from_json(saved)
    assert (config.hint_l2_clip_norm, config.distill_l2_clip_norm) == (
        saved["hint_l2_bound"], saved["distill_l2_bound"]), command
