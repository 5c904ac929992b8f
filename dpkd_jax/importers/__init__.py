"""Bring your own teacher: PyTorch and Keras 3 classifiers converted into the Flax model zoo.

`import_teacher(framework=..., arch=..., checkpoint=..., dataset=..., workdir=...,
input_norm=...)` (CLI: `python -m experiments.teacher import --from=torch ...`) writes a teacher
workdir that `teacher.load_teacher` and every method read like a trained teacher's:

  torch.py   state_dict -> torchvision resnet18/34, vgg11_bn/vgg16_bn, mobilenet_v2 (zoo
             `tv_*`, `models/tv.py`) and the twins of lenet5 / small_cnn
  keras.py   `.keras` file -> the twins of lenet5 / small_cnn
  graph_torch.py, graph_keras.py   `--arch=graph`: any classifier whose operations are covered
             (a torch.export program, a Keras model) -> a `models.graph` program
  twins.py   a twin's layers, in order, onto the zoo model
  common.py  layouts, input normalisation, filling the zoo model with every shape checked
  run.py     `import_teacher`: convert -> adapter -> evaluate -> checkpoint + card

PyTorch and Keras are optional (`pip install 'dpkd-jax[import]'`), imported only when a file of
theirs is read. docs/TEACHERS.md has the commands, architectures and what the card records.
"""

from dpkd_jax.importers.common import INPUT_NORMS
from dpkd_jax.importers.run import FRAMEWORKS, import_teacher

__all__ = ["FRAMEWORKS", "INPUT_NORMS", "import_teacher"]
