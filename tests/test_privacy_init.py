"""Tests of dpkd_jax/privacy/__init__.py: the public API and the package's isolation."""

import ast
import inspect
import pathlib

from dpkd_jax import privacy

_PRIVACY = pathlib.Path(privacy.__file__).resolve().parent


def test_all_lists_exactly_the_re_exported_names():
  public = {name for name in dir(privacy)
            if not name.startswith("_") and not inspect.ismodule(getattr(privacy, name))}
  assert sorted(privacy.__all__) == sorted(public)
  assert len(privacy.__all__) == len(set(privacy.__all__))
  for name in ("dpsgd_clip_and_sum", "dpsgd_add_noise", "dpsgd_gaussian_mechanism",
               "second_moment_release", "noisy_cluster_sums", "noisy_cluster_variances"):
    assert name in privacy.__all__


def test_submodules_are_not_shadowed_by_re_exported_names():
  # `from dpkd_jax.privacy import dpsgd_mechanism` must give the module, not a function.
  for path in _PRIVACY.glob("[!_]*.py"):
    value = getattr(privacy, path.stem, None)
    assert value is None or inspect.ismodule(value), path.stem


def test_the_package_imports_nothing_else_of_dpkd_jax():
  for path in sorted(_PRIVACY.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
      if isinstance(node, ast.ImportFrom) and node.module:
        modules = [node.module]
      elif isinstance(node, ast.Import):
        modules = [a.name for a in node.names]
      else:
        continue
      for module in modules:
        if module == "dpkd_jax" or module.startswith("dpkd_jax."):
          assert module.startswith("dpkd_jax.privacy"), f"{path.name} imports {module}"
