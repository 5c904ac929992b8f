"""Tests for dpkd_jax.privacy.seeds: secret-by-default 64-bit root seeds and `root_key`."""

import ast
import dataclasses
import os

import jax
import numpy as np
import pytest

from dpkd_jax.privacy import seeds

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.join(_REPO, "dpkd_jax")


def test_none_draws_fresh_secret_seeds():
  drawn = [seeds.resolve_seed(None) for _ in range(4)]
  assert all(s.secret for s in drawn)
  assert len({s.value for s in drawn}) == 4  # 64-bit draws: a collision means no entropy
  assert all(0 <= s.value < 2**64 for s in drawn)
  assert all(str(s.value) not in str(s.public_description()) for s in drawn)


def test_secret_seeds_use_all_64_bits():
  # 62 bits before: the top two bits were always 0. 64 draws all < 2**62: chance 2**-128.
  drawn = [seeds.resolve_seed(None).value for _ in range(64)]
  assert max(drawn) >= 2**62 and seeds.SEED_BITS == 64


def test_explicit_seed_is_kept_and_public():
  resolved = seeds.resolve_seed(7)
  assert resolved == seeds.ResolvedSeed(7, False)
  assert resolved.public_description() == 7
  assert seeds.resolve_seed(2**64 - 1).value == 2**64 - 1


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, 2**64, 2**70])
def test_bad_seed_raises(bad):
  with pytest.raises(ValueError, match="seed"):
    seeds.resolve_seed(bad)
  if not isinstance(bad, (str, float)):
    with pytest.raises(ValueError, match="seed"):
      seeds.root_key(bad)


@pytest.mark.parametrize("value", [0, 1, 5, 12345, 2**31 - 1, 2**31, 2**32 - 1])
def test_root_key_equals_jax_key_below_2_to_32(value):
  # Every explicit --seed of an earlier run (all < 2**32) keeps its exact key, hence noise.
  ours = seeds.root_key(seeds.resolve_seed(value))
  np.testing.assert_array_equal(jax.random.key_data(ours),
                                jax.random.key_data(jax.random.key(value)))
  np.testing.assert_array_equal(jax.random.normal(ours, (4,)),
                                jax.random.normal(jax.random.key(value), (4,)))
  assert seeds.root_key(value).dtype == jax.random.key(value).dtype


def test_high_bits_change_the_noise():
  # jax.random.key keeps only the low 32 bits without x64: key(2**40 + 5) == key(5).
  low = seeds.root_key(5)
  for high in (2**32 + 5, 2**40 + 5, 2**63 + 5):
    key = seeds.root_key(high)
    assert not np.array_equal(jax.random.key_data(key), jax.random.key_data(low))
    assert not np.array_equal(jax.random.normal(key, (8,)), jax.random.normal(low, (8,)))
  words = jax.random.key_data(seeds.root_key(2**63 + 2**32 * 7 + 9))
  np.testing.assert_array_equal(words, [2**31 + 7, 9])


def test_root_key_is_traceable_once_built():
  key = seeds.root_key(seeds.ResolvedSeed(2**50 + 3, True))
  out = jax.jit(lambda k: jax.random.normal(jax.random.fold_in(k, 1), (2,)))(key)
  assert out.shape == (2,)


def _imports(path: str) -> list[str]:
  tree = ast.parse(open(path).read(), path)
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names.append(node.module)
      names += [f"{node.module}.{alias.name}" for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      names.append("." * node.level + (node.module or ""))
  return names


def test_privacy_package_imports_nothing_else_of_dpkd_jax():
  # The package docstring promises a stand-alone package (JAX, NumPy, SciPy, chex, dp_accounting).
  folder = os.path.join(_PACKAGE, "privacy")
  offending = []
  for name in sorted(os.listdir(folder)):
    if name.endswith(".py"):
      for imported in _imports(os.path.join(folder, name)):
        outside = (imported == "dpkd_jax" or imported.startswith("dpkd_jax.")) and not (
            imported == "dpkd_jax.privacy" or imported.startswith("dpkd_jax.privacy."))
        if outside or imported.startswith(".."):
          offending.append(f"{name}: {imported}")
  assert not offending, offending


def test_every_seeded_key_goes_through_root_key():
  # `jax.random.key(seed)` truncates a seed to 32 bits; only literal template keys (shapes
  # only, values from a checkpoint) and the models registry's public init seed may use it.
  allowed = {os.path.join("models", "registry.py")}
  offending = []
  for root, _, files in os.walk(_PACKAGE):
    for name in files:
      path = os.path.join(root, name)
      if not name.endswith(".py") or os.path.relpath(path, _PACKAGE) in allowed:
        continue
      for node in ast.walk(ast.parse(open(path).read(), path)):
        if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("jax.random.key",
                                                                      "jax.random.PRNGKey")
            and not all(isinstance(arg, ast.Constant) for arg in node.args)):
          offending.append(f"{os.path.relpath(path, _PACKAGE)}:{node.lineno}")
  assert not offending, offending


def test_runs_whose_seeds_differ_only_in_high_bits_draw_different_noise(tmp_path):
  # Before root_key, seed 2**40 + 5 ran with key(5): the same noise as --seed=5.
  from dpkd_jax.methods import dpsgd  # pylint: disable=g-import-not-at-top
  config = dpsgd.DPSGDConfig(dataset="digits", model="lenet5_half", expected_batch_size=16,
                             noise_multiplier=1.0, steps=1, learning_rate=0.5, seed=5)
  low = dpsgd.train_dpsgd(config, str(tmp_path / "low"), progress=False)
  high = dpsgd.train_dpsgd(dataclasses.replace(config, seed=2**40 + 5), str(tmp_path / "high"),
                           progress=False)
  assert low["test_loss"] != high["test_loss"]
