"""Recipes as files: `--config=configs/<method>/<name>.py` for every method CLI.

    recipe = _recipes.chosen(argv, dpsgd.DPSGDConfig)     # the --config file, or `default`
    _recipes.add_flag(p, recipe, "dpsgd")
    _flags.add_config_flags(p, dpsgd.DPSGDConfig, defaults=recipe.values, notes=recipe.notes)

A recipe is a module under `configs/` (in the manner of big_vision's configs) whose
`get_config()` returns a complete, validated config of its method; its docstring links the
record it reproduces. The flags start at the recipe's values, so `--help` shows the values the
run will use; a flag given on the command line replaces the recipe's value, and the run saves
the config so resolved (every field). There is no other merge, with one exception written
here: a flag of an either-or pair (`PARTNERS`: σ or a target ε, steps or epochs) also resets
its partner to the config's own default, so that a recipe at a target ε given
`--noise_multiplier` runs at that σ (give both flags to keep both).

`--config` takes the file's path (`configs/dpdfd/digits_quickstart.py`), relative to the
working directory; a path under `configs/` that is not there is read from the installed
`configs` package (a wheel, another working directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable

from dpkd_jax import errors

# Either-or fields: a flag given for one resets the other's recipe value to its default.
PARTNERS: dict[str, tuple[str, ...]] = {
    "noise_multiplier": ("target_epsilon",), "epsilon": ("target_epsilon",),
    "target_epsilon": ("noise_multiplier", "epsilon"), "steps": ("epochs",),
    "epochs": ("steps",)}
_PACKAGE = "configs"


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The recipe a run starts from.

  Attributes:
    path: the file as `--config` names it (None: no recipe, the config's own defaults).
    module: the recipe's module (None without a recipe).
    config: its `get_config()` (None without a recipe).
    values: {field: value} the flags start at (the recipe's top-level fields, a nested config
      among them, partners of the flags given reset).
  """
  path: str | None
  module: ModuleType | None
  config: Any
  values: dict[str, Any]

  @property
  def notes(self) -> dict[str, str]:
    """What `--help` says after a default the recipe sets (`_flags.add_config_flags`)."""
    if self.config is None:
      return {}
    notes, defaults = {}, _class_defaults(type(self.config))
    for name, value in self.values.items():
      if dataclasses.is_dataclass(value):  # nested options: a note per flag (field) of it
        own = _class_defaults(type(value))
        notes.update({field: "the recipe's" for field, v in dataclasses.asdict(value).items()
                      if own.get(field) != v and field not in self.values})
      elif name not in defaults or defaults[name] != value:
        notes[name] = "the recipe's"
    return notes


def _class_defaults(cls: type) -> dict[str, Any]:
  out = {}
  for field in dataclasses.fields(cls):
    if field.default is not dataclasses.MISSING:
      out[field.name] = field.default
    elif field.default_factory is not dataclasses.MISSING:
      out[field.name] = field.default_factory()
  return out


def peek(argv: list[str], flag: str) -> str | None:
  """The value of `--<flag>=V` or `--<flag> V` in `argv` (the last one), without parsing."""
  value = None
  for i, token in enumerate(argv):
    if token.startswith(f"--{flag}="):
      value = token.split("=", 1)[1]
    elif token == f"--{flag}" and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def given(argv: list[str], cls: type | None = None) -> set[str]:
  """The names of the flags `argv` gives (`--no<flag>` counts as `<flag>`); with a dataclass
  `cls`, an abbreviation argparse accepts (a unique prefix of a field) counts as the field."""
  names = {token[2:].split("=", 1)[0] for token in argv if token.startswith("--")}
  names |= {name[2:].lstrip("-") for name in names if name.startswith("no")}
  if cls is not None:
    fields = [f.name for f in dataclasses.fields(cls)]
    for name in list(names):
      matches = [field for field in fields if field.startswith(name)]
      if name not in fields and len(matches) == 1:
        names.add(matches[0])
  return names


def _module(path: str) -> ModuleType:
  """The recipe module of the file `path` (see the module docstring)."""
  if not path.endswith(".py"):
    raise errors.UserError(f"--config: {path!r} is not a recipe file (configs/<method>/"
                           "<name>.py)")
  parts = os.path.normpath(path).split(os.sep)
  if _PACKAGE in parts:  # a file of the package: its module, one per recipe
    dotted = ".".join(parts[len(parts) - 1 - parts[::-1].index(_PACKAGE):])[:-3]
    try:
      module = importlib.import_module(dotted)
    except ModuleNotFoundError as error:
      if error.name is None or not dotted.startswith(error.name):
        raise  # the recipe imports something missing: a bug, with its traceback
      module = None
    if module is not None and (not os.path.isfile(path)
                               or os.path.samefile(module.__file__, path)):
      return module
  if not os.path.isfile(path):
    raise errors.UserError(f"--config: no recipe file {path!r}; the recipes are the files "
                           "configs/<method>/<name>.py")
  name = "_recipe_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def load(path: str, cls: type) -> tuple[ModuleType, Any]:
  """(module, config) of the recipe file `path`, a config of `cls` (else a one-line error)."""
  module = _module(path)
  if not hasattr(module, "get_config"):
    raise errors.UserError(f"--config: {path!r} has no get_config()")
  try:
    config = module.get_config()
  except ValueError as error:
    raise errors.UserError(f"--config={path}: {error}") from error
  if not isinstance(config, cls):
    raise errors.UserError(f"--config: {path!r} is a {type(config).__name__} recipe, not a "
                           f"{cls.__name__} one")
  return module, config


def chosen(argv: list[str], cls: type,
           default: Callable[[list[str]], str | None] | str | None = None) -> Recipe:
  """The recipe of `argv`: its `--config`, else `default` (a path, or a function of argv
  giving one; None: the config's own defaults)."""
  path = peek(argv, "config")
  if path is None:
    path = default(argv) if callable(default) else default
  if path is None:
    return Recipe(None, None, None, {})
  module, config = load(path, cls)
  values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
  defaults, flags = _class_defaults(cls), given(argv, cls)
  for flag in flags:
    for partner in PARTNERS.get(flag, ()):
      if partner in values and partner not in flags:
        values[partner] = defaults.get(partner)
  return Recipe(path, module, config, values)


def add_flag(parser: argparse.ArgumentParser, recipe: Recipe, method: str,
             default_note: str | None = None) -> None:
  """Adds `--config` (the flags' defaults are then `recipe.values`)."""
  shown = recipe.path if recipe.path is not None else (default_note or "none: the config's "
                                                       "own defaults")
  parser.add_argument(
      "--config", default=recipe.path, metavar="FILE",
      help=f"the recipe file (configs/{method}/<name>.py) whose get_config() gives every "
           f"value below; a flag given overrides it (default: {shown})")
