"""A fork server for the fault-injection runs: imports the CLIs once, then forks one process per
run, so that each run skips Python's and JAX's start-up (several CPU-seconds each) and is still a
process of its own that `kill -9`, `SIGSTOP` and `ulimit` act on.

    python benchmarks/fault_forkserver.py dpsgd dpdfd ...   (started by fault_harness.start)

The server imports `experiments.<module>` for each argument (no JAX backend is started by an
import: checked, else it exits 3 and the harness spawns plain `python -m` processes). Then, for
each request line on stdin, a JSON object {"module", "argv", "cwd", "out", "err", "status"}, it
forks: the child runs `python -m experiments.<module> <argv>` as `runpy` does for `-m` (stdout and
stderr into the files `out` and `err`, stdin from /dev/null) and exits with the CLI's exit code;
the server answers {"pid": ...} and, when the child ends, writes its exit code (negative: the
signal that ended it, as subprocess reports it) to the file `status`.
"""

import atexit
import importlib
import json
import os
import runpy
import signal
import sys
import traceback

_status_paths: dict[int, str] = {}
_ended: dict[int, int] = {}  # children that ended before their status path was known


def _write_status(path: str, code: int) -> None:
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(str(code))
  os.replace(path + ".tmp", path)  # the harness never reads half a number


def _reap(signum=None, frame=None) -> None:
  del signum, frame
  while True:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    code = os.waitstatus_to_exitcode(status)
    if pid in _status_paths:
      _write_status(_status_paths.pop(pid), code)
    else:
      _ended[pid] = code


def _child(request: dict) -> None:
  """Runs in the forked process; never returns."""
  code = 1
  try:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    os.chdir(request["cwd"])
    module = f"experiments.{request['module']}"
    sys.argv = [module, *request["argv"]]
    try:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as stop:  # what the interpreter does with it
      if stop.code is None or isinstance(stop.code, int):
        code = stop.code or 0
      else:
        print(stop.code, file=sys.stderr)
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


def main() -> None:
  for name in sys.argv[1:]:
    importlib.import_module(f"experiments.{name}")
    # What they import stays; the CLI module itself runs anew as __main__, as under `-m`.
    del sys.modules[f"experiments.{name}"]
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge._backends:  # pylint: disable=protected-access
    sys.exit(3)  # forking a started backend could deadlock: the harness spawns instead
  signal.signal(signal.SIGCHLD, _reap)
  print(json.dumps({"ready": True}), flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _child(request)
    _status_paths[pid] = request["status"]
    if pid in _ended:
      _write_status(_status_paths.pop(pid), _ended.pop(pid))
    print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
  main()
