"""dpkd-jax: differentially private knowledge distillation in JAX/Flax."""

__version__ = "0.1.0"

# XLA CPU options, set before JAX starts a backend (see xla_cpu.py: opt out with
# DPKD_XLA_CPU_DEFAULTS=0, or name the option in XLA_FLAGS yourself).
from dpkd_jax import xla_cpu as _xla_cpu  # noqa: E402  pylint: disable=wrong-import-position

_xla_cpu.apply_defaults()
