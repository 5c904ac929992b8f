"""experiments/_flags.py: config dataclass <-> flags, and the documented commands still parse
into the configs they meant (README.md, docs/RESULTS.md)."""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from typing import Any

import pytest

from dpkd_jax import teacher
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods import dfpate
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods import rknn
from dpkd_jax.methods import rona
from dpkd_jax.methods import srr
from experiments import _cli
from experiments import _flags
from experiments import dfpate as dfpate_cli
from experiments import dpdfd as dpdfd_cli
from experiments import dpsgd as dpsgd_cli
from experiments import rknn as rknn_cli
from experiments import rona as rona_cli
from experiments import srr as srr_cli
from experiments import teacher as teacher_cli
from experiments import teacher_ensemble as teacher_ensemble_cli


@dataclasses.dataclass(frozen=True, kw_only=True)
class Toy:
  """A config with every flag type.

  Attributes:
    name: required; a 100% string.
    count: an int.
    rate: a float. Only the first sentence is the help.
    limit: a float or None.
    seed: an int or None.
    path: a string or None; fast: a bool.
    maybe: a bool or None
      (None: decided later).
    terms, other: an entry of several fields gives none of them help.
  """

  name: str
  count: int = 3
  rate: float = 0.5
  limit: float | None = None
  seed: int | None = 7
  path: str | None = None
  fast: bool = True
  maybe: bool | None = None
  terms: tuple[str, ...] = ("a", "b")

  def __post_init__(self):
    if self.count < 0:
      raise ValueError(f"count must be >= 0, got {self.count}")


def _toy(argv: list[str], **kwargs) -> Toy:
  p = _cli.Parser(prog="toy")
  _flags.add_config_flags(p, Toy, **kwargs)
  return _flags.build_config(Toy, p.parse_args(argv))


def test_defaults_and_required():
  assert _toy(["--name=x"]) == Toy(name="x")
  assert _toy([], defaults={"name": "dflt"}) == Toy(name="dflt")


def test_types():
  assert _toy(["--name=x", "--count=4", "--rate=inf", "--limit=2.5", "--seed=none",
               "--path=p", "--terms=c, d,,e"]) == Toy(
                   name="x", count=4, rate=math.inf, limit=2.5, seed=None, path="p",
                   terms=("c", "d", "e"))
  assert _toy(["--name=x", "--limit=None", "--path=none", "--terms="]) == Toy(
      name="x", terms=())


@pytest.mark.parametrize("argv,fast,maybe", [
    ([], True, None), (["--fast"], True, None), (["--nofast"], False, None),
    (["--no-fast"], False, None), (["--fast=false"], False, None), (["--fast", "0"], False, None),
    (["--maybe"], True, True), (["--nomaybe"], True, False), (["--maybe=True"], True, True),
    (["--nofast", "--fast=yes"], True, None),
])
def test_bools(argv, fast, maybe):
  config = _toy(["--name=x", *argv])
  assert (config.fast, config.maybe) == (fast, maybe)


@pytest.mark.parametrize("argv,fragment", [
    ([], "required: --name"),
    (["--name=x", "--count=1.5"], "argument --count: invalid int value: '1.5'"),
    (["--name=x", "--fast=perhaps"], "expected true or false, got 'perhaps'"),
    (["--name=x", "--count=-1"], "count must be >= 0, got -1"),
    (["--name=x", "--bogus=1"], "unrecognized arguments: --bogus=1"),
])
def test_errors_are_one_line(argv, fragment, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _toy(argv)
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1 and fragment in err


def test_help_from_docstring_names_choices_skip(capsys):
  helps = _flags.docstring_help(Toy)
  assert helps["maybe"] == "a bool or None (None: decided later)"
  assert helps["rate"] == "a float" and helps["count"] == "an int"
  assert "path" not in helps and "fast" not in helps  # one line, two fields: no help
  assert "terms" not in helps
  p = _cli.Parser(prog="toy")
  _flags.add_config_flags(p, Toy, skip={"terms"}, names={"count": "toy_count"},
                          choices={"path": ["p", "q"]}, help={"seed": "the seed"})
  text = p.format_help()
  assert "--toy_count" in text and "--terms" not in text and "the seed" in text
  assert "a 100% string" in text and "(default: 0.5)" in text
  args = p.parse_args(["--name=x", "--toy_count=9", "--path=q"])
  assert _flags.build_config(Toy, args, names={"count": "toy_count"}, terms=("z",)) == Toy(
      name="x", count=9, path="q", terms=("z",))
  with pytest.raises(SystemExit):
    p.parse_args(["--name=x", "--path=r"])
  assert "invalid choice: 'r'" in capsys.readouterr().err


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Options:
  """Nested options.

  Attributes:
    depth: how deep.
  """

  depth: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Outer:
  """A config with nested options and a renamed field.

  Attributes:
    clip_norm: the bound.
    options: nested options.
  """

  RENAMED = {"norm_bound": "clip_norm"}  # a class attribute: the old flag name
  clip_norm: float = 1.0
  options: _Options = dataclasses.field(default_factory=_Options)


def test_nested_options_are_flat_flags_and_old_names_still_work(capsys):
  p = _cli.Parser(prog="outer")
  _flags.add_config_flags(p, _Outer, defaults={"options": _Options(depth=4)},
                          notes={"depth": "the recipe's"})
  text = p.format_help()
  assert "--depth" in text and "(default: 4; the recipe's)" in text
  assert "--options" not in text and "--norm_bound" not in text  # the old name: hidden
  assert _flags.build_config(_Outer, p.parse_args([])) == _Outer(options=_Options(depth=4))
  config = _flags.build_config(_Outer, p.parse_args(["--depth=2", "--clip_norm=3"]))
  assert config == _Outer(clip_norm=3.0, options=_Options(depth=2))
  assert capsys.readouterr().err == ""
  assert _flags.build_config(_Outer, p.parse_args(["--norm_bound=3", "--depth=2"])) == config
  err = capsys.readouterr().err
  assert err == ("deprecated: --norm_bound is now --clip_norm (same meaning); the old name "
                 "still works\n")


def test_dpdfd_old_flag_names_resolve_to_the_same_config(capsys):
  new, _ = dpdfd_cli.parse_config(["--dataset=digits", "--l2_clip_norm=2",
                                   "--student_learning_rate=3e-4",
                                   "--generator_learning_rate=2e-4", "--replay_size=640"])
  assert capsys.readouterr().err == ""
  old, _ = dpdfd_cli.parse_config(["--dataset=digits", "--l2_norm_bound=2", "--student_lr=3e-4",
                                   "--generator_lr=2e-4", "--replay_size=640"])
  assert old == new and new.engine.replay_size == 640
  assert capsys.readouterr().err.count("deprecated: ") == 3
  direct, _ = dpdfd_cli.parse_direct(["--dataset=digits", "--noise_multiplier=1",
                                      "--l2_norm_bound=2"])
  assert direct.l2_clip_norm == 2.0


def test_unsupported_field_type_is_named():
  @dataclasses.dataclass
  class Nested:
    inner: Any = None
  with pytest.raises(TypeError, match=r"Nested.inner: no flag type"):
    _flags.add_config_flags(_cli.Parser(), Nested)


# ------------------------------------------------ documented commands -> the same configs

_M = ("--dataset=mnist --teacher_dir=runs/teacher/mnist_small_cnn_aug15 --data_dir=../shared/data"
      " --generator_channels=64 --stages=10 --samples_per_stage=5120 --student_epochs=5 --seed=0")
_P = ("--dataset=mnist --teacher_dir=runs/teacher/mnist_small_cnn_aug15 --data_dir=../shared/data"
      " --public_fraction=0.4 --student_model=compact_5k --hint_epochs=2 --rounds=5"
      " --self_learning_epochs=4 --distillation_epochs=1 --num_query_samples=2560 --seed=0")
_COMMON = ("--data_dir=../shared/data --teacher_model=patch_cnn --rounds=4 --queries_per_round=500"
           " --student_epochs=15 --seed=0 --no_progress")


def test_documented_teacher_and_dpsgd_commands():
  config, args = teacher_cli.parse_config(shlex.split(
      "--dataset=mnist --model=small_cnn --epochs=2 --augment --num_shards=10 --all_shards "
      "--workdir=runs/teacher/mnist_small_cnn_10shards"))
  assert config == teacher.TeacherConfig(dataset="mnist", model="small_cnn", epochs=2,
                                         augment=True, num_shards=10)
  assert args.all_shards and args.workdir == "runs/teacher/mnist_small_cnn_10shards"
  config, args = teacher_cli.parse_config(["--dataset=digits", "--epochs=30"])
  assert config == teacher.TeacherConfig(dataset="digits", model="small_cnn", epochs=30)
  assert args.workdir == os.path.join("runs", "teacher", "digits_small_cnn")
  config, _ = dpsgd_cli.parse_config(shlex.split(
      "--seed=0 --dataset=fashion_mnist --model=lenet5 --target_epsilon=2 --steps=500 "
      "--expected_batch_size=256 --no-download"))
  assert config == dpsgd.DPSGDConfig(dataset="fashion_mnist", model="lenet5", target_epsilon=2,
                                     steps=500, expected_batch_size=256, seed=0)


def test_documented_dpdfd_commands():
  config, args = dpdfd_cli.parse_config(shlex.split(
      "--seed=0 --dataset=digits --teacher_dirs=runs/teacher/digits_small_cnn --steps=600 "
      "--eval_every=100 --batch_size=64 --generator_channels=64 --student_model=lenet5 "
      "--entropy_weight=5 --feature_weight=0.1 --student_loss=ce --noise_multiplier=0 "
      "--student_norm=batch --teacher_loss=dkd"))
  assert config == dpdfd.DPDFDConfig(
      seed=0, dataset="digits", teacher_dirs=("runs/teacher/digits_small_cnn",), steps=600,
      eval_every=100, batch_size=64, generator_channels=64, student_model="lenet5",
      entropy_weight=5.0, feature_weight=0.1, student_loss="ce", noise_multiplier=0.0)
  assert args.workdir == os.path.join("runs", "dpdfd", "digits")
  config, _ = dpdfd_cli.parse_config(shlex.split(
      "--dataset=mnist --teacher_dirs=a/shard_0,a/shard_1 --target_epsilon=10 --accounting=paper"))
  assert config.teacher_dirs == ("a/shard_0", "a/shard_1") and config.accounting == "paper"
  config, workdir = dpdfd_cli.parse_direct(shlex.split(
      "--seed=0 --dataset=mnist --model=lenet5 --noise_multiplier=12.69855765739809 --steps=500 "
      "--eval_every=100 --expected_batch_size=256 --workdir=runs/dpdfd_direct/mnist_paper_eps10"))
  assert config == dpdfd.DirectConfig(
      seed=0, dataset="mnist", model="lenet5", noise_multiplier=12.69855765739809, steps=500,
      eval_every=100, expected_batch_size=256)
  assert workdir == "runs/dpdfd_direct/mnist_paper_eps10"


def test_documented_teacher_ensemble_commands():
  config, args = teacher_ensemble_cli.parse_config(shlex.split(
      "--dataset=mnist --num_teachers=250 --teacher_model=patch_cnn --teacher_epochs=20 "
      "--shard_seed=0 --workdir=runs/teacher_ensemble/mnist_pcnn250"))
  assert config == teacher_ensemble.TeacherEnsembleConfig(
      dataset="mnist", num_teachers=250, teacher_model="patch_cnn", teacher_epochs=20)
  assert args.workdir == "runs/teacher_ensemble/mnist_pcnn250"
  # Its identity is the one a DF-PATE run with the same teacher flags reuses.
  assert config.identity() == dfpate.DFPATEConfig(
      dataset="mnist", num_teachers=250, teacher_model="patch_cnn",
      teacher_epochs=20).teacher_identity()
  config, args = dpdfd_cli.parse_config(shlex.split(
      "--dataset=mnist --teacher_ensemble_dir=runs/teacher_ensemble/mnist_pcnn250 "
      "--target_epsilon=10"))
  assert config.teacher_ensemble_dir == "runs/teacher_ensemble/mnist_pcnn250"
  assert config.teacher_dirs == () and args.teacher_config is None


def test_documented_srr_commands():
  config, args = srr_cli.parse_config(shlex.split(
      f"{_M} --generator_terms=ce,ie --epsilon=10 --pretrained_generator_dir=runs/srr/g "
      "--workdir=runs/srr/a --resume"))
  assert config == srr.SRRConfig(
      dataset="mnist", teacher_dir="runs/teacher/mnist_small_cnn_aug15",
      data_dir="../shared/data", generator_channels=64, stages=10, samples_per_stage=5120,
      student_epochs=5, seed=0, generator_terms=("ce", "ie"), epsilon=10.0,
      pretrained_generator_dir="runs/srr/g", student_model="small_cnn",
      engine=srr.EngineOptions(student_loss="rr_likelihood"))
  assert args.resume and args.workdir == "runs/srr/a"
  config, args = srr_cli.parse_config(
      ["--dataset=mnist", "--teacher_dir=t"], pretrain_only=True)
  assert config == srr.SRRConfig(  # configs/srr/mnist_eps10.py, with no label query
      dataset="mnist", teacher_dir="t", epsilon=math.inf, generator_channels=64, stages=4,
      samples_per_stage=12800, student_epochs=10, student_model="small_cnn",
      engine=srr.EngineOptions(student_loss="rr_likelihood"))
  assert (config.stages, config.samples_per_stage, config.engine.student_loss,
          config.student_model) == (
      4, 12800, "rr_likelihood", "small_cnn")  # the best measured engine, not the paper's
  assert args.workdir == os.path.join("runs", "srr", "mnist_generator")


def test_documented_rona_rknn_dfpate_commands():
  config, _ = rona_cli.parse_config(shlex.split(
      f"{_P} --target_epsilon=7.68 --bound_mode=fixed --hint_l2_bound=2000 --distill_l2_bound=16"))
  assert config == rona.RONAConfig(
      dataset="mnist", teacher_dir="runs/teacher/mnist_small_cnn_aug15",
      data_dir="../shared/data", public_fraction=0.4, student_model="compact_5k",
      hint_epochs=2, rounds=5, self_learning_epochs=4, distillation_epochs=1,
      num_query_samples=2560, seed=0, target_epsilon=7.68, bound_mode="fixed",
      hint_l2_clip_norm=2000.0, distill_l2_clip_norm=16.0)
  config, args = rknn_cli.parse_config(shlex.split(
      "--dataset=mnist --representation=pca --num_queries=200 --k=1 --epsilon=0.1"))
  assert config == rknn.RKNNConfig(dataset="mnist", representation="pca", num_queries=200, k=1,
                                   epsilon=0.1, representation_config=config.representation_config)
  assert config.student == rknn.RKNNConfig(dataset="mnist").student
  assert args.workdir == os.path.join("runs", "rknn", "mnist_pca_central_s200_k1_eps0.1")
  config, args = dfpate_cli.parse_config(shlex.split(
      f"--dataset=mnist {_COMMON} --target_epsilon=none --noise_std=0 "
      "--teachers_dir=runs/dfpate/t --workdir=runs/dfpate/mnist_nonprivate"))
  assert config == dfpate.DFPATEConfig(
      dataset="mnist", data_dir="../shared/data", teacher_model="patch_cnn", rounds=4,
      queries_per_round=500, student_epochs=15, seed=0, target_epsilon=None, noise_std=0.0,
      teachers_dir="runs/dfpate/t")
  assert args.no_progress and args.workdir == "runs/dfpate/mnist_nonprivate"
  config, _ = dfpate_cli.parse_config(["--dataset=mnist", "--use_teachers=false"])
  assert config.use_teachers is False


@pytest.mark.parametrize("parse", [teacher_cli.parse_config, dpsgd_cli.parse_config,
                                   rknn_cli.parse_config, rona_cli.parse_config])
def test_no_download_unless_asked(parse):
  """The network is used only with an explicit --download."""
  argv = ["--dataset=digits", "--noise_multiplier=1", "--steps=1"] if parse in (
      dpsgd_cli.parse_config, rona_cli.parse_config) else []
  argv = argv[:2] if parse is rona_cli.parse_config else argv
  assert parse(argv)[0].download is False
  assert parse([*argv, "--download"])[0].download is True


def test_secure_noise_flag(capsys):
  """--secure_noise reaches the DPDFD and DF-PATE configs; DP-SGD, and DF-PATE's query model,
  refuse it in one line."""
  config, _ = dpdfd_cli.parse_config(["--dataset=digits", "--teacher_dirs=t",
                                      "--noise_multiplier=5", "--secure_noise",
                                      "--secure_grid_bits=12"])
  assert config.secure_noise and config.secure_grid_bits == 12
  assert not dpdfd_cli.parse_config(["--dataset=digits", "--teacher_dirs=t",
                                     "--noise_multiplier=5"])[0].secure_noise
  for parse, argv in ((dpsgd_cli.parse_config, ["--dataset=digits", "--noise_multiplier=1",
                                                "--steps=1"]),
                      (dfpate_cli.parse_config, ["--dataset=digits",
                                                 "--query_source=dp_model"])):
    with pytest.raises(SystemExit) as exit_info:
      parse([*argv, "--secure_noise"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--secure_noise" in err
  assert dfpate_cli.parse_config(["--dataset=digits", "--secure_noise"])[0].secure_noise
