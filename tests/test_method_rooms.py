"""One vocabulary across the method packages (docs/ARCHITECTURE.md, "The rooms of a method").

Every package under dpkd_jax/methods/ has the same rooms with the same signatures:
`make_plan(config, ...)` in privacy.py, `init_state(config, key, ...)`,
`build_train_step(plan, ...)` and `make_train_step(plan, ...)` (the step as the run calls it,
taking every argument `build_train_step` takes) in step.py, and
`train_<method>(config, workdir, *, resume=False, progress=True, ...)` in run.py, all exported
by the package. Resume is decided in one place: each `train_<method>` hands its `resume` to
`train.workdir.open_run`. A learning rate is `learning_rate` or `<model>_learning_rate` in
every class of the library, never `lr` (docs/ARCHITECTURE.md#vocabulary).
"""

import ast
import importlib
import inspect
import pathlib
import re

import pytest

from dpkd_jax.train import workdir as workdir_lib

_METHODS = pathlib.Path(__file__).resolve().parent.parent / "dpkd_jax" / "methods"
PACKAGES = sorted(p.name for p in _METHODS.iterdir() if (p / "__init__.py").exists())
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
# room -> (the module that defines it, its leading positional parameters)
ROOMS = {
    "make_plan": ("privacy", ("config",)),
    "init_state": ("step", ("config", "key")),
    "build_train_step": ("step", ("plan",)),
    "make_train_step": ("step", ("plan",)),
}


def _room(package: str, name: str):
  module = importlib.import_module(f"dpkd_jax.methods.{package}")
  assert name in module.__all__, f"{package} does not export {name}"
  return getattr(module, name)


def _leading(function, count: int) -> tuple[str, ...]:
  parameters = list(inspect.signature(function).parameters.values())[:count]
  assert all(p.kind in POSITIONAL for p in parameters), f"{function.__qualname__}: {parameters}"
  return tuple(p.name for p in parameters)


def test_every_method_package_is_checked():
  assert PACKAGES == ["dfpate", "dpdfd", "dpsgd", "rknn", "rona", "srr"]


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("room", sorted(ROOMS))
def test_the_room_is_in_its_module_with_its_leading_parameters(package, room):
  module, leading = ROOMS[room]
  function = _room(package, room)
  assert function.__module__ == f"dpkd_jax.methods.{package}.{module}"
  assert _leading(function, len(leading)) == leading


@pytest.mark.parametrize("package", PACKAGES)
def test_make_train_step_takes_what_build_train_step_takes(package):
  # make_train_step may add the device mesh its compiled step is laid out on, nothing else.
  built = inspect.signature(_room(package, "build_train_step")).parameters
  made = inspect.signature(_room(package, "make_train_step")).parameters
  assert [(n, p.kind) for n, p in built.items()] == [
      (n, p.kind) for n, p in made.items() if n in built]
  assert set(made) - set(built) <= {"mesh"}


@pytest.mark.parametrize("package", PACKAGES)
def test_train_method_takes_config_workdir_and_keyword_resume(package):
  train = _room(package, f"train_{package}")
  assert train.__module__ == f"dpkd_jax.methods.{package}.run"
  assert _leading(train, 2) == ("config", "workdir")
  parameters = inspect.signature(train).parameters
  for name, default in (("resume", False), ("progress", True)):
    assert parameters[name].kind == inspect.Parameter.KEYWORD_ONLY
    assert parameters[name].default is default


def _open_run_calls(package: str) -> list[ast.Call]:
  tree = ast.parse((_METHODS / package / "run.py").read_text(encoding="utf-8"))
  train = next(node for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.name == f"train_{package}")
  return [node for node in ast.walk(train) if isinstance(node, ast.Call)
          and isinstance(node.func, ast.Attribute) and node.func.attr == "open_run"]


@pytest.mark.parametrize("package", PACKAGES)
def test_resume_is_decided_by_open_run_alone(package):
  # train_<method> passes its `resume` on unchanged; `open_run` starts, continues or refuses.
  (call,) = _open_run_calls(package)
  resume = [k.value for k in call.keywords if k.arg == "resume"]
  assert len(resume) == 1 and isinstance(resume[0], ast.Name) and resume[0].id == "resume"
  assert "resume" in inspect.signature(workdir_lib.open_run).parameters


@pytest.mark.parametrize("package", PACKAGES)
def test_every_method_resumes(package):
  # No `resumable=False` (tests/test_workdir.py covers that refusal): a run of every method
  # continues from its newest intact checkpoint.
  (call,) = _open_run_calls(package)
  assert not [k for k in call.keywords if k.arg == "resumable"]


def test_no_class_field_names_a_learning_rate_lr():
  # Configs, plans and states alike: `teacher_lr` / `student_lr` were renamed (their old names
  # live on only as `RENAMED` aliases and in the migrations of saved forms).
  short = re.compile(r"(^|_)lr$")
  found = []
  for path in sorted(_METHODS.parent.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.ClassDef):
        found += [f"{path.name}:{node.name}.{item.target.id}" for item in node.body
                  if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                  and short.search(item.target.id)]
  assert found == []
