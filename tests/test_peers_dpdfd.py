"""The PyTorch eager twin of the DPDFD step (`benchmarks/peers_dpdfd.py`): it builds
at perf_table's configuration with our parameter counts, runs, and computes our step.

Skipped without torch (a benchmark extra, `pip install -e .[bench]`).
"""

import importlib.util
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

_BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
_TINY = dict(batch_size=4, generator_channels=4, image_shape=(12, 12, 1))


def _load(name: str):
  """A benchmark script as a module (benchmarks/ is not a package; its scripts import siblings)."""
  sys.path.insert(0, str(_BENCHMARKS))
  try:
    spec = importlib.util.spec_from_file_location(name, _BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(_BENCHMARKS))
  return module


@pytest.fixture(scope="module")
def twin():
  return _load("peers_dpdfd")


def test_parameter_counts_equal_ours_at_the_timed_configuration(twin):
  base = _load("perf_table").DPDFD_BASE
  parts = twin.jax_models(base["generator_channels"], base["image_shape"])
  nets = twin.TorchDPDFD(twin.step_config(base["batch_size"]), base["generator_channels"],
                         base["image_shape"], parts)
  for name in ("student", "teacher", "generator"):
    ours = twin.models.count_params(parts[name].params)
    assert sum(p.numel() for p in getattr(nets, name).parameters()) == ours, name
  # datalens_cnn and small_cnn with BatchNorm at 28×28×1, DAFL of width 64.
  assert [twin.models.count_params(parts[n].params) for n in ("student", "teacher", "generator")
          ] == [515_242, 421_738, 372_737]
  assert callable(twin.build_torch_dpdfd_step(**base))


def test_a_different_architecture_is_refused(twin):
  parts = twin.jax_models(4, (12, 12, 1))
  with pytest.raises(AssertionError, match="JAX vs .* PyTorch parameters"):
    twin.copy_from_jax(twin.DAFLGenerator((12, 12, 1), 8), parts["generator"])


def test_the_step_runs_and_trains_both_models(twin):
  step = twin.build_torch_dpdfd_step(**_TINY)
  nets = (step.twin.student, step.twin.generator)
  before = [[p.detach().clone() for p in net.parameters()] for net in nets]
  step()
  for net, old in zip(nets, before):
    new = list(net.parameters())
    assert all(torch.isfinite(p).all() for p in new)
    assert all(not torch.equal(a, b) for a, b in zip(old, new)), type(net).__name__


@pytest.mark.slow
def test_same_step_as_ours_in_float64(twin):
  """Equal weights, z and noise: gradients and losses of one step agree to float64 rounding."""
  worst = twin.check_against_ours(**_TINY, float64=True)
  assert max(worst.values()) < 1e-9, worst
