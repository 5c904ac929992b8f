"""The graph importer on its five test models: logit agreement, import time, DPDFD step time.

    PYTHONPATH=. python benchmarks/graph_import.py \
        --out=docs/results/benchmarks/graph_import__cpu.json

Each model (random initialisation, non-trivial batch-norm statistics; torchvision's resnet50,
efficientnet_b0 and mobilenet_v3_small with a 1-channel first convolution, the custom module
and the Keras model of tests/graph_fixtures.py) is saved as a file (`torch.export` program,
`.keras`) and imported on digits (28x28x1) with `importers.import_teacher(arch="graph")`, which
checks it against the source on 48 inputs (32 test images, 16 random). Then DPDFD runs from the
teacher workdir as `experiments.dpdfd` loads it (`dpdfd.run.load_teachers`): the first two
steps (compilation included, `warmup_s`) and the median of the next `--steps`. Each model's
`load_before` is the machine's 1-minute load average: on a busy machine the seconds are upper
bounds. `--models=a,b --update` re-measures some models and keeps the others of `--out`
(each model then records its `commit`; the top-level `command` and `commit` are the last run's).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import jax

from dpkd_jax.importers import run as import_run
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import run as dpdfd_run
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.train import sharding

_ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ("resnet50", "efficientnet_b0", "mobilenet_v3_small", "custom", "keras")
_WARMUP = 2  # the first step compiles; the second shows whether it compiles again


def _source(name: str, directory: str) -> tuple[str, str]:
  """(framework, the saved file) of test model `name`, for digits."""
  sys.path.insert(0, str(_ROOT / "tests"))
  import graph_fixtures  # pylint: disable=import-outside-toplevel
  if name == "keras":
    path = os.path.join(directory, "teacher.keras")
    graph_fixtures.keras_model().save(path)
    return "keras", path
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  if name == "custom":
    model = graph_fixtures.graph_custom()
  else:
    model = graph_fixtures.torchvision_gray(name)
  path = os.path.join(directory, f"{name}.pt2")
  torch.export.save(torch.export.export(model.eval(), (torch.zeros(2, 1, 28, 28),)), path)
  return "torch", path


def _dpdfd(workdir: str, steps: int) -> dict[str, float]:
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=(workdir,), noise_multiplier=10.0,
                             student_model="lenet5_half", steps=steps + _WARMUP, batch_size=16,
                             eval_every=steps + _WARMUP, latent_dim=16)
  ensemble, _ = dpdfd_run.load_teachers(config)
  mesh = sharding.data_mesh()  # placed as `dpdfd.train_dpdfd` places them
  state = sharding.replicate(step_lib.init_state(config, jax.random.key(0)), mesh)
  ensemble = sharding.replicate(ensemble, mesh)
  train_step = step_lib.make_train_step(dpdfd.make_plan(config), config, ensemble.graphdef)
  times = []
  for i in range(steps + _WARMUP):
    start = time.perf_counter()
    key = sharding.replicate(jax.random.fold_in(jax.random.key(1), i), mesh)
    state, metrics = train_step(state, ensemble.params, ensemble.batch_stats, key)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return {"batch_size": 16, "warmup_s": round(sum(times[:_WARMUP]), 1),
          "step_s": round(statistics.median(times[_WARMUP:]), 3), "timed_steps": steps}


def measure(name: str, steps: int) -> dict:
  with tempfile.TemporaryDirectory() as directory:
    framework, path = _source(name, directory)
    start = time.perf_counter()
    card = import_run.import_teacher(framework=framework, arch="graph", checkpoint=path,
                                     dataset="digits", workdir=os.path.join(directory, "t"),
                                     input_norm="half" if framework == "torch" else "unit")
    import_s = time.perf_counter() - start
    check = card["import"]["check"]
    return {"framework": framework,
            "max_relative_logit_difference": check["max_relative_logit_difference"],
            "argmax_agreement": check["argmax_agreement"], "num_inputs": check["num_inputs"],
            "params": card["param_count"], "graph_nodes": card["graph"]["nodes"],
            "batch_norms": card["graph"]["batch_norms"],
            "operations": card["graph"]["operations"], "import_s": round(import_s, 1),
            "dpdfd": _dpdfd(os.path.join(directory, "t"), steps)}


def _commit() -> str:
  return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True,
                        text=True).stdout.strip()


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--models", default=",".join(MODELS))
  p.add_argument("--steps", type=int, default=3, help="timed DPDFD steps after the first")
  p.add_argument("--out", default=None, help="write the record here (else stdout)")
  p.add_argument("--update", action="store_true", help="keep --out's other models")
  args = p.parse_args()
  unknown = sorted(set(args.models.split(",")) - set(MODELS))
  if unknown or args.steps < 1 or (args.update and not args.out):
    p.error(f"--models must be among {MODELS}, --steps >= 1, --update needs --out (got "
            f"unknown {unknown}, --steps={args.steps})")  # one line, exit status 2
  record = {"platform": jax.devices()[0].platform, "dataset": "digits", "models": {}}
  if args.update and os.path.isfile(args.out):
    record = json.loads(pathlib.Path(args.out).read_text())
  for name in args.models.split(","):
    load = os.getloadavg()[0]
    record["models"][name] = {**measure(name, args.steps), "load_before": round(load, 2),
                              "commit": _commit()}
    print(name, json.dumps(record["models"][name]), file=sys.stderr, flush=True)
  record.update({"command": "PYTHONPATH=. python " + " ".join(["benchmarks/graph_import.py",
                                                              *sys.argv[1:]]),
                 "commit": _commit(),
                 "host": "2-core CPU development machine (no accelerator), shared",
                 "date": time.strftime("%Y-%m-%d", time.gmtime())})
  text = json.dumps(record, indent=2)
  if args.out:
    pathlib.Path(args.out).write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  main()
