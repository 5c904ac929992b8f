"""A `torch.export` program -> a `models.graph` program: any PyTorch classifier whose operations
are in `ATEN` (`--arch=graph`, docs/TEACHERS.md "Any classifier").

The program is lowered to functional ATen first (`run_decompositions({})`: no in-place ops,
dropout in eval mode becomes a copy, batch norm in eval mode becomes
`_native_batch_norm_legit_no_training`), then every node is mapped one to one. The batch size
the program was exported with is not kept: a reshape that keeps the batch axis gets -1 there.
Operations outside the table are refused with one line naming them all.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from dpkd_jax import errors
from dpkd_jax.importers import common
from dpkd_jax.models import graph

# ATen name (without overload) -> models.graph operation.
ATEN = {
    "conv2d": "conv2d", "linear": "linear", "addmm": "addmm", "mm": "mm", "t": "t",
    "_native_batch_norm_legit_no_training": "batch_norm", "group_norm": "group_norm",
    "layer_norm": "layer_norm",
    "relu": "relu", "silu": "silu", "gelu": "gelu", "hardswish": "hardswish",
    "hardsigmoid": "hardsigmoid", "sigmoid": "sigmoid", "tanh": "tanh", "hardtanh": "hardtanh",
    "leaky_relu": "leaky_relu", "_softmax": "softmax", "softmax": "softmax",
    "max_pool2d": "max_pool2d", "avg_pool2d": "avg_pool2d",
    "adaptive_avg_pool2d": "adaptive_avg_pool2d", "mean": "mean",
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "cat": "cat",
    "view": "view", "_unsafe_view": "view", "reshape": "reshape", "flatten": "flatten",
    "permute": "permute", "transpose": "transpose", "slice": "slice", "unsqueeze": "unsqueeze",
    "squeeze": "squeeze", "clone": "identity", "contiguous": "identity", "alias": "identity",
    "dropout": "identity", "detach": "identity", "sym_size": "sym_size",
}
_RESHAPES = ("view", "reshape")


def _aten_name(node: Any) -> str:
  if node.target is operator.getitem:
    return "getitem"
  name = getattr(node.target, "__name__", str(node.target))  # "conv2d.default"
  return name.split(".")[0]


def _first_line(error: Exception) -> str:
  return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


class _Builder:
  """Walks the lowered graph once, collecting nodes, arrays and batch norms."""

  def __init__(self, program: Any):
    self.tensors = {}  # placeholder name -> (source name, numpy array)
    self.user_inputs = []
    for spec in program.graph_signature.input_specs:
      name = spec.arg.name
      if spec.kind.name == "USER_INPUT":
        self.user_inputs.append(name)
      elif spec.target in program.state_dict:
        self.tensors[name] = (spec.target, program.state_dict[spec.target])
      elif spec.target in program.constants:
        self.tensors[name] = (spec.target, program.constants[spec.target])
    self.params, self.param_index, self.sources = [], {}, {}
    self.norms, self.nodes, self.bn_nodes = [], [], set()
    self.unsupported, self.last_linear_input = [], None

  def _array(self, name: str) -> tuple[str, np.ndarray]:
    import torch  # pylint: disable=import-outside-toplevel
    source, tensor = self.tensors[name]
    return source, tensor.detach().to(torch.float32).cpu().numpy()

  def param(self, name: str) -> dict[str, int]:
    if name not in self.param_index:
      source, value = self._array(name)
      index = self.param_index[name] = len(self.params)
      self.params.append(list(value.shape))
      self.sources[("params", "arrays", index)] = common.source(value, source)
    return {"p": self.param_index[name]}

  def arg(self, value: Any) -> Any:
    fx = type(value).__name__ == "Node"
    if fx and value.name in self.tensors:
      return self.param(value.name)
    if fx:
      return {"v": "input" if value.name in self.user_inputs else value.name}
    if isinstance(value, (list, tuple)):
      return [self.arg(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
      return value
    if type(value).__name__ == "memory_format":
      return None
    raise errors.UserError(f"--checkpoint: an argument of type {type(value).__name__} "
                           f"({value!r}) is not supported by the graph importer")

  def batch_norm(self, node: Any) -> dict[str, Any]:
    x, weight, bias, mean, var, _, eps = node.args[:7]
    k = len(self.norms)
    channels = int(self._array(mean.name)[1].shape[0])
    self.norms.append({"channels": channels, "eps": float(eps), "affine": weight is not None})
    for kind, field, tensor in (("params", "scale", weight), ("params", "bias", bias),
                                ("batch_stats", "mean", mean), ("batch_stats", "var", var)):
      if tensor is not None:
        self.sources[(kind, "norms", k, field)] = common.source(*self._array(tensor.name)[::-1])
    self.bn_nodes.add(node.name)
    return {"name": node.name, "op": "batch_norm", "norm": k, "args": [self.arg(x)]}

  def reshape_args(self, node: Any) -> list[Any]:
    """A static reshape that keeps the batch axis gets None there (any batch size)."""
    x, shape = node.args[0], list(node.args[1])
    before, after = tuple(x.meta["val"].shape), tuple(node.meta["val"].shape)
    if shape and isinstance(shape[0], int) and before and after and before[0] == after[0]:
      shape[0] = None
    return [self.arg(x), self.arg(shape)]

  def add(self, node: Any) -> None:
    name = _aten_name(node)
    if name == "getitem":
      source, index = node.args
      if source.name in self.bn_nodes and index == 0:  # (output, mean, invstd)[0]
        self.nodes.append({"name": node.name, "op": "identity", "args": [self.arg(source)]})
        return
    if name == "_native_batch_norm_legit_no_training":
      self.nodes.append(self.batch_norm(node))
      return
    op = ATEN.get(name, "getitem" if name == "getitem" else None)
    if op is None:
      self.unsupported.append(str(node.target))
      return
    if op in ("linear", "addmm"):
      self.last_linear_input = self.arg(node.args[0 if op == "linear" else 1])
    args = self.reshape_args(node) if op in _RESHAPES else [self.arg(a) for a in node.args]
    kwargs = {k: self.arg(v) for k, v in node.kwargs.items() if k != "memory_format"}
    if op == "identity":
      args, kwargs = args[:1], {}
    self.nodes.append({"name": node.name, "op": op, "args": args, "kwargs": kwargs})


def convert(exported: Any, reference: Any) -> common.Converted:
  """A `torch.export.ExportedProgram` -> `common.Converted` carrying the graph program.

  Raises:
    errors.UserError: the program cannot be lowered, has operations outside `ATEN` (all named),
      or is not a one-input, one-output classifier.
  """
  try:
    lowered = exported.run_decompositions({})
  except Exception as error:  # pylint: disable=broad-except
    raise errors.UserError(f"--checkpoint: the torch.export program cannot be lowered to ATen "
                           f"({_first_line(error)})") from error
  builder = _Builder(lowered)
  if len(builder.user_inputs) != 1:
    raise errors.UserError(f"--checkpoint: the program takes {len(builder.user_inputs)} inputs; "
                           "a classifier of images takes one")
  output = None
  for node in lowered.graph.nodes:
    if node.op == "call_function":
      builder.add(node)
    elif node.op == "output":
      outs = node.args[0]
      output = outs[0] if isinstance(outs, (list, tuple)) else outs
  if builder.unsupported:
    names = sorted(set(builder.unsupported))
    training = any("batch_norm_legit_functional" in n or "native_dropout" in n for n in names)
    raise errors.UserError(
        f"--checkpoint: the graph importer does not cover {len(names)} operation(s) of the "
        f"program: {', '.join(names)} (covered: docs/TEACHERS.md#graph-importer)"
        f"{'; export the model in eval mode (model.eval())' if training else ''}; nothing "
        "written")
  out_ref = builder.arg(output)
  program = {"format": graph.FORMAT, "layout": "NCHW", "params": builder.params,
             "norms": builder.norms, "nodes": builder.nodes, "output": out_ref,
             "features": builder.last_linear_input or out_ref}
  return common.Converted(graph.MODEL, "batch" if builder.norms else "none", builder.sources,
                          reference=reference, program=program,
                          notes=("imported through the graph importer from a torch.export "
                                 "program",))
