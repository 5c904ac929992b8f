"""dpkd_jax/xla_cpu.py: the XLA CPU options `import dpkd_jax` sets, and when it leaves them."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
from jax import lax

from dpkd_jax import xla_cpu

FLAG = "--xla_cpu_experimental_ynn_fusion_type"
DEFAULT = f"{FLAG}=-individual_convolution"


def test_flags_to_add_respects_the_users_setting_and_the_jaxlib_version():
  assert xla_cpu.flags_to_add("", "0.10.2") == [DEFAULT]
  assert xla_cpu.flags_to_add("--xla_backend_optimization_level=0", "0.10.7") == [DEFAULT]
  assert xla_cpu.flags_to_add(f"{FLAG}=", "0.10.2") == []  # the user's (empty) value wins
  assert xla_cpu.flags_to_add(f"--a=1 {FLAG}=individual_dot", "0.10.2") == []
  # An option an XLA does not know aborts the process: unmeasured versions get nothing.
  assert xla_cpu.flags_to_add("", "0.11.0") == []
  assert xla_cpu.flags_to_add("", "1.10.0") == []
  assert xla_cpu.flags_to_add("", None) == []


def test_apply_defaults_appends_once_and_can_be_opted_out(monkeypatch):
  monkeypatch.setattr(xla_cpu, "_backends_started", lambda: False)
  monkeypatch.setattr(xla_cpu, "_jaxlib_version", lambda: "0.10.2")
  environ = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
  assert xla_cpu.apply_defaults(environ) == [DEFAULT]
  assert environ["XLA_FLAGS"] == f"--xla_backend_optimization_level=0 {DEFAULT}"
  assert xla_cpu.apply_defaults(environ) == []  # idempotent
  empty = {}
  assert xla_cpu.apply_defaults(empty) == [DEFAULT] and empty["XLA_FLAGS"] == DEFAULT
  opted_out = {xla_cpu.OPT_OUT_ENV_VAR: "0"}
  assert xla_cpu.apply_defaults(opted_out) == [] and "XLA_FLAGS" not in opted_out


def test_nothing_is_set_once_a_backend_has_started():
  jax.devices()  # XLA has read XLA_FLAGS: a later change would be silently ignored
  environ = {}
  assert xla_cpu.apply_defaults(environ) == [] and environ == {}


def _fresh_process(code, **env):
  clean = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", xla_cpu.OPT_OUT_ENV_VAR)}
  return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, text=True,
                        capture_output=True, check=True, timeout=120).stdout.strip()


_CONV_HLO = """
import jax, jax.numpy as jnp
from jax import lax
{imports}
import os
conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
hlo = jax.jit(conv).lower(jnp.ones((64, 14, 14, 32)), jnp.ones((3, 3, 32, 64))).compile()
print(os.environ.get("XLA_FLAGS", "") + "|" + str("ynn_fusion" in hlo.as_text()))
"""


def test_importing_the_library_after_jax_but_before_computing_applies_the_option():
  # XLA CPU's default hands this convolution to YNNPACK (a fusion named ynn_fusion); with the
  # library imported first, it stays XLA's own convolution.
  flags, ynn = _fresh_process(_CONV_HLO.format(imports="")).split("|")
  assert (flags, ynn) == ("", "True")
  flags, ynn = _fresh_process(_CONV_HLO.format(imports="import dpkd_jax")).split("|")
  assert (flags, ynn) == (DEFAULT, "False")
  flags, ynn = _fresh_process(_CONV_HLO.format(imports="import dpkd_jax"),
                              DPKD_XLA_CPU_DEFAULTS="0").split("|")
  assert (flags, ynn) == ("", "True")


def test_this_test_process_runs_with_the_option():
  # The suite tests what users run: conftest's compile-speed flags plus the library's option.
  assert DEFAULT in os.environ["XLA_FLAGS"]
  x, w = jnp.ones((64, 14, 14, 32)), jnp.ones((3, 3, 32, 64))
  conv = lambda x, w: lax.conv_general_dilated(  # noqa: E731
      x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  assert "ynn_fusion" not in jax.jit(conv).lower(x, w).compile().as_text()
