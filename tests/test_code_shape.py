"""The shape rules of docs/ARCHITECTURE.md: no file under dpkd_jax/ over 400 lines, no function
over 80 lines (docstring included), one package per method that imports no other method."""

import ast
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent / "dpkd_jax"
_MAX_FILE_LINES = 400
_MAX_FUNCTION_LINES = 80


def _sources():
  return sorted(_ROOT.rglob("*.py"))


def _too_long() -> list[str]:
  found = []
  for path in _sources():
    name = path.relative_to(_ROOT).as_posix()
    text = path.read_text(encoding="utf-8")
    if len(text.splitlines()) > _MAX_FILE_LINES:
      found.append(name)
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.end_lineno - node.lineno + 1 > _MAX_FUNCTION_LINES:
          found.append(f"{name}:{node.name}")
  return found


def test_no_long_file_or_function():
  assert _too_long() == []


def _method_packages() -> list[pathlib.Path]:
  return sorted(p for p in (_ROOT / "methods").iterdir() if (p / "__init__.py").exists())


def test_every_method_is_a_package():
  flat = sorted(p.name for p in (_ROOT / "methods").glob("*.py") if p.name != "__init__.py")
  assert flat == []
  assert [p.name for p in _method_packages()] == ["dfpate", "dpdfd", "dpsgd", "rknn", "rona", "srr"]


@pytest.mark.parametrize("package", [p.name for p in _method_packages()])
def test_a_method_imports_no_other_method(package):
  others = {p.name for p in _method_packages()} - {package}
  for path in (_ROOT / "methods" / package).rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [f"{node.module}.{a.name}" for a in node.names]
               if isinstance(node, ast.ImportFrom) and node.module else [])
      for name in names:
        parts = name.split(".")
        if parts[:2] == ["dpkd_jax", "methods"] and len(parts) > 2:
          assert parts[2] not in others, f"{path.name} imports method {parts[2]}"


def test_privacy_validation_stays_inside_privacy():
  # Outside privacy/ parameter checks go through config_checks (which shares its wording).
  users = sorted(p.relative_to(_ROOT).as_posix() for p in _sources()
                 if "privacy import validation" in p.read_text(encoding="utf-8")
                 and p.parent.name != "privacy")
  assert users == ["config_checks.py"]
