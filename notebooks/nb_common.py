"""Cells shared by every notebook: install the package (Colab), detect the backend and SMALL."""

INSTALL = '''\
# Install dpkd-jax when it is not importable (e.g. on Colab). Run this notebook from the
# repository's notebooks/ folder, or set DPKD_JAX_SOURCE to a pip requirement for the package.
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("dpkd_jax") is None:
  source = os.environ.get("DPKD_JAX_SOURCE") or (
      ".." if os.path.exists(os.path.join("..", "setup.cfg")) else None)
  if source is None:
    raise RuntimeError("dpkd_jax is not installed: clone the repository and open this notebook "
                       "from its notebooks/ folder, or set DPKD_JAX_SOURCE (a pip requirement)")
  subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", source])
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
      f"SMALL = {SMALL}")'''
