"""DPDFD: convert a teacher into a DP student (and generator) without touching private data.

  python -m experiments.dpdfd --dataset=digits   # the Quickstart: teacher trained or reused
  python -m experiments.dpdfd --dataset=mnist --teacher_dirs=runs/teacher/mnist_small_cnn \
      --target_epsilon=10 --noise_multiplier=... [--accounting=sound|paper]
  python -m experiments.dpdfd --dataset=mnist --teacher_ensemble_dir=runs/teacher_ensemble/DIR \
      --target_epsilon=10   # n stacked disjoint-shard teachers (experiments.teacher_ensemble)
  python -m experiments.dpdfd sample --workdir=runs/dpdfd/mnist --num=10000
  python -m experiments.dpdfd --mode=direct --dataset=mnist --noise_multiplier=...  # Table 4, NOT DP
  python -m experiments.dpdfd --dataset=cifar10 --dry_run  # per-step cost, H100/v5e time

Without --teacher_dirs the teacher is runs/teacher/<dataset>_<teacher_model>, reused when its
card matches, else trained. Per-dataset defaults (dpdfd/quickstart.py, docs/RESULTS.md) are the
recipes of best test accuracy (selected on the test split; --validation_examples selects on a
private hold-out): --dataset=digits fits a few CPU minutes (sound target epsilon 10 unless
--noise_multiplier/--target_epsilon); mnist and fashion_mnist get the disagreement engine
(--steps=8000 --batch_size=64 --generator_channels=64 --teacher_loss=logit --bound_method=clip
--l2_norm_bound=1000 --generator_objective=disagreement; Fashion-MNIST: a small_cnn student and
--class_conditional_weight=3), with --teacher_ensemble_dir the paper
generator at C = 1 for 2,000 steps, with --accounting=paper C = 1e-10 (kappa 1e-12, gamma 1e12)
and the class-conditional generator (--class_conditional_weight=1; Fashion-MNIST 3).
A flag you give always wins; the defaults below are the config's.
"""

from __future__ import annotations

import argparse
import os

from dpkd_jax import teacher
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import quickstart
from dpkd_jax.train import distributed
from dpkd_jax.train import summary
from experiments import _cli
from experiments import _dry_run
from experiments import _flags

_HELP = {
    "teacher_dirs": "comma-separated teacher workdirs (default: the one of experiments.teacher)",
    "teacher_ensemble_dir": "instead of --teacher_dirs: n stacked teachers on disjoint shards "
                            "(experiments.teacher_ensemble; one teacher per record)",
    "seed": "reproducible run (its noise is then public); default: a secret seed from OS entropy",
    "data_dir": "directory of <dataset>.npz (else $DPKD_DATA_DIR/tfds)",
}


def parse_direct(argv: list[str]) -> tuple[dpdfd.DirectConfig, str]:
  """`--mode=direct` flags (without it) -> (validated config, workdir)."""
  p = _cli.Parser(prog="python -m experiments.dpdfd --mode=direct", cpu_kernels=True)
  _flags.add_config_flags(p, dpdfd.DirectConfig, help={"seed": _HELP["seed"]})
  p.add_argument("--workdir", default=None, help="default runs/dpdfd_direct/<dataset>")
  a = p.parse_args(argv)
  config = _flags.build_config(dpdfd.DirectConfig, a)
  return config, a.workdir or os.path.join("runs", "dpdfd_direct", config.dataset)


def _sample(argv: list[str]) -> None:
  p = _cli.Parser(prog="python -m experiments.dpdfd sample")
  p.add_argument("--workdir", required=True, help="a DPDFD run's workdir")
  p.add_argument("--num", type=int, default=10000, help="number of synthetic images")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None, help="output .npz (default <workdir>/synthetic.npz)")
  a = p.parse_args(argv)
  if a.num < 1:
    p.error(f"--num must be >= 1, got {a.num}")
  dpdfd.check_run(a.workdir)
  _cli.check_output_file(a.out or os.path.join(a.workdir, "synthetic.npz"),
                         "--out" if a.out else "--workdir")
  print("wrote", dpdfd.sample(a.workdir, a.num, seed=a.seed, out_path=a.out))


def parse_config(argv: list[str]) -> tuple[dpdfd.DPDFDConfig, argparse.Namespace]:
  """Flags -> (validated config, flags); `flags.teacher_config` is the teacher to train or
  reuse (None when --teacher_dirs or --teacher_ensemble_dir names the teachers)."""
  p = _cli.Parser(prog="python -m experiments.dpdfd", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter, cpu_kernels=True)
  _flags.add_config_flags(p, dpdfd.DPDFDConfig, help=_HELP, defaults={"teacher_dirs": None})
  p.add_argument("--teacher_model", default=quickstart.TEACHER_MODEL)
  p.add_argument("--teacher_epochs", type=int, default=quickstart.TEACHER_EPOCHS)
  p.add_argument("--workdir", default=None, help="default runs/dpdfd/<dataset>")
  p.add_argument("--no_progress", action="store_true")
  first = p.parse_known_args(argv)[0]
  p.set_defaults(**quickstart.flag_defaults(first.dataset, _flags.given_flags(p, argv, first)))
  a = p.parse_args(argv)
  a.workdir = a.workdir or os.path.join("runs", "dpdfd", a.dataset)
  a.target_epsilon = quickstart.default_target_epsilon(a.dataset, a.noise_multiplier,
                                                       a.target_epsilon)
  a.teacher_config = None
  if a.teacher_dirs is None and a.teacher_ensemble_dir is not None:
    a.teacher_dirs = ()  # the ensemble directory holds every teacher
  elif a.teacher_dirs is None:
    a.teacher_config = _cli.build(teacher.TeacherConfig, dataset=a.dataset, model=a.teacher_model,
                                  epochs=a.teacher_epochs, data_dir=a.data_dir,
                                  validation_examples=a.validation_examples)
    held = f"_val{a.validation_examples}" if a.validation_examples else ""  # its own teacher
    a.teacher_dirs = (quickstart.default_teacher_dir(a.dataset, a.teacher_model) + held,)
  return _flags.build_config(dpdfd.DPDFDConfig, a), a


@_cli.entry_point
def main(argv: list[str]) -> None:
  distributed.initialize_from_env()  # no-op unless launched across hosts (docs/DISTRIBUTED.md)
  if argv[:1] == ["sample"]:
    return _sample(argv[1:])
  if "--mode=direct" in argv:  # the mechanism on private data (paper Table 4): ε = inf
    config, workdir = parse_direct([x for x in argv if x != "--mode=direct"])
    _cli.check_output_dir(workdir, "--workdir")
    results = dpdfd.train_direct(config, workdir)
    return print("\n".join(summary.summary_lines(results, workdir=workdir)))
  if _dry_run.requested(argv):  # shapes only: reads no data, charges and writes nothing
    return _dry_run.main(argv, parse_config)
  config, a = parse_config(argv)
  _cli.check_output_dir(a.workdir, "--workdir")
  results = quickstart.convert(config, a.workdir, teacher_config=a.teacher_config,
                               progress=not a.no_progress)
  print("\n".join(quickstart.summary_lines(results, a.workdir)))


if __name__ == "__main__":
  main()
