"""Every notebook runs top to bottom on CPU with its small config (what CI executes).

Each notebook is executed with nbclient in a fresh kernel of the virtualenv the wheel was
installed into (`wheel_fixtures.installed_wheel`: the package as a user installs it, not the
clone), in a temporary working directory outside the clone (the data they read ships inside
the package, `dpkd_jax.resources`), so the runs neither read nor write the repository's `runs/`. A cell that raises
fails the test. The committed notebooks must equal what `build_notebooks.py` writes, with
their outputs cleared.
"""

import json
import pathlib
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

_REPO = pathlib.Path(__file__).resolve().parent.parent
_NOTEBOOKS = _REPO / "notebooks"
_NAMES = sorted(p.name for p in _NOTEBOOKS.glob("*.ipynb"))
_CELL_TIMEOUT_S = 300


def _kernel_manager(tmp_path: pathlib.Path, python: pathlib.Path) -> KernelManager:
  """A python3 kernel of the wheel's virtualenv, with SMALL forced and the clone out of sight."""
  spec_dir = tmp_path / "kernels" / "dpkd_test"
  spec_dir.mkdir(parents=True)
  env = {"PYTHONPATH": "",  # the clone is not importable: only the installed wheel is
         "JAX_PLATFORMS": "cpu",  # CI config on every machine, GPU or not
         "DPKD_NOTEBOOK_SMALL": "1"}
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "dpkd test", "language": "python", "env": env}))
  specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
  return KernelManager(kernel_name="dpkd_test", kernel_spec_manager=specs)


def test_notebooks_exist():
  assert _NAMES == ["dpdfd_quickstart.ipynb", "mechanisms_tour.ipynb", "paper_tables.ipynb"]


def test_notebooks_match_their_generator_and_have_no_outputs():
  sys.path.insert(0, str(_NOTEBOOKS))
  try:
    import build_notebooks  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(_NOTEBOOKS))
  for name in _NAMES:
    text = (_NOTEBOOKS / name).read_text(encoding="utf-8")
    assert text == nbformat.writes(build_notebooks.build(name)) + "\n", (
        f"{name} is stale: run python notebooks/build_notebooks.py")
    notebook = nbformat.reads(text, as_version=4)
    for cell in notebook.cells:
      if cell.cell_type == "code":
        assert not cell.outputs and cell.execution_count is None, f"{name} has outputs"


@pytest.mark.parametrize("name", _NAMES)
def test_notebook_executes(tmp_path, name, installed_wheel):
  workdir = tmp_path / "work"
  workdir.mkdir()
  notebook = nbformat.read(_NOTEBOOKS / name, as_version=4)
  client = NotebookClient(notebook, km=_kernel_manager(tmp_path, installed_wheel.python), timeout=_CELL_TIMEOUT_S,
                          resources={"metadata": {"path": str(workdir)}})
  client.execute()  # raises CellExecutionError on the first failing cell
  outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "SMALL = True" in text  # the small config really ran
  found = [line for line in text.splitlines() if line.startswith("dpkd_jax found:")]
  assert found and str(installed_wheel.site_packages) in found[0], found  # the wheel's copy
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert images, f"{name} displayed no figure"
  if name == "paper_tables.ipynb":
    assert "MISMATCH" not in text and text.count(" ok") >= 10
