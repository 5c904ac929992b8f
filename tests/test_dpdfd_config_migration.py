"""dpkd_jax.methods.dpdfd.config_migration: every saved form of a DPDFD config loads as the same
config, and today's form is versioned, complete and round-trips."""

import dataclasses
import json
import pathlib
import shlex

import pytest
from dpdfd_fixtures import OLD_NAMES, dpdfd_config, version1_json

from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import config_migration
from experiments import dpdfd as dpdfd_cli

_REPO = pathlib.Path(__file__).resolve().parent.parent
_BASE = dict(dataset="digits", teacher_dirs=("t",), student_model="lenet5_half",
             noise_multiplier=10.0, steps=4, batch_size=16, eval_every=2, latent_dim=16)
# Configs with every option of the engine off, and on, and the later core fields set.
_CONFIGS = {
    "paper": {},
    "engine": dict(bound_method="clip", teacher_loss="logit",
                   generator_objective="disagreement", probe_directions=2,
                   class_conditional_weight=1.0, smoothness_weight=0.1, diversity_weight=0.5,
                   released_balance_weight=0.5, param_averaging_decay=0.9, replay_size=160,
                   replay_batch=8, replay_sampling="class_balanced", replay_memory="per_class",
                   generator_restart_ratio=1.5, generator_restart_patience=1,
                   generator_max_restarts=3),
    "core": dict(secure_noise=True, secure_grid_bits=20, validation_examples=300,
                 teacher_dirs=(), teacher_ensemble_dir="ens", seed=3),
}


def _recorded_configs() -> dict[str, dpdfd.DPDFDConfig]:
  """{record: the config its recorded command resolves to}, for every DPDFD record whose
  command is a plain `python -m experiments.dpdfd` run (not a placeholder, shell expansion,
  `sample`, direct mode or dry run)."""
  out = {}
  for path in sorted((_REPO / "docs" / "results").glob("dpdfd__*.json")):
    command = json.loads(path.read_text(encoding="utf-8"))["command"]
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-"):
      words = words[1:]  # DPKD_DATA_DIR=... before the command
    if (words[:3] != ["python", "-m", "experiments.dpdfd"] or "<" in command or "$" in command
        or {"sample", "--mode=direct", "--dry_run"} & set(words)):
      continue
    argv = [w for w in words[3:] if not w.startswith(("--workdir", "--no_progress"))]
    out[path.name] = dpdfd_cli.parse_config(argv)[0]
  return out


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_every_saved_form_loads_as_the_same_config(name):
  config = dpdfd_config(**{**_BASE, **_CONFIGS[name]})
  current = config.to_json()
  flat = {**dataclasses.asdict(config), **dataclasses.asdict(config.engine)}
  del flat["engine"]
  flat = {OLD_NAMES.get(name, name): value for name, value in flat.items()}  # version 1
  flat = json.loads(json.dumps(flat))  # as saved: JSON
  nested_unversioned = {k: v for k, v in current.items() if k != "version"}
  for saved in (current, version1_json(config), flat, nested_unversioned):
    assert config_migration.migrate(saved) == current
    assert dpdfd.DPDFDConfig.from_json(saved) == config
  assert json.loads(json.dumps(current)) == current  # plain JSON


def test_the_current_form_is_versioned_and_writes_every_field():
  config = dpdfd_config(**_BASE)
  saved = config.to_json()
  assert saved["version"] == config_migration.VERSION == 2
  assert set(saved) == {"version"} | {f.name for f in dataclasses.fields(config)}
  assert set(saved["engine"]) == {f.name for f in dataclasses.fields(dpdfd.EngineOptions)}
  # The engine's options as version 2 nests them are today's EngineOptions fields.
  assert set(config_migration.V2_ENGINE_FIELDS) == set(saved["engine"])
  # Version 1 left out only fields at their default, which is what migrate fills in.
  for name, value in config_migration.V1_OMITTED.items():
    assert saved["engine"].get(name, saved.get(name)) == value, name


def test_version_1_names_are_the_renamed_fields():
  assert config_migration.V1_RENAMED == {old: new for new, old in OLD_NAMES.items()}
  assert dpdfd.DPDFDConfig.RENAMED == config_migration.V1_RENAMED  # the CLI's flag aliases
  old = version1_json(dpdfd_config(**{**_BASE, "student_learning_rate": 3e-4}))
  assert old["student_lr"] == 3e-4 and "student_learning_rate" not in old
  assert dpdfd.DPDFDConfig.from_json(old).student_learning_rate == 3e-4


def test_migrate_leaves_its_argument_as_it_was():
  old = version1_json(dpdfd_config(**{**_BASE, **_CONFIGS["engine"]}))
  copy = json.loads(json.dumps(old))
  config_migration.migrate(old)
  assert old == copy


@pytest.mark.parametrize("saved,match", [
    ({"version": 3}, "newer dpkd-jax"),
    ({"version": "2"}, "version must be an integer"),
    ({"version": 0}, "version must be an integer"),
    (["not", "a", "dict"], "JSON object"),
])
def test_an_unreadable_form_is_refused_in_one_line(saved, match):
  with pytest.raises(ValueError, match=match):
    config_migration.migrate(saved)


def test_unknown_or_missing_fields_are_refused():
  saved = dpdfd_config(**_BASE).to_json()
  with pytest.raises(ValueError, match="does not know: colour"):
    dpdfd.DPDFDConfig.from_json({**saved, "colour": "red"})
  with pytest.raises(ValueError, match="does not know: colour"):
    dpdfd.DPDFDConfig.from_json({**saved, "engine": {**saved["engine"], "colour": 1}})
  old = version1_json(dpdfd_config(**_BASE))
  del old["probe_step"]  # version 1 always wrote it
  with pytest.raises(ValueError, match="lacks probe_step"):
    config_migration.migrate(old)


def test_every_recorded_command_saves_and_loads_in_every_form():
  recorded = _recorded_configs()
  assert len(recorded) > 100  # the records of docs/results with a plain CLI command
  for name, config in recorded.items():
    assert dpdfd.DPDFDConfig.from_json(config.to_json()) == config, name
    assert dpdfd.DPDFDConfig.from_json(version1_json(config)) == config, name


def test_the_flat_configs_the_cli_resolved_before_load():
  baselines = json.loads((_REPO / "tests" / "cli_baselines.json").read_text(encoding="utf-8"))
  flat = {command: case["config"] for command, case in baselines.items()
          if command.startswith("dpdfd") and "--mode=direct" not in command}
  assert flat
  for command, saved in flat.items():
    saved = {k: (float(v) if v in ("inf", "-inf") else v) for k, v in saved.items()}
    config = dpdfd.DPDFDConfig.from_json(saved)
    assert config.to_json()["engine"] == {name: saved[name]
                                          for name in config_migration.V2_ENGINE_FIELDS}, command
    assert (config.l2_clip_norm, config.student_learning_rate) == (
        saved["l2_norm_bound"], saved["student_lr"]), command
