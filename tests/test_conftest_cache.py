"""Tests of the suite's compilation-cache pruning (tests/conftest.py)."""

import os

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
