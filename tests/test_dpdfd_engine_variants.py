"""The engine-variant harness (`benchmarks/dpdfd_engine_variants.py`, issue #22): it runs each
variant and records epsilon = inf whenever a variant reads the teacher without noise."""

import importlib.util
import json
import math
import pathlib
import sys

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "dpdfd_engine_variants.py"


def _harness():
  spec = importlib.util.spec_from_file_location("dpdfd_engine_variants", _PATH)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("flags, finite", [
    (["--noise_multiplier=1"], True),
    (["--noise_multiplier=1", "--generator_objective=teacher"], False),  # reads the teacher
    (["--teacher_loss=logit", "--replay=2", "--replay_steps=1", "--ema=0.9", "--tv_weight=0.1",
      "--generator_every=2"], False),  # sigma = 0
])
def test_variants_run_and_record_their_epsilon(teacher_dir, tmp_path, flags, finite):
  out = tmp_path / "run"
  _harness().main([f"--teacher={teacher_dir}", "--steps=2", "--eval_every=1", "--batch_size=8",
                   "--generator_channels=4", f"--out={out}", *flags])
  record = json.loads((out / "record.json").read_text())
  assert (record["sound_epsilon"] != "inf") == finite
  assert record["sound_epsilon"] == "inf" or math.isfinite(record["sound_epsilon"])
  assert (out / "metrics.csv").read_text().count("test/accuracy") == 2


def test_unknown_variant_is_refused():
  with pytest.raises(ValueError, match="teacher_loss"):
    _harness().Variant(teacher_loss="hinge")
