"""Tests of the package's import graph: no circle, privacy/ self-contained, no experiments.

The graph is read statically with `ast` (no module is imported), over every `.py` file under
dpkd_jax/. An edge A -> B means module A imports module B, wherever the import statement is
(top level, a function body, or `if TYPE_CHECKING:`: a circle hidden behind TYPE_CHECKING is
still a circle of the design). How a statement maps to edges:

  * `import dpkd_jax.x.y` -> module `dpkd_jax.x.y`.
  * `from dpkd_jax.x import y` -> module `dpkd_jax.x.y` when that is a module (a submodule
    import, e.g. `from dpkd_jax.data import splits`), else `dpkd_jax.x` (a name re-exported by
    the package `dpkd_jax/x/__init__.py`, or defined in the module `dpkd_jax/x.py`).
  * Relative imports are resolved against the importing module's package.

A package's `__init__` is its own node (`dpkd_jax.data`); Python's implicit import of parent
packages is not an edge, so `__init__` files that re-export their submodules make no false
circle with those submodules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dpkd_jax"


def _module_files(root: Path, package: str) -> dict[str, Path]:
  """Dotted module name -> file, for every `.py` under root/package (`pkg/__init__` -> `pkg`)."""
  modules = {}
  for path in sorted((root / package).rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    modules[".".join(parts)] = path
  return modules


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, str]]:
  """(absolute module, imported name or '') for each import of the tree."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(alias.name, "") for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        # The package a relative import starts from: the module's own package (its name if
        # it is a package's __init__), then one level up per extra dot.
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
      found += [(base, alias.name) for alias in node.names]
  return found


def _resolve(target: str, name: str, modules: dict[str, Path]) -> str | None:
  """The module node an import lands on, or None if it is not a module of the package."""
  if name and f"{target}.{name}" in modules:
    return f"{target}.{name}"
  # `import a.b.c` where c is not a module of ours (or a name in a.b): the longest prefix.
  parts = target.split(".")
  while parts:
    if ".".join(parts) in modules:
      return ".".join(parts)
    parts.pop()
  return None


def import_graph(root: Path, package: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
  """Builds the graph of imports between modules of `package` under `root`.

  Returns:
    (edges, external): module -> the package modules it imports, and module -> the top-level
    names of everything else it imports (e.g. "numpy", "experiments").
  """
  modules = _module_files(root, package)
  edges = {module: set() for module in modules}
  external = {module: set() for module in modules}
  for module, path in modules.items():
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for target, name in _imported_names(tree, module, path.name == "__init__.py"):
      if target.split(".")[0] != package:
        external[module].add(target.split(".")[0])
        continue
      resolved = _resolve(target, name, modules)
      if resolved is not None and resolved != module:
        edges[module].add(resolved)
  return edges, external


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
  """One circle [m0, m1, ..., m0] of the graph, or None (iterative depth-first search)."""
  state = dict.fromkeys(edges, 0)  # 0 unvisited, 1 on the current path, 2 done.
  for start in sorted(edges):
    if state[start]:
      continue
    path, stack = [start], [iter(sorted(edges[start]))]
    state[start] = 1
    while stack:
      nxt = next(stack[-1], None)
      if nxt is None:
        state[path.pop()] = 2
        stack.pop()
      elif state.get(nxt, 2) == 1:
        return path[path.index(nxt):] + [nxt]
      elif state.get(nxt) == 0:
        state[nxt] = 1
        path.append(nxt)
        stack.append(iter(sorted(edges[nxt])))
  return None


def _files(modules: list[str], root: Path, package: str) -> str:
  files = _module_files(root, package)
  return " -> ".join(str(files[m].relative_to(root)) for m in modules)


@pytest.fixture(scope="module")
def graph():
  return import_graph(ROOT, PACKAGE)


def test_no_import_cycle(graph):
  edges, _ = graph
  cycle = find_cycle(edges)
  assert cycle is None, f"import circle: {_files(cycle, ROOT, PACKAGE)}"


def test_privacy_imports_nothing_else_of_the_package(graph):
  edges, _ = graph
  bad = {f"{m} -> {t}" for m, targets in edges.items()
         if m == f"{PACKAGE}.privacy" or m.startswith(f"{PACKAGE}.privacy.")
         for t in targets if t != f"{PACKAGE}.privacy" and not t.startswith(f"{PACKAGE}.privacy.")}
  assert not bad, f"dpkd_jax.privacy must import nothing else of dpkd_jax: {sorted(bad)}"


def test_the_kernels_are_reached_through_their_seam_only(graph):
  # The model zoo calls `dpkd_jax.kernels` (the seam); its implementations (the reference ops,
  # the CPU kernels) are imported only inside the package, and the package imports nothing
  # else of the library: performance code stays apart from the mechanisms.
  edges, _ = graph
  inside = lambda m: m == f"{PACKAGE}.kernels" or m.startswith(f"{PACKAGE}.kernels.")  # noqa
  reach_in = {f"{m} -> {t}" for m, targets in edges.items() if not inside(m)
              for t in targets if inside(t) and t != f"{PACKAGE}.kernels"}
  assert not reach_in, f"only dpkd_jax.kernels itself may be imported: {sorted(reach_in)}"
  reach_out = {f"{m} -> {t}" for m, targets in edges.items() if inside(m)
               for t in targets if not inside(t)}
  assert not reach_out, f"dpkd_jax.kernels must import nothing else of dpkd_jax: {sorted(reach_out)}"
  assert f"{PACKAGE}.kernels" in edges[f"{PACKAGE}.models.classifiers"]


def test_library_does_not_import_experiments(graph):
  _, external = graph
  bad = sorted(m for m, names in external.items() if "experiments" in names)
  assert not bad, f"library modules import the experiments scripts: {bad}"


def test_graph_sees_the_known_edges(graph):
  """The reader is not vacuous: submodule, name and package re-export edges all appear."""
  edges, _ = graph
  assert "dpkd_jax.data.splits" in edges["dpkd_jax.data.sources"]  # from pkg import submodule
  assert "dpkd_jax.data.arrays" in edges["dpkd_jax.data.splits"]  # from pkg.mod import name
  assert "dpkd_jax.data" in edges["dpkd_jax.methods.dpsgd.config"]  # package re-export
  assert "dpkd_jax.data.sources" in edges["dpkd_jax.data"]  # __init__ -> submodule


def _write(root: Path, files: dict[str, str]) -> None:
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_finds_a_circle_behind_type_checking_and_relative_imports(tmp_path):
  _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/sub/__init__.py": "from pkg.sub.a import A\n",
      "pkg/sub/a.py": "from . import b\nA = 1\n",
      "pkg/sub/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "  from pkg.sub.a import A\n"),
  })
  edges, _ = import_graph(tmp_path, "pkg")
  assert find_cycle(edges) == ["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]


def test_init_reexport_of_submodules_is_no_circle(tmp_path):
  # The shape of dpkd_jax/data: __init__ re-exports both submodules, one imports the other
  # as `from pkg.sub import other` (a submodule, so no edge back to the __init__), and a
  # third module uses the package's re-exported name.
  _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/sub/__init__.py": "from pkg.sub.a import A\nfrom pkg.sub.b import B\n",
      "pkg/sub/a.py": "from pkg.sub import b\nimport numpy as np\nA = b.B\n",
      "pkg/sub/b.py": "B = 1\n",
      "pkg/user.py": "from pkg.sub import A\nimport experiments.x\n",
  })
  edges, external = import_graph(tmp_path, "pkg")
  assert find_cycle(edges) is None
  assert edges["pkg.sub.a"] == {"pkg.sub.b"}
  assert edges["pkg.user"] == {"pkg.sub"}
  assert external["pkg.user"] == {"experiments"} and external["pkg.sub.a"] == {"numpy"}
