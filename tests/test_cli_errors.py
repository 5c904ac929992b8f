"""Every CLI turns an expected user error into one line on stderr and exit status 2, with
nothing written: missing, empty, mismatching or corrupt teachers, workdirs
that are files or read-only, batches larger than the data, `dpdfd sample` on a wrong workdir,
`plot --out` into a missing folder, data not found. A bug keeps its traceback."""

import asyncio
import errno
import gc
import glob
import json
import logging
import os
from pathlib import Path
import resource
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from dpkd_jax import teacher
from dpkd_jax.data import sources
from dpkd_jax.methods import dpsgd
from experiments import _cli
from experiments import dfpate as dfpate_cli
from experiments import dpdfd as dpdfd_cli
from experiments import dpsgd as dpsgd_cli
from experiments import plot as plot_cli
from experiments import rknn as rknn_cli
from experiments import rona as rona_cli
from experiments import srr as srr_cli
from experiments import teacher as teacher_cli


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
  """{name: dir}: a good digits teacher and broken copies of it, outside every sandbox."""
  root = tmp_path_factory.mktemp("teachers")
  good = str(root / "good")
  teacher.train_teacher(teacher.TeacherConfig(dataset="digits", model="lenet5", epochs=1,
                                              batch_size=256), good, progress=False)
  dirs = {"good": good}
  for name in ("bad_card", "bad_ckpt", "trunc_ckpt", "no_ckpt"):
    dirs[name] = str(root / name)
    shutil.copytree(good, dirs[name])
  with open(os.path.join(dirs["bad_card"], "card.json"), "w") as f:
    f.write("{not json")
  for path in glob.glob(os.path.join(dirs["bad_ckpt"], "checkpoints", "*", "arrays", "d", "*")):
    with open(path, "r+b") as f:
      f.write(b"\xff" * 8)  # overwritten bytes: TensorStore fails reading them
  for path in glob.glob(os.path.join(dirs["trunc_ckpt"], "checkpoints", "*", "arrays", "d", "*")):
    open(path, "w").close()  # truncated files: Orbax's restore also leaves asyncio noise
  shutil.rmtree(os.path.join(dirs["no_ckpt"], "checkpoints"))
  os.makedirs(root / "empty")
  dirs["empty"] = str(root / "empty")
  return dirs


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
  """The working directory (default workdirs land here), with a file and an empty data dir."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "afile").write_text("x")
  (tmp_path / "nodata").mkdir()
  (tmp_path / "listed").mkdir()  # an mnist.npz that is there (never read: an earlier error)
  (tmp_path / "listed" / "mnist.npz").write_bytes(b"")
  monkeypatch.delenv(sources.DATA_DIR_ENV_VAR, raising=False)

  def nothing_prepared(name, split, *, download):  # tfds has no data here, as on CI
    raise RuntimeError(f"simulated: {name} not prepared")

  monkeypatch.setattr(sources.tfds_source, "_read", nothing_prepared)
  return tmp_path


def _tree(root) -> set[str]:
  return {os.path.relpath(os.path.join(d, n), root)
          for d, dirs, files in os.walk(root) for n in dirs + files}


def _user_error(main, argv, capsys, sandbox) -> str:
  """Runs `main(argv)`; asserts exit 2, one `error:` line on stderr, nothing written."""
  before = _tree(sandbox)
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  err = capsys.readouterr().err
  assert exit_info.value.code == 2, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), err
  assert "Traceback" not in err
  assert _tree(sandbox) == before
  return lines[0]


DPDFD = ["--dataset=digits", "--noise_multiplier=1", "--steps=2", "--batch_size=8",
         "--no_progress"]
SRR = ["--dataset=digits", "--epsilon=1", "--stages=1", "--samples_per_stage=16",
       "--batch_size=8", "--pretrain_batch_size=8", "--pretrain_steps=1", "--no_progress"]
NO_DATA = ["--dataset=mnist", "--data_dir=nodata", "--no_progress"]

# (id, main, argv with {good}, {bad_card}, ... for the teacher dirs, fragments of the line)
CASES = [
    # missing / empty / mismatching / corrupt teachers
    ("dpdfd_missing_teacher", dpdfd_cli.main, DPDFD + ["--teacher_dirs=typo"],
     ["--teacher_dirs", "'typo' does not exist", "experiments.teacher"]),
    ("dpdfd_empty_teacher", dpdfd_cli.main, DPDFD + ["--teacher_dirs={good},{empty}"],
     ["--teacher_dirs", "has no card.json"]),
    ("dpdfd_other_dataset", dpdfd_cli.main,
     ["--dataset=mnist", "--noise_multiplier=1", "--teacher_dirs={good}", "--data_dir=listed"],
     ["--teacher_dirs", "dataset='digits' but 'mnist' is needed"]),
    ("dpdfd_corrupt_card", dpdfd_cli.main, DPDFD + ["--teacher_dirs={bad_card}"],
     ["--teacher_dirs", "card.json is unreadable or not JSON"]),
    ("dpdfd_corrupt_checkpoint", dpdfd_cli.main, DPDFD + ["--teacher_dirs={bad_ckpt}"],
     ["checkpoints is damaged", "retrain the teacher"]),
    ("dpdfd_no_checkpoint", dpdfd_cli.main, DPDFD + ["--teacher_dirs={no_ckpt}"],
     ["no checkpoint", "retrain the teacher"]),
    ("srr_missing_teacher", srr_cli.main, SRR + ["--teacher_dir=typo"],
     ["--teacher_dir", "'typo' does not exist"]),
    ("srr_corrupt_card", srr_cli.main, SRR + ["--teacher_dir={bad_card}"],
     ["--teacher_dir", "not JSON"]),
    ("srr_missing_generator", srr_cli.main,
     SRR + ["--teacher_dir={good}", "--pretrained_generator_dir=typo"],
     ["--pretrained_generator_dir", "'typo' holds no pretrained generator"]),
    ("srr_pretrain_corrupt_checkpoint", srr_cli.main,
     ["pretrain"] + SRR + ["--teacher_dir={bad_ckpt}"], ["checkpoints is damaged"]),
    ("srr_pretrain_other_dataset", srr_cli.main,
     ["pretrain", "--dataset=mnist", "--teacher_dir={good}"],
     ["--teacher_dir", "dataset='digits'"]),
    ("rona_missing_teacher", rona_cli.main,
     ["--dataset=digits", "--noise_multiplier=1", "--teacher_dir=typo"],
     ["--teacher_dir", "'typo' does not exist"]),
    ("rona_aux_teacher_other_dataset", rona_cli.main,
     ["--dataset=mnist", "--noise_multiplier=1", "--aux_teacher_dir={good}"],
     ["--aux_teacher_dir", "dataset='digits'"]),
    # workdirs that are files or cannot be created
    ("teacher_workdir_is_file", teacher_cli.main, ["--workdir=afile", "--no_progress"],
     ["--workdir", "afile' is a file"]),
    ("dpdfd_workdir_under_file", dpdfd_cli.main,
     DPDFD + ["--teacher_dirs={good}", "--workdir=afile/run"], ["--workdir", "is a file"]),
    ("dpdfd_direct_workdir_is_file", dpdfd_cli.main,
     ["--mode=direct", "--dataset=digits", "--noise_multiplier=1", "--workdir=afile"],
     ["--workdir", "is a file"]),
    ("dpsgd_workdir_is_file", dpsgd_cli.main,
     ["--noise_multiplier=1", "--steps=1", "--workdir=afile"], ["--workdir", "is a file"]),
    ("rknn_workdir_is_file", rknn_cli.main, ["--workdir=afile"], ["--workdir", "is a file"]),
    ("rona_workdir_is_file", rona_cli.main,
     ["--dataset=digits", "--noise_multiplier=1", "--workdir=afile"], ["--workdir"]),
    ("dfpate_workdir_is_file", dfpate_cli.main, ["--dataset=digits", "--workdir=afile"],
     ["--workdir", "is a file"]),
    ("dfpate_teachers_dir_is_file", dfpate_cli.main,
     ["--dataset=digits", "--teachers_dir=afile"], ["--teachers_dir", "is a file"]),
    # a batch larger than the data
    ("teacher_batch_too_large", teacher_cli.main, ["--batch_size=5000", "--no_progress"],
     ["batch_size=5000 exceeds the 1442 examples", "--batch_size"]),
    ("rona_teacher_batch_too_large", rona_cli.main,
     ["--dataset=digits", "--noise_multiplier=1", "--num_query_samples=64",
      "--teacher_batch_size=5000", "--no_progress"], ["--teacher_batch_size"]),
    ("rknn_num_public_too_large", rknn_cli.main, ["--num_public=5000"],
     ["num_public=5000 must be in [1, 355)"]),
    ("dpsgd_batch_too_large", dpsgd_cli.main,
     ["--noise_multiplier=1", "--steps=1", "--expected_batch_size=5000", "--no_progress"],
     ["expected_batch_size=5000 exceeds"]),
    ("dpdfd_direct_batch_too_large", dpdfd_cli.main,
     ["--mode=direct", "--dataset=digits", "--noise_multiplier=1",
      "--expected_batch_size=5000"], ["expected_batch_size 5000 exceeds"]),
    # dpdfd sample on a wrong workdir; outputs into missing folders
    ("dpdfd_sample_typo", dpdfd_cli.main, ["sample", "--workdir=typo_run"],
     ["--workdir", "'typo_run' does not exist"]),
    ("dpdfd_sample_teacher_workdir", dpdfd_cli.main, ["sample", "--workdir={good}"],
     ["--workdir", "is a teacher's workdir"]),
    ("dpdfd_sample_num", dpdfd_cli.main, ["sample", "--workdir={good}", "--num=0"],
     ["--num must be >= 1"]),
    ("plot_out_missing_folder", plot_cli.main, ["--runs", "{good}", "--out=missing/c.png"],
     ["--out", "missing' does not exist"]),
    ("plot_run_without_results", plot_cli.main, ["--runs", "{good}", "--out=c.png"],
     ["--runs", "no results.json"]),
    # data not found (offline, no --download)
    ("teacher_no_data", teacher_cli.main, NO_DATA, ["no mnist.npz in 'nodata' (--data_dir)"]),
    ("dpsgd_no_data", dpsgd_cli.main, NO_DATA + ["--noise_multiplier=1", "--steps=1"],
     ["dataset 'mnist'", "--data_dir=DIR"]),
    ("dpdfd_direct_no_data", dpdfd_cli.main,
     ["--mode=direct", "--noise_multiplier=1"] + NO_DATA[:2], ["dataset 'mnist'"]),
    ("rknn_no_data", rknn_cli.main, NO_DATA, ["dataset 'mnist'"]),
    ("rona_no_data", rona_cli.main, NO_DATA + ["--noise_multiplier=1"], ["dataset 'mnist'"]),
    ("dfpate_no_data", dfpate_cli.main, NO_DATA, ["dataset 'mnist'"]),
    # flags and config values
    ("teacher_unknown_flag", teacher_cli.main, ["--epochz=3"],
     ["unrecognized arguments: --epochz=3", "--help"]),
    ("dpdfd_default_teacher_no_data", dpdfd_cli.main, NO_DATA + ["--noise_multiplier=1"],
     ["no mnist.npz in 'nodata' (--data_dir)"]),
    ("dpdfd_default_teacher_bad_model", dpdfd_cli.main, ["--dataset=digits", "--teacher_model=x"],
     ["unknown model 'x'"]),
    ("rknn_unknown_representation", rknn_cli.main, ["--representation=nope"],
     ["--representation", "unknown representation 'nope'"]),
    ("dpdfd_bad_delta", dpdfd_cli.main, DPDFD + ["--teacher_dirs={good}", "--delta=2"],
     ["delta must be in (0, 1)"]),
]


@pytest.mark.parametrize("main,argv,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_error_is_one_line(main, argv, fragments, teachers, sandbox, capsys):
  line = _user_error(main, [a.format(**teachers) for a in argv], capsys, sandbox)
  for fragment in fragments:
    assert fragment in line


def test_read_only_workdir(teachers, sandbox, capsys, monkeypatch):
  """A read-only directory (simulated: tests may run as root, who may write anywhere)."""
  (sandbox / "ro").mkdir()
  real_access = os.access
  monkeypatch.setattr(os, "access", lambda path, mode: (
      False if os.path.abspath(path).startswith(str(sandbox / "ro")) else real_access(path, mode)))
  line = _user_error(dpsgd_cli.main, ["--noise_multiplier=1", "--steps=1", "--workdir=ro"],
                     capsys, sandbox)
  assert "--workdir" in line and "not writable" in line
  line = _user_error(teacher_cli.main, ["--workdir=ro/new"], capsys, sandbox)
  assert "cannot create" in line and "ro/new" in line


def test_bug_keeps_its_traceback(sandbox, monkeypatch):
  def broken(*args, **kwargs):
    raise KeyError("a bug")
  monkeypatch.setattr(dpsgd, "train_dpsgd", broken)
  with pytest.raises(KeyError, match="a bug"):
    dpsgd_cli.main(["--noise_multiplier=1", "--steps=1"])


def _cli_process(args, cwd):
  env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
         "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=300)


def test_process_corrupt_teacher_one_line(teachers, tmp_path):
  """A real process: no traceback, and none of Orbax's late "Event loop is closed" noise."""
  result = _cli_process(["experiments.dpdfd", *DPDFD, f"--teacher_dirs={teachers['trunc_ckpt']}",
                         "--workdir=run"], tmp_path)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "checkpoints is damaged" in lines[0], result.stderr
  assert os.listdir(tmp_path) == []


def test_process_sample_typo_creates_nothing(tmp_path):
  result = _cli_process(["experiments.dpdfd", "sample", "--workdir=typo_run"], tmp_path)
  assert result.returncode == 2 and result.stderr.startswith("error: --workdir: 'typo_run'")
  assert len(result.stderr.strip().splitlines()) == 1
  assert os.listdir(tmp_path) == []


# ------------------------------------------------------------- faults and out-of-range input


def _one_line_exit_2(main, argv, capsys) -> str:
  """Runs `main(argv)`: exit 2, one `error:` line, no traceback (files may be written)."""
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  err = capsys.readouterr().err
  lines = err.strip().splitlines()
  assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
  return lines[0]


@pytest.mark.parametrize("main,argv,fragment", [
    (dpsgd_cli.main, ["--noise_multiplier=1e300", "--steps=1"], "--noise_multiplier: 1e+300"),
    (dpsgd_cli.main, ["--target_epsilon=1e300", "--steps=1"], "--target_epsilon: 1e+300"),
    (dpsgd_cli.main, ["--noise_multiplier=1e-300", "--steps=1"], "out of range"),
    (dpdfd_cli.main, DPDFD + ["--bound_method=clip", "--l2_clip_norm=1e300"],
     "--l2_clip_norm: 1e+300"),
    (dpsgd_cli.main, ["--noise_multiplier=1", "--steps=1000000000000"],
     "--steps: 1000000000000 exceeds 1e+08"),
    (dpdfd_cli.main, DPDFD[:2] + ["--steps=1000000000000"], "--steps: 1000000000000 exceeds"),
], ids=["dpsgd_noise", "dpsgd_target", "dpsgd_tiny_noise", "dpdfd_clip", "dpsgd_steps",
        "dpdfd_steps"])
def test_out_of_range_number_flag_is_one_line(main, argv, fragment, sandbox, capsys):
  line = _user_error(main, argv, capsys, sandbox)
  assert fragment in line and ("out of range" in line or "would not finish" in line)


def test_target_met_by_any_noise_is_one_line_and_writes_nothing(sandbox, capsys):
  line = _user_error(dpsgd_cli.main, ["--target_epsilon=1e30", "--steps=1", "--workdir=run",
                                      "--no_progress"], capsys, sandbox)
  assert "target_epsilon=1e+30" in line and "met by any noise" in line


def _npz_with_empty_test(directory: Path) -> None:
  directory.mkdir()
  np.savez(directory / "mnist.npz", x_train=np.zeros((16, 28, 28, 1), np.uint8),
           y_train=np.arange(16) % 10, x_test=np.zeros((0, 28, 28, 1), np.uint8),
           y_test=np.zeros((0,), np.int64))


@pytest.mark.parametrize("main,argv", [
    (dpsgd_cli.main, ["--noise_multiplier=1", "--steps=1", "--expected_batch_size=4"]),
    (teacher_cli.main, ["--batch_size=8"]),
], ids=["dpsgd", "teacher"])
def test_empty_test_split_is_refused_before_any_charge(main, argv, sandbox, capsys):
  _npz_with_empty_test(sandbox / "emptytest")
  args = ["--dataset=mnist", "--data_dir=emptytest", "--workdir=run", "--no_progress", *argv]
  line = _user_error(main, args, capsys, sandbox)  # nothing written, nothing charged
  assert "x_test" in line and "holds no examples" in line
  # The workdir is not blocked: the same command fails the same way, not "in use".
  assert _one_line_exit_2(main, args, capsys) == line


def test_dpdfd_batch_beyond_memory_is_refused_before_any_charge(teachers, sandbox, capsys):
  line = _user_error(dpdfd_cli.main, DPDFD[:-2] + [f"--teacher_dirs={teachers['good']}",
                                                  "--batch_size=1000000000", "--workdir=run"],
                     capsys, sandbox)
  assert "--batch_size=1000000000: one step needs at least" in line


def test_teacher_ensemble_larger_than_the_data_is_refused(sandbox, capsys):
  from experiments import teacher_ensemble as ensemble_cli  # pylint: disable=import-outside-toplevel
  line = _user_error(ensemble_cli.main, ["--dataset=digits", "--num_teachers=100000",
                                         "--workdir=run"], capsys, sandbox)
  assert "--num_teachers=100000 exceeds the" in line


def test_results_report_of_garbage_is_one_line(sandbox, capsys):
  from experiments import results as results_cli  # pylint: disable=import-outside-toplevel
  (sandbox / "garbage").mkdir()
  (sandbox / "garbage" / "results.json").write_bytes(bytes(range(128, 256)))
  capsys.readouterr()
  assert results_cli.main(["report", "--run=garbage"]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and "results.json is not readable JSON" in lines[0], lines


@pytest.mark.parametrize("code", [errno.EFBIG, errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_refused_write_without_a_file_name_names_the_last_file_written(tmp_path, capsys, code):
  target = tmp_path / "metrics.csv"

  def write_then_fail():
    with _cli.user_errors():
      with open(target, "w", encoding="utf-8"):
        raise OSError(code, os.strerror(code))  # as a write() past a limit: no file name

  with pytest.raises(SystemExit) as exit_info:
    write_then_fail()
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1, err
  assert f"cannot write {str(target)!r}: {os.strerror(code)}" in err


def test_tensorstore_write_failure_and_its_background_logs_are_one_line(capsys, caplog):
  message = ('OUT_OF_RANGE: Error writing "x" in OCDBT database: Failed writing: '
             '"/w/checkpoints/6/d/ab12": Failed to write 18 bytes to file 15: File too large '
             "[os_error_code='27']")
  with pytest.raises(SystemExit) as exit_info:
    with _cli.user_errors():
      try:
        raise ValueError(message)
      except ValueError:
        logging.getLogger("absl").exception("background save thread failed")
      raise RuntimeError("save failed") from ValueError(message)
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == (
      "error: cannot write '/w/checkpoints/6/d/ab12': File too large; check its permissions, "
      "free space and file size limit\n")
  assert not caplog.records  # held back: said in the line


def test_unretrieved_write_tasks_collected_after_the_line_log_nothing(capsys, caplog):
  """Orbax's unawaited write tasks are collected before the line or late (even as the
  interpreter exits): asyncio's "Task exception was never retrieved" of the refused write said in
  the line stays silent either way; an unrelated task's failure is still logged."""
  message = ('Failed writing: "/w/checkpoints/6/d/ab12": Failed to write 18 bytes to file 15: '
             "File too large [os_error_code='27']")

  async def fails(error):
    raise error

  loop = asyncio.new_event_loop()
  tasks = [loop.create_task(fails(ValueError(message))),
           loop.create_task(fails(KeyError("a bug in another task"))),
           loop.create_task(fails(ValueError(message)))]
  loop.run_until_complete(asyncio.wait(tasks))
  loop.close()
  asyncio_logger = logging.getLogger("asyncio")
  filters = list(asyncio_logger.filters)
  try:
    with pytest.raises(SystemExit) as exit_info:
      with _cli.user_errors():
        del tasks[2]  # collected while the command still runs
        gc.collect()
        raise ValueError(message)
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    del tasks[:]  # never retrieved: asyncio logs each as it is collected
    gc.collect()
  finally:
    asyncio_logger.filters[:] = filters
  logged = [r for r in caplog.records if r.name == "asyncio"]
  assert len(logged) == 1 and isinstance(logged[0].exc_info[1], KeyError), logged


def test_other_errors_keep_their_traceback_and_logs(caplog):
  with pytest.raises(ValueError, match="a bug"):
    with _cli.user_errors():
      logging.getLogger("absl").error("unrelated [os_error_code='27'] noise")
      raise ValueError("a bug")
  assert caplog.records  # a failure that is not said in one line keeps its log


def test_file_size_limit_in_a_process_is_one_line_naming_the_file(tmp_path):
  """ulimit -f 40: the first checkpoint exceeds it (SIGXFSZ ignored, so writes fail EFBIG)."""
  def limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, 40 * 1024))
  env = {**{k: v for k, v in os.environ.items() if not k.startswith("JAX_")},
         "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run(
      [sys.executable, "-m", "experiments.dpsgd", "--steps=12", "--noise_multiplier=1",
       "--model=lenet5_half", "--expected_batch_size=256", "--workdir=run", "--no_progress"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, preexec_fn=limit)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
  assert lines[0].startswith(f"error: cannot write '{tmp_path}") and "File too large" in lines[0]


def test_tampered_checkpoint_ledger_without_its_file_is_a_one_line_refusal(sandbox, capsys):
  flags = ["--noise_multiplier=1", "--steps=2", "--model=lenet5_half", "--workdir=run",
           "--no_progress"]
  dpsgd_cli.main(flags)
  os.remove(sandbox / "run" / "privacy_ledger.json")
  for path in (sandbox / "run" / "checkpoints").glob("*/meta/metadata"):
    meta = json.loads(path.read_text())
    meta["ledger"] = meta["ledger"].replace('"entries"', '"entrees"')
    path.write_text(json.dumps(meta))
  line = _one_line_exit_2(dpsgd_cli.main, [*flags, "--resume"], capsys)
  assert "ledger" in line or "damaged" in line
  assert not (sandbox / "run" / "privacy_ledger.json").exists()


def test_results_publish_into_a_read_only_directory_is_one_line(sandbox, capsys, monkeypatch):
  """Read-only simulated (tests may run as root): the record's write fails with EROFS."""
  from experiments import results as results_cli  # pylint: disable=import-outside-toplevel
  from dpkd_jax.train import records as records_lib  # pylint: disable=import-outside-toplevel

  def read_only(path, record):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
  monkeypatch.setattr(records_lib, "write_record", read_only)
  monkeypatch.setattr(records_lib, "read_record", lambda path, **_: {})
  monkeypatch.setattr(records_lib, "combine_seeds", lambda seeds, name: {"test_accuracy": 0.5,
                                                                          "columns": {}})
  capsys.readouterr()
  assert results_cli.main(["--results_dir=ro", "combine", "--records=a_s0,a_s1",
                           "--name=dpsgd__digits__a"]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and "cannot write" in lines[0] and "Read-only file system" in lines[0]


def test_release_over_budget_is_one_line(capsys):
  from dpkd_jax.privacy import ledger as ledger_lib  # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit) as exit_info:
    with _cli.user_errors():
      raise ledger_lib.BudgetExceededError("release refused: spent ε=10.09, ε after this "
                                           "release would be 11.16 > target ε=10.09; "
                                           "requested event: TaggedDpEvent(...)")
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1
  assert "release refused: spent ε=10.09" in err and "start a new --workdir" in err
