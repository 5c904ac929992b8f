"""`--dry_run` of experiments.dpdfd and the roofline arithmetic behind it (train/dry_run.py).

The command tests size a small network pair (LeNet-5 teacher and student, B = 8, generator
width 8) so that the CPU compile stays short; the CIFAR-10 recipe's own figures are the
record docs/results/benchmarks/dpdfd_cifar10_dry_run.json.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from dpkd_jax.train import dry_run
from experiments import dpdfd as dpdfd_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--dataset=cifar10", "--teacher_model=lenet5", "--student_model=lenet5",
         "--batch_size=8", "--generator_channels=8", "--steps=30"]
TOY = dry_run.Chip("toy", peak_flops=1e12, precision="fp32", hbm_bytes_per_s=1e11)


def test_estimate_is_the_roofline_over_the_utilisation():
  compute = dry_run.estimate(4e12, 1e11, TOY, utilisation=0.5)  # 4 s of FLOPs, 1 s of bytes
  assert compute == {"compute_bound_s": 4.0, "memory_bound_s": 1.0, "bound": "compute",
                     "step_s": 8.0}
  memory = dry_run.estimate(1e12, 3e11, TOY, utilisation=1.0)  # 1 s of FLOPs, 3 s of bytes
  assert memory["bound"] == "memory" and memory["step_s"] == pytest.approx(3.0)
  with pytest.raises(ValueError, match="utilisation"):
    dry_run.estimate(1.0, 1.0, TOY, utilisation=0.0)


def test_chips_assume_the_stated_peaks():
  h100, v5e = dry_run.CHIPS
  assert (h100.peak_flops, h100.hbm_bytes_per_s) == (494.7e12, 3.35e12)  # TF32: JAX's f32
  assert dict(h100.peaks) == {"bf16": 989e12, "TF32": 494.7e12, "FP32": 66.9e12}
  assert (v5e.peak_flops, v5e.hbm_bytes_per_s) == (197e12, 819e9)  # one bf16 pass
  assert "TF32" in h100.precision and "bf16" in v5e.precision


def test_step_cost_of_a_matmul_counts_its_flops_and_arguments():
  a, b = jax.ShapeDtypeStruct((64, 128), jnp.float32), jax.ShapeDtypeStruct((128, 32),
                                                                            jnp.float32)
  cost = dry_run.step_cost(jax.jit(jnp.dot), a, b)
  assert cost.flops == 2 * 64 * 128 * 32  # one multiply-add: 2 FLOPs
  assert cost.memory["argument_size_in_bytes"] == 4 * (64 * 128 + 128 * 32)
  assert cost.memory["output_size_in_bytes"] == 4 * 64 * 32
  assert cost.bytes_accessed >= 4 * (64 * 128 + 128 * 32 + 64 * 32)
  assert cost.backend == "cpu"


def test_duration_picks_a_readable_unit():
  assert [dry_run.duration(s) for s in (12.0, 90.0, 7200.0, 172800.0)] == [
      "12 s", "1.5 min", "2 h", "2 d"]


def test_dry_run_prints_the_fields_and_writes_only_its_record(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)  # the default workdir would be runs/dpdfd/cifar10 here
  dpdfd_cli.main(SMALL + ["--dry_run", "--dry_run_out=record.json"])
  out = capsys.readouterr().out
  for field in ("FLOPs per step", "bytes accessed per step", "memory per step (cpu compile)",
                "30 steps", "NVIDIA H100 SXM", "TPU v5e", "at 40% of both peaks",
                "--noise_multiplier=1 stands in"):
    assert field in out, field
  assert sorted(os.listdir(tmp_path)) == ["record.json"]  # no runs/, no teacher, no ledger
  record = json.loads((tmp_path / "record.json").read_text())
  assert record["steps"] == 30 and record["teacher_model"] == "lenet5"
  assert record["flops_per_step"] > 0 and record["peak_memory_bytes"] > 0
  h100 = record["chips"][0]
  assert h100["run_s"] == pytest.approx(30 * h100["step_s"])
  assert h100["step_s"] == pytest.approx(
      max(record["flops_per_step"] / 494.7e12, record["bytes_accessed_per_step"] / 3.35e12)
      / 0.4)


def test_dry_run_command_exits_zero_without_data(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, DPKD_DATA_DIR=str(tmp_path / "no_data"))
  done = subprocess.run([sys.executable, "-m", "experiments.dpdfd", *SMALL,
                         "--noise_multiplier=2", "--dry_run"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr
  assert "FLOPs per step" in done.stdout and "stands in" not in done.stdout
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags, match", [
    (["--dry_run_out=/no/such/folder/record.json"], "--dry_run_out: folder"),
    (["--teacher_dirs=t", "--teacher_model=resnet99"], "--teacher_model=resnet99: choose one of"),
    (["--teacher_ensemble_dir=e"], "does not read --teacher_ensemble_dir"),
])
def test_dry_run_mistakes_are_one_line_before_any_compile(flags, match, capsys):
  with pytest.raises(SystemExit) as exit_info:
    dpdfd_cli.main(SMALL + ["--dry_run", *flags])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert match in err and len(err.splitlines()) == 1
