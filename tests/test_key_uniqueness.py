"""Every random draw of a run has its own key: one tiny run of each method, keys pairwise distinct.

`split(k)[i] == fold_in(k, i)` in JAX 0.10, so a key split into streams and also folded with
small tags hands the same bits to two draws (the DF-PATE query model once noised its k-means
counts with the normals of its "data-independent" centroid re-draws). Here JAX's one source of
random bits, `jax._src.random.core._random_bits` (every sampler and Flax initializer ends
there, jitted or not), is wrapped so that each draw's key data reaches the host through an
unordered `io_callback` (an effect: never merged or dropped by XLA; fires under jit, per
iteration in loops, once per element under vmap via a rolled loop, which keeps compiles short
where `jax.debug.callback` unrolls the batch).
Runs use secret seeds (the default); explicit public seeds may legitimately meet a teacher's
public seed (both public, so nothing secret is shared).

Known, documented reuse, kept out of the collected runs: RONA's auxiliary teacher follows the
teacher's recipe including `teacher_seed` (`rona.teachers.load_or_train_aux_teacher`), so its
init and batch-order keys equal the teacher's: public, data-independent draws of two non-private
models (the RONA run here uses fixed bounds, which need no auxiliary teacher). Loading a teacher
builds its template from `key(0)` (shapes only, values replaced by the checkpoint): each run here
loads each teacher once.
"""

from __future__ import annotations

import collections
import contextlib
import fractions
import functools
import os
import sys

import jax
from jax._src.random import core as random_core
from jax.experimental import io_callback
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import dfpate
from dpkd_jax.methods.dfpate import query_model as dfpate_qm
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods import rknn
from dpkd_jax.methods import rona
from dpkd_jax.methods import srr
from dpkd_jax.privacy import discrete_laplace

_PACKAGE = os.sep + "dpkd_jax" + os.sep


def _site() -> str:
  """dpkd_jax frames of the draw, innermost first (at trace time: a cached trace keeps the
  site of its first tracing, so sites are hints; the key data are exact)."""
  frames, frame = [], sys._getframe(2)  # pylint: disable=protected-access
  while frame is not None:
    if _PACKAGE in frame.f_code.co_filename:
      path = frame.f_code.co_filename.split(_PACKAGE, 1)[1]
      frames.append(f"{path}:{frame.f_code.co_name}:{frame.f_lineno}")
    frame = frame.f_back
  return " < ".join(frames) or "outside dpkd_jax"


class KeyRecorder:
  """While entered, records (key data, site) of every draw of random bits."""

  def __init__(self):
    self.uses: list[tuple[tuple[int, int], str]] = []
    self._original = None

  def _record(self, site: str, key_data) -> None:
    for words in np.asarray(key_data).reshape(-1, 2):
      self.uses.append(((int(words[0]), int(words[1])), site))

  def __enter__(self) -> "KeyRecorder":
    self._original = original = random_core._random_bits  # pylint: disable=protected-access

    @functools.wraps(original)
    def random_bits(key, bit_width, shape):
      sampler = sys._getframe(1).f_code.co_name  # pylint: disable=protected-access
      io_callback(functools.partial(self._record, f"{sampler} @ {_site()}"), None,
                  jax.random.key_data(key))
      return original(key, bit_width, shape)

    jax.clear_caches()  # nothing traced without the wrapper may be reused
    random_core._random_bits = random_bits  # pylint: disable=protected-access
    return self

  def __exit__(self, *exc) -> None:
    jax.effects_barrier()
    random_core._random_bits = self._original  # pylint: disable=protected-access
    jax.clear_caches()  # nor any trace holding it

  @contextlib.contextmanager
  def collect(self):
    """Yields a list that holds, after the block, the uses recorded inside it."""
    start, out = len(self.uses), []
    yield out
    jax.effects_barrier()
    out.extend(self.uses[start:])


def _assert_distinct(uses, minimum: int) -> None:
  assert len(uses) >= minimum, f"only {len(uses)} draws recorded: is the recorder wired?"
  sites = collections.defaultdict(list)
  for words, site in uses:
    sites[words].append(site)
  reused = {words: where for words, where in sites.items() if len(where) > 1}
  assert not reused, "keys drawn from more than once:\n" + "\n".join(
      f"  {words}:\n    " + "\n    ".join(where) for words, where in list(reused.items())[:5])


# The direct mode's (and paper formulas') warnings are tested elsewhere.
pytestmark = pytest.mark.filterwarnings(
    "ignore::dpkd_jax.privacy.paper_accounting.PaperAccountingWarning")


@pytest.fixture(scope="module")
def recorder():
  with KeyRecorder() as rec:
    yield rec


@pytest.fixture(scope="module")
def teacher_run(recorder, tmp_path_factory):
  """(workdir, uses) of one teacher training (reused by DPDFD and SRR)."""
  workdir = str(tmp_path_factory.mktemp("teacher"))
  with recorder.collect() as uses:
    teacher_lib.train_teacher(teacher_lib.TeacherConfig(
        dataset="digits", model="lenet5_half", epochs=1, batch_size=64), workdir, progress=False)
  return workdir, uses


# --------------------------------------------------------------------------- the recorder


def test_recorder_sees_jit_vmap_and_loops_and_catches_split_beside_fold_in(recorder):
  key = jax.random.key(3)
  with recorder.collect() as uses:
    jax.jit(lambda k: jax.random.normal(k, (2,)))(jax.random.fold_in(key, 7))
    jax.vmap(lambda k: jax.random.uniform(k))(jax.random.split(jax.random.fold_in(key, 8), 3))
    jax.lax.fori_loop(0, 2, lambda i, c: c + jax.random.normal(jax.random.fold_in(key, 9 + i)),
                      0.0)
  _assert_distinct(uses, minimum=6)
  with recorder.collect() as uses:
    jax.random.normal(jax.random.split(key)[1])
    jax.random.normal(jax.random.fold_in(key, 1))
  with pytest.raises(AssertionError, match="more than once"):
    _assert_distinct(uses, minimum=2)


def test_discrete_laplace_draws_have_their_own_keys(recorder):
  # Every word of every step of every cell (rejected, discarded or used) has its own key.
  with recorder.collect() as uses:
    jax.jit(lambda k: discrete_laplace.sample(k, (40,), fractions.Fraction(5, 3)))(
        jax.random.key(9))
  _assert_distinct(uses, minimum=2 * 40)


def test_query_model_noise_and_redraws_have_their_own_keys(recorder):
  # Fails with the re-draw key fold_in(key_t, 1) == split(key_t)[1] (the count noise's key).
  images = data.load("digits", "train").images[:200]
  config = dfpate_qm.QueryModelConfig(num_components=4, num_clusters=6,
                                      kmeans_iterations=3)
  with recorder.collect() as uses:
    dfpate_qm.fit_query_model(jax.random.key(0), images, config)
  _assert_distinct(uses, minimum=1 + 1 + 3 * 3 + 1)


# ------------------------------------------------------------------------ one run per method


def test_teacher(teacher_run):
  _assert_distinct(teacher_run[1], minimum=3)


def test_dpdfd(recorder, teacher_run, tmp_path):
  config = dpdfd.DPDFDConfig(
      dataset="digits", teacher_dirs=(teacher_run[0],), student_model="lenet5_half",
      generator_channels=8, noise_multiplier=10.0, steps=2, batch_size=16, eval_every=2,
      latent_dim=8)
  with recorder.collect() as uses:
    dpdfd.train_dpdfd(config, str(tmp_path), progress=False)
  _assert_distinct(uses, minimum=2 * 2 + 1)  # latents + noise per step, the sample grid


def test_dpdfd_disagreement(recorder, teacher_run, tmp_path):
  config = dpdfd.DPDFDConfig(
      dataset="digits", teacher_dirs=(teacher_run[0],), student_model="lenet5_half",
      generator_channels=8, noise_multiplier=10.0, steps=2, batch_size=16, eval_every=2,
      latent_dim=16, bound_method="clip", teacher_loss="logit",
      engine=dpdfd.EngineOptions(generator_objective="disagreement",
                                 class_conditional_weight=1.0))
  with recorder.collect() as uses:
    dpdfd.train_dpdfd(config, str(tmp_path), progress=False)
  # latents, noise, probe directions and the requested classes per step; the sample grid
  _assert_distinct(uses, minimum=4 * 2 + 1)


def test_dpdfd_direct(recorder, tmp_path):
  # Secret seed, so a fresh Poisson sample each run: M = 24 overflowed (a raise, not a
  # truncation) in 6.4% of runs (P(Binomial(1442, 16/1442) > 24) per step, 3 steps); M = 48
  # makes that 6e-11. The padded size does not enter the keys drawn, which is what is tested.
  config = dpdfd.DirectConfig(
      dataset="digits", model="lenet5_half", noise_multiplier=1.0, expected_batch_size=16,
      max_batch_size=48, steps=3, eval_every=3, learning_rate=1e-2)
  with recorder.collect() as uses:
    dpdfd.train_direct(config, str(tmp_path), progress=False)
  _assert_distinct(uses, minimum=3 * 2)  # Poisson batch + noise per step


def test_dpsgd(recorder, tmp_path):
  config = dpsgd.DPSGDConfig(dataset="digits", model="lenet5_half", expected_batch_size=16,
                             noise_multiplier=1.0, steps=3, learning_rate=0.5)
  with recorder.collect() as uses:
    dpsgd.train_dpsgd(config, str(tmp_path), progress=False)
  _assert_distinct(uses, minimum=3 * 2)


def test_srr_pretrain_and_run(recorder, teacher_run, tmp_path):
  config = srr.SRRConfig(
      dataset="digits", teacher_dir=teacher_run[0], epsilon=1.0, student_model="lenet5_half",
      generator_channels=8, latent_dim=8, pretrain_steps=1, pretrain_batch_size=16, stages=2,
      samples_per_stage=16, batch_size=16, student_epochs=1,
      engine=srr.EngineOptions(query_pool=2))
  with recorder.collect() as uses:  # stage 2 draws its queries from a pool (`srr.selection`)
    srr.train_srr(config, str(tmp_path), progress=False)  # pretrains its generator first
  assert os.path.isdir(tmp_path / "generator_pretrain")
  _assert_distinct(uses, minimum=2 + 2 * 2)


def test_rknn(recorder, tmp_path):
  config = rknn.RKNNConfig(
      dataset="digits", num_queries=10, k=1, epsilon=2.0, kmeans_restarts=1,
      kmeans_iterations=2, rounds=2, uncertain_fraction=0.5,
      student=rknn.StudentConfig(model="lenet5_half", epochs=1, batch_size=32))
  with recorder.collect() as uses:
    rknn.train_rknn(config, str(tmp_path), progress=False)
  _assert_distinct(uses, minimum=2 * 2)


def test_rona(recorder, teacher_run, tmp_path):
  # Fixed bounds: the adaptive mode's auxiliary teacher is a teacher training (test_teacher)
  # that reuses the teacher's keys on purpose (module docstring).
  config = rona.RONAConfig(
      noise_multiplier=1.0, dataset="digits", teacher_dir=teacher_run[0], bound_mode="fixed",
      hint_l2_clip_norm=1.0, distill_l2_clip_norm=1.0, student_model="lenet5_half", hint_epochs=1,
      rounds=1, self_learning_epochs=2, distillation_epochs=1, num_query_samples=32,
      batch_size=32, self_learning_batch_size=64, public_fraction=0.2,
      self_learning_augment=True)  # the shifts have their own stream
  with recorder.collect() as uses:
    rona.train_rona(config, str(tmp_path), progress=False, latency_seconds=0.0)
  _assert_distinct(uses, minimum=4)


_DFPATE = dict(dataset="digits", num_teachers=2, teacher_epochs=1, teacher_batch_size=32,
               queries_per_round=8, pool_factor=2, student_model="lenet5_half",
               student_epochs=1, student_batch_size=8, target_epsilon=8.0)


@pytest.mark.parametrize("extra", [
    dict(query_source="procedural", rounds=1),  # procedural pools: slow to compile
    dict(query_source="dp_model", rounds=2, query_model_components=4, query_model_clusters=4,
         teacher_self_training_pool=16, teacher_self_training_epochs=1,
         teacher_pseudo_threshold=0.0),
], ids=["procedural", "dp_model"])
def test_dfpate(recorder, tmp_path, extra):
  config = dfpate.DFPATEConfig(**_DFPATE, **extra)
  with recorder.collect() as uses:
    dfpate.train_dfpate(config, str(tmp_path), progress=False)
  _assert_distinct(uses, minimum=2 * 2)

