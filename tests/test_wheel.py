"""The wheel holds the package, the CLIs, the recipes (configs/) and every data file the library reads at run time
(`dpkd_jax.resources`), so that `pip install dpkd_jax-*.whl` works with no clone.

Built from a copy of the tracked files with `pip wheel --no-build-isolation` (the setuptools
already installed: no network), which runs the same setuptools build as `python -m build`.
Installing it into a fresh virtualenv and importing it from outside the clone is
`.ci/check_wheel` (too slow for the suite: it installs every dependency).
"""

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

_REPO = pathlib.Path(__file__).resolve().parent.parent


def _tracked_files():
  try:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=_REPO, capture_output=True,
                            check=True, timeout=60).stdout.decode()
  except (OSError, subprocess.SubprocessError):
    pytest.skip("not a git checkout")
  return [name for name in listed.split("\0") if name and (_REPO / name).is_file()]


def test_wheel_holds_the_package_and_its_data(tmp_path):
  source, out = tmp_path / "src", tmp_path / "dist"
  tracked = _tracked_files()
  for name in tracked:
    (source / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(_REPO / name, source / name)
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--quiet", "--wheel-dir", str(out), str(source)], check=True, timeout=300,
                 capture_output=True)
  (wheel,) = out.glob("dpkd_jax-*.whl")
  names = set(zipfile.ZipFile(wheel).namelist())
  code = {n for n in tracked if n.split("/")[0] in ("dpkd_jax", "experiments", "configs")}
  assert code - names == set()  # every module and data file of the package
  assert "dpkd_jax/resources/paper_results.json" in names
  assert not [n for n in names if n.split("/")[0] in ("tests", "notebooks", "docs")]
