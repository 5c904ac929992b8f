"""The installed wheel (registered in conftest.py): the package built as a wheel from the
tracked files and installed by pip into a fresh virtualenv, used from outside the clone.

The wheel is built with `pip wheel --no-build-isolation` (the setuptools already installed: no
network), which runs the same setuptools build as `python -m build`. The virtualenv has no
packages of its own but the wheel: a `.pth` file lends it the dependencies of the environment
running the tests (jax, flax, nbclient, ...), so nothing is downloaded. A `.pth` file's paths are
appended as plain directories, so the `.pth` files inside them (among them the editable
install of this checkout) are not processed: `import dpkd_jax` in the virtualenv can only find
the wheel's copy. `.ci/check_wheel` is the slower variant that lets pip resolve every dependency.

Built once per pytest run: its pytest-xdist workers share one build through a file lock.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import sysconfig

import filelock
import pytest

_REPO = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class InstalledWheel:
  wheel: pathlib.Path  # dist/dpkd_jax-<version>-py3-none-any.whl
  python: pathlib.Path  # the virtualenv's interpreter
  site_packages: pathlib.Path  # where pip installed the wheel
  tracked: tuple[str, ...]  # the files `git ls-files` names, relative to the clone


def _tracked_files() -> list[str]:
  try:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=_REPO, capture_output=True,
                            check=True, timeout=60).stdout.decode()
  except (OSError, subprocess.SubprocessError):
    pytest.skip("not a git checkout")
  return [name for name in listed.split("\0") if name and (_REPO / name).is_file()]


def _run(args: list, **kwargs) -> None:
  done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                        **kwargs)
  if done.returncode:
    raise RuntimeError(f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}")


def _build(root: pathlib.Path, tracked: list[str]) -> dict:
  source, dist, venv = root / "src", root / "dist", root / "venv"
  for name in tracked:  # a copy of the tracked files: nothing is written into the clone
    (source / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(_REPO / name, source / name)
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
        "--wheel-dir", dist, source])
  (wheel,) = dist.glob("dpkd_jax-*.whl")
  _run([sys.executable, "-m", "venv", "--without-pip", venv])
  python = venv / "bin" / "python"
  purelib = pathlib.Path(subprocess.run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      capture_output=True, text=True, check=True, timeout=60).stdout.strip())
  lent = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                        *site.getsitepackages()])
  (purelib / "_test_dependencies.pth").write_text("\n".join(lent) + "\n")
  _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
        "--no-index", wheel])
  return {"wheel": str(wheel), "python": str(python), "site_packages": str(purelib)}


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
  tracked = _tracked_files()
  shared = tmp_path_factory.getbasetemp()
  if "PYTEST_XDIST_WORKER" in os.environ:
    shared = shared.parent  # this pytest run's directory, above every worker's own
  root = shared / "installed_wheel"
  with filelock.FileLock(str(shared / "installed_wheel.lock")):
    done = root / "done.json"
    if not done.exists():
      shutil.rmtree(root, ignore_errors=True)
      root.mkdir()
      done.write_text(json.dumps(_build(root, tracked)))
    paths = json.loads(done.read_text())
  return InstalledWheel(wheel=pathlib.Path(paths["wheel"]), python=pathlib.Path(paths["python"]),
                        site_packages=pathlib.Path(paths["site_packages"]),
                        tracked=tuple(tracked))


def clean_environment() -> dict:
  """The environment of a process that must not see the clone (no PYTHONPATH)."""
  return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
