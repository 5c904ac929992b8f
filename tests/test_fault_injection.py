"""Fault injection on the CLIs: `benchmarks/fault_injection.py`.

kill -9 at a random release then resume, overwritten checkpoint bytes, a concurrent start, a
dataset missing offline, and bad input or refused writes (one line, nothing charged), each on
tiny digits runs compared with an uninterrupted run. The kill points come from a random seed
(set DPKD_FAULT_SEED to replay one); the report of what was tried is printed in the pytest
summary (single-process runs only) and in every failure message.

Beside DP-SGD, the seed also draws which other method (DPDFD, RONA, SRR or reverse k-NN) is
killed: one each run keeps the file within its CI budget (every run still trains a teacher and
covers a replaying resume and a second CLI's ledger), and the draws cover all four over runs;
`python benchmarks/fault_injection.py` kills all four. Each method's resume is also checked
bit for bit in-process (tests/test_<method>_run.py).
"""

import functools
import importlib.util
import os
import pathlib
import random
import sys

import pytest

_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "fault_injection.py"


@functools.cache
def _script():
  spec = importlib.util.spec_from_file_location("fault_injection", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
  spec.loader.exec_module(module)
  return module


def drawn_method(module, seed: int) -> str:
  """The method this seed kills beside DP-SGD (its own draw: the kill points are unchanged)."""
  return random.Random(f"method {seed}").choice(sorted(module.KILLED_METHODS))


@pytest.fixture(scope="module")
def injected(tmp_path_factory, request):
  module = _script()
  seed = int(os.environ.get("DPKD_FAULT_SEED", random.SystemRandom().randrange(2**32)))
  method = drawn_method(module, seed)
  outcomes = module.run_all(str(tmp_path_factory.mktemp("faults")), seed, (method,))
  report = [f"fault injection (DPKD_FAULT_SEED={seed}; kill -9 of dpsgd and {method}):",
            *("  " + outcome.line() for outcome in outcomes.values())]
  capture = request.config.pluginmanager.get_plugin("capturemanager")
  with capture.global_and_fixture_disabled():  # the report shows even without -s
    print("\n" + "\n".join(report))
  return module, outcomes, "\n".join(report)


def _check(injected, key):
  module, outcomes, report = injected
  del module
  # The whole report (its seed first) is in the failure message too: under pytest-xdist a
  # worker's print above never reaches the terminal, and the seed is what replays a failure.
  assert not outcomes[key].problems, f"{outcomes[key].line()}\n{report}"


def test_kill_9_of_dpsgd_at_a_random_release_then_resume_loses_nothing(injected):
  _check(injected, "kill_dpsgd")


def test_kill_9_of_a_drawn_method_at_a_random_release_then_resume_loses_nothing(injected):
  (method,) = [key[len("kill_"):] for key in injected[1] if key.startswith("kill_")
               and key != "kill_dpsgd"]
  _check(injected, f"{method}_ref")
  _check(injected, f"kill_{method}")


def test_each_method_is_drawn():
  module = _script()
  assert {drawn_method(module, seed) for seed in range(30)} == set(module.KILLED_METHODS)


def test_overwritten_newest_checkpoint_falls_back_to_the_same_end(injected):
  _check(injected, "corrupt")


def test_every_checkpoint_overwritten_is_refused_in_one_line(injected):
  _check(injected, "all_corrupt")


def test_second_run_in_a_busy_workdir_is_refused_and_the_first_unharmed(injected):
  _check(injected, "concurrent")


def test_missing_data_offline_fails_fast_in_one_line(injected):
  _check(injected, "offline")


@pytest.mark.parametrize("key", ["overflow_flag", "empty_test", "file_size_limit",
                                 "dpdfd_batch"])
def test_bad_input_and_refused_writes_are_one_line_and_charge_nothing_unreleased(injected, key):
  _check(injected, key)
