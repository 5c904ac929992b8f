"""Recipes as files: one module per recipe, `get_config()` returning a complete config.

    python -m experiments.dpdfd --config=configs/dpdfd/digits_quickstart.py [--flag=value ...]

In the manner of big_vision's `configs/`: `configs/<method>/<name>.py` holds one recipe of
the method `python -m experiments.<method>` runs. Its docstring says, one line each:

  Record:      the results record it reproduces (docs/results/<name>.json: accuracy and ε)
  Command:     the command that made that record (the recipe plus flag overrides)
  Hardware:    the machine the record ran on
  Time:        the record's wall time
  Selected on: the split its hyper-parameters were chosen on (test, validation, or the paper's
               fixed recipe), as the record's `selection` says

A flag given on the command line overrides the recipe's value (`experiments/_recipes.py`); the
run saves the resolved config, every field. `tests/test_configs.py` checks every recipe
against its record. A recipe holds no public seed: the commands that reproduce a record name
`--seed=0` (without it the seed is secret, as a release should be).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

METHODS = ("dpdfd", "srr", "dpsgd", "rknn", "rona", "dfpate")
FIELDS = ("Record", "Command", "Hardware", "Time", "Selected on")
_FIELD = re.compile(r"^(Record|Command|Hardware|Time|Selected on):\s+(.*)$")


def recipes() -> dict[str, ModuleType]:
  """{"configs/<method>/<name>.py": module} of every recipe."""
  found = {}
  for method in METHODS:
    package = importlib.import_module(f"{__name__}.{method}")
    for info in pkgutil.iter_modules(package.__path__):
      found[f"configs/{method}/{info.name}.py"] = importlib.import_module(
          f"{__name__}.{method}.{info.name}")
  return found


def fields(module: ModuleType) -> dict[str, str]:
  """{field: text} of the recipe's docstring lines `Record: ...`, `Command: ...`, ..."""
  out = {}
  for line in (module.__doc__ or "").splitlines():
    match = _FIELD.match(line.strip())
    if match:
      out[match.group(1)] = match.group(2).strip()
  return out


def record_commands() -> dict[str, str]:
  """{record name: the recipe command that reproduces it} (the generated docs show it)."""
  out = {}
  for module in recipes().values():
    found = fields(module)
    name = found["Record"].split()[0].rsplit("/", 1)[-1].removesuffix(".json")
    out[name] = found["Command"]
  return out
