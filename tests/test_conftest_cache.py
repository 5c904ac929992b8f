"""Tests of the suite's caches (tests/conftest.py): compilation-cache pruning, and bytecode
written by every process the suite starts."""

import os
import subprocess
import sys

from conftest import _prune_test_cache


def write(directory, name, size, mtime):
  path = os.path.join(directory, name)
  with open(path, "wb") as f:
    f.write(b"x" * size)
  os.utime(path, (mtime, mtime))


def test_under_the_bound_nothing_is_deleted(tmp_path):
  for i in range(3):
    write(tmp_path, f"e{i}-cache", 10, mtime=1000 + i)
  _prune_test_cache(str(tmp_path), max_bytes=30, keep_bytes=10)
  assert sorted(os.listdir(tmp_path)) == ["e0-cache", "e1-cache", "e2-cache"]


def test_over_the_bound_the_oldest_go_until_the_newest_fit(tmp_path):
  for i in range(5):
    write(tmp_path, f"e{i}-cache", 10, mtime=1000 + i)
  _prune_test_cache(str(tmp_path), max_bytes=40, keep_bytes=20)
  assert sorted(os.listdir(tmp_path)) == ["e3-cache", "e4-cache"]


def test_a_missing_directory_is_no_error(tmp_path):
  _prune_test_cache(str(tmp_path / "absent"))


def test_the_suite_and_the_processes_it_starts_write_bytecode():
  """Even where the environment said PYTHONDONTWRITEBYTECODE: a CLI process of the suite would
  otherwise compile every package it imports from source again."""
  assert not sys.dont_write_bytecode
  done = subprocess.run([sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"],
                        capture_output=True, text=True, check=True, timeout=60)
  assert done.stdout.strip() == "False"
