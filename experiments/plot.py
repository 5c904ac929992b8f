"""Privacy–utility curve of finished runs: `python -m experiments.plot --runs runs/dpdfd/* --out curve.png`.

Reads each run's results.json (sound ε and test accuracy; see `dpkd_jax.plotting`) and writes a
PNG of accuracy against ε. Runs without a guarantee (ε = ∞) are drawn as reference lines.
"""

from __future__ import annotations

import argparse
import math

from dpkd_jax import plotting
from experiments import _cli


@_cli.entry_point
def main(argv: list[str]) -> None:
  p = _cli.Parser(prog="python -m experiments.plot", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", nargs="+", required=True, help="run workdirs (each with results.json)")
  p.add_argument("--out", required=True, help="output PNG")
  p.add_argument("--title", default=None)
  p.add_argument("--trajectories", action="store_true",
                 help="also draw each run's (ε spent, accuracy) at every evaluation (metrics.csv)")
  p.add_argument("--paper_epsilon", action="store_true",
                 help="also mark the papers' ε figures (hollow markers, NOT guarantees)")
  p.add_argument("--skip_unfinished", action="store_true",
                 help="ignore directories without results.json instead of failing")
  a = p.parse_args(argv)
  _cli.check_output_file(a.out, "--out")
  try:
    runs = plotting.load_runs(a.runs, skip_unfinished=a.skip_unfinished)
  except (FileNotFoundError, ValueError) as e:  # a missing or malformed results.json
    _cli.fail(f"--runs: {e}")
  plotting.plot_privacy_utility(runs, a.out, title=a.title, trajectories=a.trajectories,
                                paper_epsilon=a.paper_epsilon)
  for run in runs:
    eps = "inf (no guarantee)" if math.isinf(run.epsilon) else f"{run.epsilon:.4g}"
    print(f"{run.label}: {run.method}, eps {eps}, accuracy {run.accuracy:.4f}")
  print("wrote", a.out)


if __name__ == "__main__":
  main()
