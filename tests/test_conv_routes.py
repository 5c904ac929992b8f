"""Tests of `dpkd_jax.models.conv_routes`: measured, cached choice among exact conv forms."""

import json

import jax.numpy as jnp
import pytest

from dpkd_jax.models import conv_routes

SHAPES = ((4, 4),)
FORMS = {"xla": lambda a: a + 1.0, "gemm": lambda a: a * 2.0, "banded": lambda a: a - 1.0}


@pytest.fixture
def measuring(monkeypatch, tmp_path):
  monkeypatch.setenv(conv_routes.ENV_VAR, "measure")
  monkeypatch.setenv(conv_routes.CACHE_ENV_VAR, str(tmp_path))
  conv_routes.clear()
  yield tmp_path
  conv_routes.clear()


def fake_clock(durations):
  """A clock under which the k-th timed form takes durations[k] per call (forms are timed in
  the order of FORMS, TIMED_CALLS calls each, two clock readings per call)."""
  readings, now = [], 0.0
  for duration in durations:
    for _ in range(conv_routes.TIMED_CALLS):
      readings += [now, now + duration]
      now += duration + 1.0
  values = iter(readings)
  return lambda: next(values)


def test_static_mode_takes_the_static_form_without_timing(monkeypatch):
  monkeypatch.setenv(conv_routes.ENV_VAR, "static")
  never = lambda: pytest.fail("timed in static mode")  # noqa: E731
  assert conv_routes.choose("k", FORMS, SHAPES, "gemm", clock=never) == "gemm"


def test_measure_picks_the_fastest_and_caches_it(measuring):
  assert conv_routes.choose("k", FORMS, SHAPES, "xla", clock=fake_clock([3, 1, 2])) == "gemm"
  # Second time: from memory, not timed.
  never = lambda: pytest.fail("timed again")  # noqa: E731
  assert conv_routes.choose("k", FORMS, SHAPES, "xla", clock=never) == "gemm"
  # A new process (memory cleared) reads the disk cache of this machine and jax version.
  conv_routes.clear()
  assert conv_routes.choose("k", FORMS, SHAPES, "xla", clock=never) == "gemm"
  table = json.loads(conv_routes.cache_path().read_text())
  assert list(table.values()) == [{"k": "gemm"}]


def test_a_cached_form_no_longer_offered_is_measured_again(measuring):
  conv_routes.choose("k", FORMS, SHAPES, "xla", clock=fake_clock([3, 2, 1]))  # banded
  forms = {name: FORMS[name] for name in ("xla", "gemm")}
  assert conv_routes.choose("k", forms, SHAPES, "xla", clock=fake_clock([1, 2])) == "xla"


def test_corrupt_or_unwritable_cache_is_not_an_error(measuring, monkeypatch, tmp_path):
  conv_routes.cache_path().write_bytes(b"\x00not json")
  assert conv_routes.choose("k", FORMS, SHAPES, "xla", clock=fake_clock([2, 3, 1])) == "banded"
  blocked = tmp_path / "file"
  blocked.write_text("")
  monkeypatch.setenv(conv_routes.CACHE_ENV_VAR, str(blocked))  # a file where a folder should be
  conv_routes.clear()
  assert conv_routes.choose("k2", FORMS, SHAPES, "xla", clock=fake_clock([1, 3, 2])) == "xla"


def test_single_form_and_bad_arguments():
  assert conv_routes.choose("k", {"xla": FORMS["xla"]}, SHAPES, "xla") == "xla"
  with pytest.raises(ValueError, match="static form"):
    conv_routes.choose("k", FORMS, SHAPES, "cudnn")


def test_bad_mode_is_one_clear_error(monkeypatch):
  monkeypatch.setenv(conv_routes.ENV_VAR, "fastest")
  with pytest.raises(ValueError, match="DPKD_CONV_ROUTES='fastest'"):
    conv_routes.mode()


def test_forms_are_timed_on_arrays_of_the_given_shapes(measuring):
  seen = []
  forms = {"xla": lambda a, b: seen.append((a.shape, b.shape)) or a.sum() + b.sum(),
           "gemm": lambda a, b: jnp.sum(a) * jnp.sum(b)}
  conv_routes.choose("k", forms, ((2, 3), (5,)), "xla", clock=fake_clock([1, 2]))
  assert seen == [((2, 3), (5,))]  # traced once by jit, with the shapes asked for
