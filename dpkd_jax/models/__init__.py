"""The model zoo: Flax nnx classifiers and generators behind a functional core.

Build a model by name, split it once, then use only pure functions:

  model = create_classifier("lenet5", num_classes=10, input_shape=(28, 28, 1), seed=0)
  parts = split(model)
  (logits, features, hint), _ = apply(parts.graphdef, parts.params, parts.batch_stats, x,
                                      train=False)
"""

from dpkd_jax.models.classifiers import (NORMS, VGG, DataLensCNN, LeNet5, LeNet5Half, SmallCNN,
                                         group_count)
from dpkd_jax.models.core import ClassifierOutput, ModelParts, apply, merge, split
from dpkd_jax.models.cost import count_params, flops_per_example
from dpkd_jax.models.adapter import InputAdapter
from dpkd_jax.models.generators import DAFLGenerator
from dpkd_jax.models import graph
from dpkd_jax.models.graph import MODEL as GRAPH, GraphClassifier
from dpkd_jax.models.mobilenet import MobileNet
from dpkd_jax.models.registry import (CLASSIFIERS, GENERATORS, check_generator_identity,
                                      create_classifier, create_data_free_generator,
                                      create_generator, create_student_and_generator,
                                      generator_identity)
from dpkd_jax.models.resnet import ResNet, ResNet18, ResNet34, WideResNet

__all__ = [
    "CLASSIFIERS",
    "GENERATORS",
    "GRAPH",
    "GraphClassifier",
    "InputAdapter",
    "NORMS",
    "VGG",
    "ClassifierOutput",
    "DAFLGenerator",
    "DataLensCNN",
    "LeNet5",
    "LeNet5Half",
    "MobileNet",
    "ModelParts",
    "ResNet",
    "ResNet18",
    "ResNet34",
    "SmallCNN",
    "WideResNet",
    "apply",
    "check_generator_identity",
    "count_params",
    "create_classifier",
    "create_data_free_generator",
    "create_generator",
    "create_student_and_generator",
    "generator_identity",
    "flops_per_example",
    "group_count",
    "merge",
    "split",
]
