"""Accelerator readiness without an accelerator: every method's jitted step, and every student
as `experiments.export` serves it, lowered for TPU and CUDA on this CPU-only machine.

`jax.export.export(jitted, platforms=("tpu", "cuda"))(*abstract_args)` traces and lowers to
one StableHLO module for both platforms without a device of either. It also refuses custom
calls outside its stable list and host callbacks, so a CPU-only kernel or a `pure_callback`
that reached a step would fail here. Inputs are `jax.ShapeDtypeStruct`s and states come from
`jax.eval_shape`: no parameter or batch is allocated, so the DPDFD pair is the paper's
CIFAR-10 size (ResNet-34 teacher, 21.3M parameters; ResNet-18 student) at its default B = 256.
Nothing is compiled: compiling needs the target backend (docs/PERFORMANCE.md, "Paper scale on
paper", for the compiled CPU figures).
"""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods import dfpate
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods import rknn
from dpkd_jax.methods import rona
from dpkd_jax.methods import srr
from dpkd_jax.methods.dfpate import step as dfpate_step
from dpkd_jax.methods.dfpate import student as dfpate_student
from dpkd_jax.methods.rknn import votes
from dpkd_jax.methods.rona import sanitize
from dpkd_jax.methods.rona import step as rona_step
from dpkd_jax.methods.srr import stage as srr_stage
from dpkd_jax.methods.srr import step as srr_step
from dpkd_jax.models import core
from dpkd_jax.privacy import aggregation
from dpkd_jax.release import export
from dpkd_jax.release import students
from dpkd_jax.train import sharding

PLATFORMS = ("tpu", "cuda")
MESH = sharding.data_mesh(jax.devices()[:1])  # the steps' 'data' axis on one device
CIFAR10, MNIST = data.DATASETS["cifar10"], data.DATASETS["mnist"]
# Custom-call targets a module may hold for TPU/CUDA: shard_map's sharding markers and
# jax.export's own check of a symbolic dimension (the served batch); no kernel of this library.
ALLOWED_CUSTOM_CALLS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
                        "shape_assertion"}
KEY = jax.eval_shape(lambda: jax.random.key(0))


def lowered(fn, *args) -> jax.export.Exported:
  """`fn` (jitted or not) exported for TPU and CUDA, with the module's checks."""
  jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
  exported = jax.export.export(jitted, platforms=PLATFORMS)(*args)
  text = exported.mlir_module()
  assert exported.platforms == PLATFORMS
  # One module for both: its entry takes the index of the platform it runs on.
  assert re.search(r'@main\(%arg0: tensor<i32> \{jax.global_constant = "_platform_index"\}',
                   text)
  assert "callback" not in text  # no host round trip inside a step
  targets = set(re.findall(r"custom_call @([\w.$]+)", text))
  targets |= set(re.findall(r'call_target_name = "([^"]+)"', text))
  assert targets <= ALLOWED_CUSTOM_CALLS, targets
  return exported


def spec(shape, dtype=jnp.float32) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def abstract_classifier(name: str, info: data.DatasetInfo, norm: str = "batch") -> core.ModelParts:
  """The classifier `name` split into parts whose leaves are shapes only."""
  return core.split(nnx.eval_shape(lambda: models.create_classifier(
      name, num_classes=info.num_classes, input_shape=info.image_shape, norm=norm,
      rngs=nnx.Rngs(0))))


def stacked(tree, n: int = 1):
  """Shapes of n copies stacked on a leading axis (`dpdfd.TeacherEnsemble`'s layout)."""
  return jax.tree.map(lambda x: spec((n, *x.shape), x.dtype), tree)


def test_dpdfd_step_at_cifar10_size_lowers_for_tpu_and_cuda():
  config = dpdfd.DPDFDConfig(dataset="cifar10", teacher_dirs=("unused",), noise_multiplier=1.0,
                             student_model="resnet18")
  teacher = abstract_classifier("resnet34", CIFAR10)
  state = jax.eval_shape(lambda: dpdfd.init_state(config, jax.random.key(0)))
  step = dpdfd.make_train_step(dpdfd.make_plan(config), config, teacher.graphdef)
  args = (state, stacked(teacher.params), stacked(teacher.batch_stats), KEY)
  exported = lowered(step, *args)
  out_state = exported.out_tree.unflatten(exported.out_avals)[0]
  assert jax.tree.map(lambda x: x.shape, out_state) == jax.tree.map(lambda x: x.shape, state)
  # The jit API's own route gives the same two-platform module.
  lower = step.trace(*args).lower(lowering_platforms=PLATFORMS)
  assert "_platform_index" in lower.as_text()


@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_dpsgd_step_lowers_for_tpu_and_cuda(clipping):
  # The CLI's defaults (digits, small_cnn, GroupNorm, expected batch 256) and its padded batch.
  config = dpsgd.DPSGDConfig(dataset="digits", model="small_cnn", noise_multiplier=1.0,
                             steps=10, clipping=clipping)
  plan = dpsgd.make_plan(config, num_examples=1442, num_devices=1)
  state = jax.eval_shape(lambda: dpsgd.init_state(config, jax.random.key(0)))
  rows = plan.max_batch_size
  step = dpsgd.make_train_step(plan, config.info, MESH, clipping=clipping)
  lowered(step, state, spec((rows, *config.info.image_shape), jnp.uint8),
          spec((rows,), jnp.int32), spec((rows,), jnp.bool_), KEY)


def test_srr_stage_steps_lower_for_tpu_and_cuda():
  config = srr.SRRConfig(dataset="mnist", teacher_dir="unused", epsilon=1.0)
  plan = srr.make_plan(config)
  student, generator = jax.eval_shape(lambda: srr.init_models(config, jax.random.key(0)))
  state = jax.eval_shape(lambda: srr.init_state(config, jax.random.key(0), stages=plan.stages))
  teacher = abstract_classifier("small_cnn", MNIST)
  batch, k = config.batch_size, MNIST.num_classes
  images = spec((batch, *MNIST.image_shape))

  def release(params, batch_stats, key, queries, prior):  # the stage's only private step
    labels = lambda x: jnp.argmax(core.apply(teacher.graphdef, params, batch_stats, x,  # noqa
                                             train=False)[0].logits, -1).astype(jnp.int32)
    return srr_stage.private_labels(labels, key, queries, prior,
                                    epsilon=plan.epsilon_per_query, threshold=config.tau)

  lowered(release, teacher.params, teacher.batch_stats, KEY, images, spec((batch, k)))
  student_step = srr_step.make_student_step(config.engine.student_loss, plan.epsilon_per_query,
                                            config.engine.student_shift)
  lowered(student_step, state.student, images, spec((batch,), jnp.int32),
          spec((batch, k), jnp.bool_), KEY)
  lowered(srr_step.make_finetune_step(student.graphdef), state.generator, student.params,
          student.batch_stats, spec((batch, config.latent_dim)), spec((batch,), jnp.int32))


def test_rknn_release_and_student_step_lower_for_tpu_and_cuda():
  config = rknn.RKNNConfig(dataset="mnist")
  plan = rknn.make_plan(config)
  # (N, d) private embeddings of MNIST's training split, d = 64 (the release's cost does not
  # depend on which representation made them), and the round's s public queries.
  embeddings, labels = spec((60000, 64)), spec((60000,), jnp.int32)
  lowered(lambda key, e, y, q: votes.release_counts(plan, key, e, y, q,
                                                    num_classes=MNIST.num_classes,
                                                    chunk_size=config.chunk_size),
          KEY, embeddings, labels, spec((config.num_queries, 64)))
  student = config.student
  state = jax.eval_shape(lambda: rknn.init_state(config, jax.random.key(0), total_steps=100))
  lowered(rknn.build_student_step(student, MNIST), state,
          spec((student.batch_size, *MNIST.image_shape), jnp.uint8),
          spec((student.batch_size,), jnp.int32), KEY)


@pytest.mark.parametrize("kind", ["hint", "distill"])
def test_rona_private_steps_lower_for_tpu_and_cuda(kind):
  config = rona.RONAConfig(dataset="mnist", noise_multiplier=1.0)
  plan = rona.make_plan(config)
  teacher = abstract_classifier(config.teacher_model, MNIST)
  hint = jax.eval_shape(lambda p, s, x: core.apply(teacher.graphdef, p, s, x, train=False)[0],
                        teacher.params, teacher.batch_stats, spec((1, *MNIST.image_shape))).hint
  state = jax.eval_shape(lambda: rona.init_state(config, jax.random.key(0),
                                                 teacher_hint_shape=hint.shape[1:])[0])
  frozen = rona_step.FrozenModel(teacher.params, teacher.batch_stats)
  step = rona.make_train_step(plan, kind, temperature=config.temperature, info=MNIST,
                              teacher_graphdef=teacher.graphdef,
                              aux_graphdef=teacher.graphdef, mesh=MESH)
  rows = config.batch_size
  lowered(step, state, frozen, frozen, jax.eval_shape(sanitize.BoundState.zeros),
          spec((rows, *MNIST.image_shape), jnp.uint8), spec((rows,), jnp.bool_), KEY)


def test_dfpate_votes_and_student_step_lower_for_tpu_and_cuda():
  config = dfpate.DFPATEConfig(dataset="mnist")
  plan = dfpate.make_plan(config)
  ensemble = jax.eval_shape(lambda: teacher_ensemble.init_ensemble(
      config.teacher_model, config.num_teachers, MNIST, jax.random.key(0)))
  queries = spec((config.queries_per_round, *MNIST.image_shape), jnp.uint8)

  def release(params, key, images):  # the round's only private step: votes + noise
    logits = jax.vmap(lambda p: core.apply(ensemble.graphdef, p, {}, data.normalize(
        images, MNIST), train=False)[0].logits)(params)  # (n, Q, K)
    return dfpate_step.release_votes(plan, key, aggregation.vote_histogram(
        logits, votes=config.votes))

  lowered(release, ensemble.params, KEY, queries)
  state = jax.eval_shape(lambda: dfpate.init_state(config, jax.random.key(0)).student)
  batch = config.student_batch_size
  lowered(lambda s, x, t, w, key: dfpate_student.train_step(s, x, t, w, key, info=MNIST,
                                                            target=config.target),
          state, spec((batch, *MNIST.image_shape), jnp.uint8),
          spec((batch, MNIST.num_classes)), spec((batch,)), KEY)


def _student_info(name: str) -> data.DatasetInfo:
  # RONA's compact students and the ScatterNet heads are MNIST-shaped; the rest CIFAR-10.
  return MNIST if name.startswith(("compact", "scatter", "lenet")) else CIFAR10


@pytest.mark.parametrize("name", sorted(students.ARCHITECTURES))
def test_every_exported_student_lowers_for_tpu_and_cuda(name):
  info = _student_info(name)
  constructor, norm = students.ARCHITECTURES[name], "batch"
  if name.startswith("scatter"):  # released as a model of images (`students.reading_images`)
    constructor, norm = students.reading_images(constructor), "group"
  parts = core.split(nnx.eval_shape(lambda: constructor(
      num_classes=info.num_classes, input_shape=info.image_shape, norm=norm,
      rngs=nnx.Rngs(0))))
  batch, = jax.export.symbolic_shape("batch")

  # `export.export_stablehlo`'s function and symbolic batch, the weights as arguments.
  def serve(params, batch_stats, images):
    return export.logits_fn(core.ModelParts(parts.graphdef, params, batch_stats))(images)

  exported = lowered(serve, parts.params, parts.batch_stats,
                     spec((batch, *info.image_shape)))
  assert str(exported.out_avals[0].shape) == f"(batch, {info.num_classes})"
