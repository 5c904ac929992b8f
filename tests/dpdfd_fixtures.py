"""DPDFD config helpers shared by the DPDFD tests.

`dpdfd_config(**values)` builds a `DPDFDConfig` from flat keyword values, as the CLI's flat
flags do: the engine's options go into `engine`. `version1_json(config)` is the saved config as
the version-1 `to_json` wrote it (flat, the names before the renames to the library's
vocabulary, and the fields added after workdirs were first saved left out at their default): a checkpoint of an older run, for the migration and resume tests.
"""

import dataclasses

from dpkd_jax.methods import dpdfd

ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(dpdfd.EngineOptions))
# Version 1's names of the fields renamed since (written here, not read from the library).
OLD_NAMES = {"l2_clip_norm": "l2_norm_bound", "student_learning_rate": "student_lr",
             "generator_learning_rate": "generator_lr"}


def dpdfd_config(**values) -> dpdfd.DPDFDConfig:
  """A DPDFDConfig of flat values (the `EngineOptions` fields among them go to `engine`)."""
  engine = {name: values.pop(name) for name in ENGINE_FIELDS if name in values}
  return dpdfd.DPDFDConfig(**values, engine=dpdfd.EngineOptions(**engine))


def version1_json(config: dpdfd.DPDFDConfig) -> dict:
  """`config` saved as the version-1 `to_json` saved it (flat, conditional omissions)."""
  out = {**dataclasses.asdict(config), **dataclasses.asdict(config.engine)}
  del out["engine"]
  out["teacher_dirs"] = list(config.teacher_dirs)
  out = {OLD_NAMES.get(name, name): value for name, value in out.items()}
  for name in ("param_averaging_decay", "diversity_weight", "released_balance_weight",
               "class_conditional_weight", "smoothness_weight", "secure_noise",
               "secure_grid_bits", "validation_examples"):
    if not out[name]:
      del out[name]
  if not out["generator_restart_ratio"]:
    for name in ("generator_restart_ratio", "generator_restart_patience",
                 "generator_max_restarts"):
      del out[name]
  if not out["replay_size"]:
    del out["replay_size"], out["replay_batch"]
  if out["replay_sampling"] == "uniform":
    del out["replay_sampling"]
  if out["replay_memory"] == "ring":
    del out["replay_memory"]
  if out["teacher_ensemble_dir"] is None:
    del out["teacher_ensemble_dir"]
  return out
