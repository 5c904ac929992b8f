"""dpkd_jax/kernels: the seam between the model zoo and its opt-in CPU kernels.

The default is the reference (plain jax.lax / Flax) ops; importing the library sets nothing;
the CPU kernels and their XLA option come only from `use_cpu_kernels()` or a CLI on the CPU
backend. The kernels' values are tested against the reference in tests/test_fast_*.py,
test_banded_conv.py and test_upsample_conv.py.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax import kernels
from dpkd_jax.kernels.xla_cpu import flags
from dpkd_jax.models import core, generators, registry

FLAG = "--xla_cpu_experimental_ynn_fusion_type"
DEFAULT = f"{FLAG}=-individual_convolution"


def test_the_reference_ops_are_the_default():
  assert kernels.active() is kernels.REFERENCE
  assert kernels.REFERENCE.conv_general_dilated is jax.lax.conv_general_dilated


def test_using_restores_the_previous_ops_even_after_an_error():
  with pytest.raises(RuntimeError):
    with kernels.using(kernels.xla_cpu_ops()) as ops:
      assert kernels.active() is ops and ops.name == "xla_cpu"
      raise RuntimeError
  assert kernels.active() is kernels.REFERENCE
  with pytest.raises(TypeError, match="kernels.Ops"):
    kernels.use("xla_cpu")


def test_every_ops_field_is_implemented_by_both():
  fields = {f for f in kernels.Ops.__dataclass_fields__ if f != "name"}
  for ops in (kernels.REFERENCE, kernels.xla_cpu_ops()):
    assert all(callable(getattr(ops, f)) for f in fields)


def _logits_fn(parts):
  return lambda v: core.apply(parts.graphdef, parts.params, parts.batch_stats, v,
                              train=False)[0].logits


@pytest.mark.parametrize("name", sorted(registry.CLASSIFIERS))
def test_forward_mode_traces_through_every_classifier_on_the_reference_path(name):
  # jax.jvp needs no custom_vjp on the path: the reference ops are plain JAX. Traced only
  # (eval_shape): a custom_vjp would refuse forward mode while tracing.
  shape = (28, 28, 1) if name in ("lenet5", "scatter_linear", "scatter_cnn") else (32, 32, 3)
  model = nnx.eval_shape(lambda: registry.create_classifier(
      name, num_classes=3, input_shape=shape, norm="group", rngs=nnx.Rngs(0)))
  parts = core.split(model)
  x = jax.ShapeDtypeStruct((2, *shape), jnp.float32)

  def forward_mode(params, batch_stats, v):
    logits = _logits_fn(core.ModelParts(parts.graphdef, params, batch_stats))
    return jax.jvp(logits, (v,), (v,))
  out, tangent = jax.eval_shape(forward_mode, parts.params, parts.batch_stats, x)
  assert out.shape == tangent.shape == (2, 3)


def test_forward_mode_agrees_with_reverse_mode_on_a_classifier():
  model = registry.create_classifier("small_cnn", num_classes=3, input_shape=(8, 8, 1),
                                     norm="group", seed=0)
  logits = _logits_fn(core.split(model))
  x = jax.random.normal(jax.random.key(1), (2, 8, 8, 1))
  v = jax.random.normal(jax.random.key(2), x.shape)
  u = jnp.ones((2, 3))
  # Jitted: eagerly, every op of the model (and of its transposes) compiled on its own.
  forward = jax.jit(lambda x, v: jax.jvp(logits, (x,), (v,))[1])(x, v)
  pulled = jax.jit(lambda x, u: jax.vjp(logits, x)[1](u)[0])(x, u)
  # <u, J v> = <J^T u, v>: forward and reverse mode compute the same Jacobian.
  np.testing.assert_allclose(jnp.vdot(u, forward), jnp.vdot(pulled, v), rtol=1e-4)


def test_forward_mode_runs_through_the_generator_on_the_reference_path():
  parts = core.split(generators.DAFLGenerator(latent_dim=6, image_shape=(8, 8, 3),
                                              rngs=nnx.Rngs(0), base_channels=8))
  z = jnp.ones((2, 6))

  def images(v):
    return core.apply(parts.graphdef, parts.params, parts.batch_stats, v, train=False)[0]
  out, tangent = jax.jit(lambda z: jax.jvp(images, (z,), (z,)))(z)  # one compilation
  assert out.shape == tangent.shape == (2, 8, 8, 3)


def test_flags_to_add_respects_the_users_setting_and_the_jaxlib_version():
  assert flags.flags_to_add("", "0.10.2") == [DEFAULT]
  assert flags.flags_to_add("--xla_backend_optimization_level=0", "0.10.7") == [DEFAULT]
  assert flags.flags_to_add(f"{FLAG}=", "0.10.2") == []  # the user's (empty) value wins
  assert flags.flags_to_add(f"--a=1 {FLAG}=individual_dot", "0.10.2") == []
  # An option an XLA does not know aborts the process: unmeasured versions get nothing.
  assert flags.flags_to_add("", "0.11.0") == []
  assert flags.flags_to_add("", "1.10.0") == []
  assert flags.flags_to_add("", None) == []


def test_apply_defaults_appends_once(monkeypatch):
  monkeypatch.setattr(flags, "_backends_started", lambda: False)
  monkeypatch.setattr(flags, "_jaxlib_version", lambda: "0.10.2")
  environ = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
  assert flags.apply_defaults(environ) == [DEFAULT]
  assert environ["XLA_FLAGS"] == f"--xla_backend_optimization_level=0 {DEFAULT}"
  assert flags.apply_defaults(environ) == []  # idempotent
  empty = {}
  assert flags.apply_defaults(empty) == [DEFAULT] and empty["XLA_FLAGS"] == DEFAULT


def test_nothing_is_set_once_a_backend_has_started():
  jax.devices()  # XLA has read XLA_FLAGS: a later change would be silently ignored
  environ = {}
  assert flags.apply_defaults(environ) == [] and environ == {}


def _fresh_process(code, home):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
  return subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True,
                        check=True, timeout=300).stdout.strip()


_IMPORT_AND_TRACE = """
import os
import jax, jax.numpy as jnp
import dpkd_jax, dpkd_jax.kernels
from dpkd_jax.models import core, registry
model = registry.create_classifier("lenet5", num_classes=3, input_shape=(28, 28, 1), norm="group",
                                   seed=0)
parts = core.split(model)
loss = lambda p: jnp.sum(core.apply(parts.graphdef, p, parts.batch_stats, jnp.ones((2, 28, 28, 1)),
                                    train=True)[0].logits)
jax.jit(jax.grad(loss)).lower(parts.params).compile()
print(repr(os.environ.get("XLA_FLAGS")), dpkd_jax.kernels.active().name)
"""

_OPT_IN = """
import os
from dpkd_jax import kernels
added = kernels.use_cpu_kernels()
import jax, jax.numpy as jnp
from jax import lax
conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
hlo = jax.jit(conv).lower(jnp.ones((64, 14, 14, 32)), jnp.ones((3, 3, 32, 64))).compile()
print(added == [os.environ["XLA_FLAGS"]], kernels.active().name, "ynn_fusion" in hlo.as_text())
"""


def test_import_and_tracing_set_nothing_and_write_no_file(tmp_path):
  home = tmp_path / "home"
  home.mkdir()
  assert _fresh_process(_IMPORT_AND_TRACE, home) == "None reference"
  assert not any(home.rglob("*"))  # no route table, no cache, nothing


def test_the_one_opt_in_call_sets_the_xla_option_and_the_kernels(tmp_path):
  # XLA CPU's default hands this convolution to YNNPACK (a fusion named ynn_fusion); with
  # the option set before the backend starts, it stays XLA's own convolution.
  assert _fresh_process(_OPT_IN, tmp_path) == "True xla_cpu False"


def test_a_command_runs_with_the_cpu_kernels_on_the_cpu_backend_and_gives_them_back():
  from experiments import _cli  # pylint: disable=g-import-not-at-top
  seen = []

  @_cli.entry_point
  def main(argv):
    _cli.Parser(prog="x", cpu_kernels=True).parse_args(argv)
    seen.append(kernels.active().name)

  main([])
  main(["--nocpu_kernels"])
  main(["--cpu_kernels=false"])
  assert seen == ["xla_cpu", "reference", "reference"]
  assert kernels.active() is kernels.REFERENCE
  # Flags parsed outside a running command (a notebook, a test) switch nothing.
  _cli.Parser(prog="x", cpu_kernels=True).parse_args([])
  assert kernels.active() is kernels.REFERENCE


def test_memoized_steps_are_built_per_set_of_ops():
  # A jitted step keeps the trace of the ops it first ran with: a memoized builder must hand
  # each set of ops its own step, or a step built on the reference ops would run them under the
  # CPU kernels too.
  from dpkd_jax.methods import dpsgd  # pylint: disable=g-import-not-at-top
  from dpkd_jax.train import sharding  # pylint: disable=g-import-not-at-top
  config = dpsgd.DPSGDConfig(dataset="digits", model="lenet5_half", noise_multiplier=1.0,
                             steps=1, expected_batch_size=8)
  plan = dpsgd.make_plan(config, num_examples=100, num_devices=1)
  mesh = sharding.data_mesh(jax.devices()[:1])
  reference = dpsgd.make_train_step(plan, config.info, mesh)
  assert dpsgd.make_train_step(plan, config.info, mesh) is reference
  with kernels.using(kernels.xla_cpu_ops()):
    assert dpsgd.make_train_step(plan, config.info, mesh) is not reference
