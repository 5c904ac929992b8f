"""Cells shared by every notebook: install the package (Colab), detect the backend and SMALL."""

INSTALL = '''\
# Where dpkd-jax comes from on a fresh runtime (Colab, a new virtualenv): any pip requirement,
# e.g. a wheel built with `python -m build` ("/content/dpkd_jax-0.1.0-py3-none-any.whl") or a
# repository address ("git+https://<host>/<owner>/dpkd-jax"). Left empty: the environment
# variable DPKD_JAX_SOURCE, else the clone this notebook sits in. Nothing is installed when
# dpkd_jax is importable already.
DPKD_JAX_SOURCE = ""

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys


def detected_runtime():
  """"tpu", "cuda12", "cuda13" or "cpu": what the machine has, before JAX is imported."""
  if os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_NAME") or glob.glob("/dev/accel*"):
    return "tpu"
  if shutil.which("nvidia-smi"):
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False).stdout
    cuda = re.search(r"CUDA Version: (\\d+)", smi)
    if cuda:
      return "cuda13" if int(cuda.group(1)) >= 13 else "cuda12"
  return "cpu"


RUNTIME = detected_runtime()
JAX_WHEELS = {"tpu": "jax[tpu]", "cuda12": "jax[cuda12]", "cuda13": "jax[cuda13]",
              "cpu": "jax"}[RUNTIME] + ">=0.10.2"
print(f"runtime detected: {RUNTIME}; JAX for it: {JAX_WHEELS}")
if importlib.util.find_spec("dpkd_jax") is None:
  source = DPKD_JAX_SOURCE or os.environ.get("DPKD_JAX_SOURCE") or (
      ".." if os.path.exists(os.path.join("..", "setup.cfg")) else None)
  if source is None:
    raise RuntimeError("dpkd_jax is not installed: set DPKD_JAX_SOURCE at the top of this cell "
                       "to a wheel (python -m build) or a repository address")
  print(f"installing {source} and {JAX_WHEELS}")
  subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", source, JAX_WHEELS])
print("dpkd_jax found:", importlib.util.find_spec("dpkd_jax").origin)'''

DEVICE = '''\
# Backend detection and the small-config switch. SMALL = True (a tiny config that runs in
# well under a minute on a laptop CPU; what CI executes) unless a TPU or GPU is attached.
# Override with the environment variable DPKD_NOTEBOOK_SMALL=1 (or 0). The model zoo runs plain
# JAX ops on every backend; on a CPU runtime, dpkd_jax.kernels.use_cpu_kernels() here, before
# JAX starts, would run it through this library's faster CPU kernels instead.
import dpkd_jax  # noqa: F401
import jax

BACKEND = jax.default_backend()  # "tpu", "gpu" or "cpu"
ON_ACCELERATOR = BACKEND in ("tpu", "gpu")
SMALL = os.environ.get("DPKD_NOTEBOOK_SMALL", "0" if ON_ACCELERATOR else "1") == "1"
print(f"backend: {BACKEND}, {jax.device_count()} device(s) ({jax.devices()[0].device_kind}); "
      f"SMALL = {SMALL}")
if RUNTIME != "cpu" and BACKEND == "cpu":
  print(f"note: a {RUNTIME} runtime was detected but JAX runs on the CPU; after an install, "
        "restart the runtime (Colab: Runtime > Restart session) and run the notebook again")'''
