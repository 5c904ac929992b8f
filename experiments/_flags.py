"""A config dataclass as command-line flags, and the flags back into the config.

    p = _cli.Parser(prog="python -m experiments.x")
    _flags.add_config_flags(p, XConfig, defaults={"dataset": "digits"}, help={...})
    args = p.parse_args(argv)
    config = _flags.build_config(XConfig, args)

Every field becomes `--<field>`, typed from its annotation:
  int, float, str            `--f=3`; `float` takes `inf`
  X | None                   as X, and `none` gives None
  bool (or bool | None)      `--f`, `--nof` / `--no-f`, or `--f=true|false|1|0`
  tuple[str, ...]            comma-separated: `--f=a,b` (empty items dropped)
A field without a default is a required flag unless `defaults` gives one. Help comes from
`help`, else from the field's own entry in the "Attributes:" section of the class docstring
(its first sentence), then "(default: <the value the run uses>[; `notes`])". A field whose
type is itself a config dataclass (DPDFD's `engine: EngineOptions`) gives its own fields as flat
flags (their defaults from the nested config in `defaults`, else its class's), and
`build_config` builds it from them. Fields of other types (`Any`), and nested configs the CLI
builds itself, must be listed in `skip` and handled by the CLI. A config's `RENAMED` class
attribute ({old name: field}) keeps each old flag name as an alias of the field's flag: hidden
from --help, it prints one deprecation line on stderr and sets the field (recorded commands keep
resolving to the same configs).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import types
import typing
from typing import Any, Callable, Iterable, Union

from dpkd_jax import config_checks
from experiments import _cli

parse_bool = _cli.parse_bool  # `true/false/1/0/yes/no` (any case) -> bool


def _named(kind: Callable[[str], Any], name: str) -> Callable[[str], Any]:
  """`kind` renamed: argparse says "invalid <name> value" using the function's name."""
  def convert(text: str) -> Any:
    return kind(text)
  convert.__name__ = name
  return convert


def _float(text: str) -> float:
  """A float flag: finite magnitudes beyond `config_checks.representable` are refused here,
  in one line, before their squares or inverses overflow inside accounting."""
  value = float(text)
  try:
    return config_checks.representable("value", value)
  except ValueError as error:
    raise argparse.ArgumentTypeError(str(error).replace("value=", "", 1)) from None


# The most steps (or epochs) a flag may ask for: at a millisecond a step, over a day. More is a
# typo (`--steps=1e12` would run for decades) and is refused in one line; a longer run is a
# resumed one (`--resume`, `--stop_at_step`).
MAX_STEPS = 10**8
_COUNT_FLAG = re.compile(r"^(?:\w+_)?(?:steps|epochs)$")


def _bounded_count(convert: Callable[[str], Any]) -> Callable[[str], Any]:
  """`convert` of a step or epoch count, refusing counts above `MAX_STEPS`."""
  def count(text: str) -> Any:
    value = convert(text)
    if isinstance(value, int) and value > MAX_STEPS:
      raise argparse.ArgumentTypeError(f"{value} exceeds {MAX_STEPS:.0e}, the most a run may "
                                       "take (more would not finish); give fewer")
    return value
  count.__name__ = getattr(convert, "__name__", "value")
  return count


def _optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
  def convert(text: str) -> Any:
    return None if text.lower() == "none" else kind(text)
  convert.__name__ = getattr(kind, "__name__", "value")
  return convert


def _comma_tuple(text: str) -> tuple[str, ...]:
  return tuple(item.strip() for item in text.split(",") if item.strip())


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
  """(X, True) for `X | None`, else (annotation, False)."""
  if typing.get_origin(annotation) in (Union, types.UnionType):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and len(typing.get_args(annotation)) == 2:
      return args[0], True
  return annotation, False


def _converter(annotation: Any) -> Callable[[str], Any] | None:
  """str -> value for a field annotation, or None if the type is not a flag type."""
  kind, optional = _unwrap_optional(annotation)
  if kind in (int, float, str):
    convert = _named(_float if kind is float else kind, kind.__name__)
  elif typing.get_origin(kind) is tuple and typing.get_args(kind) == (str, ...):
    convert = _named(_comma_tuple, "comma-separated list")
  else:
    return None
  return _optional(convert) if optional else convert


_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z`\"])")


def docstring_help(cls: type) -> dict[str, str]:
  """{field: one line} from the "Attributes:" section of `cls.__doc__` (Google style).

  Each field has its own entry, `name: text`: the first sentence of the text is the flag's
  help, the sentences after it are for readers of the code. An entry naming several fields
  ("a, b: text") or a line describing several ("a: text; b: text") gives none of them help:
  every flag tells its own.
  """
  doc = cls.__doc__ or ""
  section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
  fields = {f.name for f in dataclasses.fields(cls)}
  entries: list[list[str]] = []
  for line in section.splitlines():
    match = re.match(r"^\s{4}(\w+): (.*)$", line)
    if match and not line.startswith(" " * 6):
      entries.append([match.group(1), match.group(2).strip()])
    elif re.match(r"^\s{4}\S", line) and not line.startswith(" " * 6):
      entries.append(["", ""])  # an entry of several fields or prose: no help from it
    elif entries and line.strip():
      entries[-1][1] += " " + line.strip()
  helps = {}
  for name, text in entries:
    several = [n for n in re.findall(r";\s+(\w+): ", text) if n in fields]
    if name in fields and not several:
      helps[name] = _SENTENCE_END.split(text)[0].strip().rstrip(".")
  return helps


def _with_default(text: str | None, default: Any, note: str | None = None) -> str:
  """`text (default: <default>[; <note>])`; a text that says its default itself is kept."""
  text = (text or "").strip()
  if re.search(r"\bdefault:", text):
    return text
  return f"{text} (default: {default}{'; ' + note if note else ''})".strip()


class _Renamed(argparse.Action):
  """An old flag name of a renamed field: one deprecation line, then the field's value."""

  def __init__(self, option_strings, dest, *, new_flag: str, **kwargs):
    super().__init__(option_strings, dest, **kwargs)
    self.new_flag = new_flag

  def __call__(self, parser, namespace, values, option_string=None):
    print(f"deprecated: {option_string} is now --{self.new_flag} (same meaning); the old name "
          "still works", file=sys.stderr, flush=True)
    setattr(namespace, self.dest, values)


def add_config_flags(parser: argparse.ArgumentParser, cls: type, *,
                     defaults: dict[str, Any] | None = None, skip: Iterable[str] = (),
                     help: dict[str, str] | None = None,  # pylint: disable=redefined-builtin
                     choices: dict[str, Iterable[str]] | None = None,
                     names: dict[str, str] | None = None,
                     notes: dict[str, str] | None = None) -> None:
  """Adds one `--<field>` per field of the dataclass `cls` (see the module docstring).

  Args:
    parser: where to add the flags.
    cls: a dataclass whose fields all have flag types, except those in `skip`.
    defaults: CLI defaults replacing the field defaults (a required field becomes optional).
    skip: fields the caller adds (or fills) itself.
    help: help texts replacing the docstring's.
    choices: allowed values of some fields (argparse checks them).
    names: flag names replacing some field names ({"model": "student_model"}: --student_model);
      give the same `names` to `build_config`.
    notes: what the help says after a field's default ({"steps": "digits 600"}: "(default:
      2000; digits 600)"), e.g. the values of the recipes a default depends on.
  """
  defaults, skip, choices, names = defaults or {}, set(skip), choices or {}, names or {}
  notes = notes or {}
  hints = typing.get_type_hints(cls)
  texts = {**docstring_help(cls), **(help or {})}
  for field in dataclasses.fields(cls):
    if field.name in skip:
      continue
    if field.name in defaults:
      default, required = defaults[field.name], False
    elif field.default is not dataclasses.MISSING:
      default, required = field.default, False
    elif field.default_factory is not dataclasses.MISSING:
      default, required = field.default_factory(), False
    else:
      default, required = None, True
    text = texts.get(field.name, "").replace("%", "%%") or None
    flag = names.get(field.name, field.name)
    kind, _ = _unwrap_optional(hints[field.name])
    if dataclasses.is_dataclass(kind):  # nested options: each of its fields is a flat flag
      add_config_flags(parser, kind, defaults=dataclasses.asdict(default), help=help,
                       choices=choices, names=names, notes=notes)
      continue
    if kind is bool:
      # --f alone is True (const); --f=<bool> parses the value; --nof / --no-f is False.
      parser.add_argument(f"--{flag}", nargs="?", const=True, type=parse_bool,
                          default=default, required=required, metavar="BOOL",
                          help=_with_default(text, default, "; ".join(
                              filter(None, [f"--no{flag}: false", notes.get(field.name)]))))
      parser.add_argument(f"--no{flag}", f"--no-{flag}", dest=flag,
                          action="store_false", help=argparse.SUPPRESS)
      continue
    convert = _converter(hints[field.name])
    if convert is None:
      raise TypeError(f"{cls.__name__}.{field.name}: no flag type for {hints[field.name]!r}; "
                      "pass it in skip= and handle it in the CLI")
    note = notes.get(field.name)
    if _COUNT_FLAG.match(field.name) and kind is int:
      convert = _bounded_count(convert)
      note = "; ".join(filter(None, [note, f"at most {MAX_STEPS:.0e}"]))
    shown = ",".join(default) if isinstance(default, tuple) else default
    parser.add_argument(f"--{flag}", type=convert, default=default, required=required,
                        choices=choices.get(field.name),
                        help=text if required else _with_default(text, shown, note))
    for old in (old for old, new in getattr(cls, "RENAMED", {}).items() if new == field.name):
      parser.add_argument(f"--{old}", dest=flag, type=convert, action=_Renamed, new_flag=flag,
                          default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def build_config(cls: type, args: argparse.Namespace, *, names: dict[str, str] | None = None,
                 **values: Any) -> Any:
  """`cls` from the parsed flags of its fields, `values` overriding them; one-line errors.

  `names` maps field names to flag names as given to `add_config_flags`.
  """
  names, hints = names or {}, typing.get_type_hints(cls)
  kwargs = {f.name: getattr(args, names.get(f.name, f.name)) for f in dataclasses.fields(cls)
            if hasattr(args, names.get(f.name, f.name))}
  for field in dataclasses.fields(cls):  # nested options given as flat flags
    kind, _ = _unwrap_optional(hints[field.name])
    if field.name not in values and field.name not in kwargs and dataclasses.is_dataclass(
        kind) and all(hasattr(args, names.get(f.name, f.name)) for f in dataclasses.fields(kind)):
      kwargs[field.name] = build_config(kind, args, names=names)
  kwargs.update(values)
  return _cli.build(cls, **kwargs)
