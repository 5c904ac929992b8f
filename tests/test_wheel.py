"""The wheel holds the package, the CLIs, the recipes (configs/) and every data file the library
reads at run time (`dpkd_jax.resources`), and once pip has installed it into a virtualenv it
runs from a directory outside the clone (`wheel_fixtures.installed_wheel`; the notebooks run
from it too, tests/test_notebooks.py). `.ci/check_wheel` also lets pip resolve every
dependency into a fresh virtualenv (minutes: not in the suite).
"""

import subprocess
import zipfile

from wheel_fixtures import clean_environment


def test_wheel_holds_the_package_and_its_data(installed_wheel):
  names = set(zipfile.ZipFile(installed_wheel.wheel).namelist())
  code = {n for n in installed_wheel.tracked
          if n.split("/")[0] in ("dpkd_jax", "experiments", "configs")}
  assert code - names == set()  # every module and data file of the package
  assert "dpkd_jax/resources/paper_results.json" in names
  assert not [n for n in names if n.split("/")[0] in ("tests", "notebooks", "docs")]


def test_the_installed_wheel_runs_outside_the_clone(installed_wheel, tmp_path):
  script = """
import dpkd_jax, experiments
from dpkd_jax import data, resources
print(dpkd_jax.__file__)
print(experiments.__file__)
print(len(resources.paper_results()["tables"]))
print(data.load("digits", "test").images.shape[0])
"""
  done = subprocess.run([str(installed_wheel.python), "-c", script], cwd=tmp_path,
                        env=clean_environment(), capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  package, commands, tables, digits = done.stdout.split()
  for path in (package, commands):  # the wheel's copy, never the clone's
    assert path.startswith(str(installed_wheel.site_packages)), path
  assert int(tables) > 0 and int(digits) > 0
