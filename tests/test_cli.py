"""experiments/_cli.py: one-line user errors, exit status 2, write checks that write nothing."""

import errno
import os
import sys
import types
import warnings

import pytest

from dpkd_jax import errors
from experiments import _cli


def _exit_line(capsys, fn, *args) -> str:
  with pytest.raises(SystemExit) as exit_info:
    fn(*args)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ")
  return err.strip()


def test_fail_joins_lines(capsys):
  line = _exit_line(capsys, _cli.fail, "first\n  second\n\nthird")
  assert line == "error: first; second; third"


def test_parser_error_is_one_line(capsys):
  p = _cli.Parser(prog="python -m experiments.x")
  p.add_argument("--n", type=int, required=True)
  line = _exit_line(capsys, p.parse_args, ["--n=x"])
  assert "argument --n: invalid int value: 'x'" in line and "python -m experiments.x --help" in line
  assert "usage" not in line
  assert "required: --n" in _exit_line(capsys, p.parse_args, [])


def test_build_reports_the_config_error(capsys):
  def config(**kwargs):
    raise ValueError(f"bad {kwargs}")
  assert _exit_line(capsys, _cli.build, config) == "error: bad {}"


@pytest.mark.parametrize("error,fragment", [
    (errors.UserError("a user error\nsecond line"), "a user error; second line"),
    (PermissionError(errno.EACCES, "Permission denied", "/x/y"), "'/x/y': Permission denied"),
    (OSError(errno.ENOSPC, "No space left on device"), "No space left"),
])
def test_entry_point_maps_user_errors(error, fragment, capsys):
  @_cli.entry_point
  def main(argv):
    raise error
  assert fragment in _exit_line(capsys, main, [])


def test_entry_point_keeps_bugs_and_passes_argv(monkeypatch):
  seen = []

  @_cli.entry_point
  def main(argv):
    seen.append(argv)
    raise FileNotFoundError(errno.ENOENT, "a bug: an internal file is missing")

  monkeypatch.setattr(sys, "argv", ["prog", "--a"])
  with pytest.raises(FileNotFoundError):
    main()
  assert seen == [["--a"]]


def test_closed_event_loop_noise_is_dropped(monkeypatch, capsys):
  calls = []
  monkeypatch.setattr(sys, "__unraisablehook__", calls.append)
  noise = types.SimpleNamespace(exc_type=RuntimeError, exc_value=RuntimeError("Event loop is closed"))
  other = types.SimpleNamespace(exc_type=RuntimeError, exc_value=RuntimeError("other"))
  _cli._quiet_closed_loop(noise)
  _cli._quiet_closed_loop(other)
  assert calls == [other]


def test_check_output_dir(tmp_path):
  (tmp_path / "file").write_text("x")
  (tmp_path / "existing").mkdir()
  _cli.check_output_dir(str(tmp_path / "existing"), "--workdir")
  _cli.check_output_dir(str(tmp_path / "new" / "deeper"), "--workdir")
  _cli.check_output_dir("gs://bucket/run", "--workdir")  # left to the storage library
  with pytest.raises(errors.UserError, match="--workdir: .*file' is a file"):
    _cli.check_output_dir(str(tmp_path / "file"), "--workdir")
  with pytest.raises(errors.UserError, match="cannot create .*file/run.*is a file"):
    _cli.check_output_dir(str(tmp_path / "file" / "run"), "--workdir")
  assert sorted(os.listdir(tmp_path)) == ["existing", "file"]  # the probe left nothing


def test_check_output_dir_unwritable(tmp_path, monkeypatch):
  monkeypatch.setattr(os, "access", lambda path, mode: False)
  with pytest.raises(errors.UserError, match="--teachers_dir: directory .* is not writable"):
    _cli.check_output_dir(str(tmp_path), "--teachers_dir")
  with pytest.raises(errors.UserError, match="cannot create .*new.*give a writable path"):
    _cli.check_output_dir(str(tmp_path / "new"), "--teachers_dir")


def test_check_output_file(tmp_path):
  _cli.check_output_file(str(tmp_path / "out.png"), "--out")
  with pytest.raises(errors.UserError, match="--out: folder .*missing' does not exist"):
    _cli.check_output_file(str(tmp_path / "missing" / "out.png"), "--out")
  with pytest.raises(errors.UserError, match="is a directory"):
    _cli.check_output_file(str(tmp_path), "--out")
  assert os.listdir(tmp_path) == []


def test_a_library_warning_is_one_line_and_others_are_shown_as_before(capsys):
  library_file = os.path.join(_cli._LIBRARY_DIR, "train", "workdir.py")
  with warnings.catch_warnings(record=True) as shown_before:  # whatever showed warnings before
    warnings.simplefilter("always")
    before = warnings.showwarning
    with _cli.user_errors():
      warnings.warn_explicit("checkpoint step 4 is corrupt: moved to 'x'\n resuming from step 2",
                             UserWarning, filename=library_file, lineno=1)
      warnings.warn_explicit("something else", UserWarning, filename="/elsewhere/m.py", lineno=7)
    assert warnings.showwarning is before  # restored when the command ends
  err = capsys.readouterr().err
  assert err == "warning: checkpoint step 4 is corrupt: moved to 'x'; resuming from step 2\n"
  assert [str(w.message) for w in shown_before] == ["something else"]  # shown as before
