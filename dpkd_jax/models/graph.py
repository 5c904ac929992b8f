"""A classifier given as a graph of operations: an imported teacher of any architecture whose
operations are in `OPS` (`dpkd_jax.importers.graph_torch`, `graph_keras` write the program).

The program is a JSON-able dict, stored beside the teacher's checkpoint and read-only:

  {"format": 1, "layout": "NCHW" | "NHWC",   the layout the operations are written in
   "params": [[shape], ...],                  every weight array (an `nnx.Param` each)
   "norms": [{"channels": C, "eps": e, "affine": bool}, ...],   every BatchNorm (`nnx.BatchNorm`;
                                              "axis": its feature axis, the layout's by default)
   "nodes": [{"name": str, "op": str, "args": [...], "kwargs": {...}}, ...],   in run order
   "output": ref, "features": ref}

An argument is a JSON value (int, float, string, None, list) or a reference: {"v": name} the
output of an earlier node ("input": the classifier's input in `layout`), {"p": i} params[i].
A "batch_norm" node names its norm as {"norm": k}. The operations follow PyTorch's ATen
semantics (`torch.export` programs), whatever framework wrote the program: convolution weights
(O, I / groups, kh, kw), linear weights (out, in).

Why nnx.BatchNorm for the batch norms: the generator losses read the features entering each
BatchNorm through its `promote_dtype` hook (`methods.srr.generator`), as for every zoo model,
and its running statistics land in `batch_stats` like theirs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpkd_jax import errors
from dpkd_jax.models import core

MODEL = "graph"  # the card's and TeacherConfig's model name of a graph teacher
FORMAT = 1
FILE = "graph.json"  # the program, in the teacher's workdir beside checkpoints/


def _spatial(layout: str) -> tuple[int, int]:
  return (2, 3) if layout == "NCHW" else (1, 2)


def _channel(layout: str) -> int:
  return 1 if layout == "NCHW" else -1


def _pairs(value: Any, n: int = 2) -> list[int]:
  value = [value] if isinstance(value, (int, float)) else list(value)
  return [int(v) for v in (value * n if len(value) == 1 else value)]


def conv2d(layout, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
  """ATen conv2d; `padding`: ints, "same", "valid" or [[lo, hi], [lo, hi]] pairs."""
  stride, dilation = _pairs(stride), _pairs(dilation)
  kernel = w.shape[2:]
  if padding == "valid":
    pads = [(0, 0), (0, 0)]
  elif padding == "same":  # PyTorch's: the extra pixel of an odd total goes last
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    pads = [(t // 2, t - t // 2) for t in totals]
  elif isinstance(padding, (list, tuple)) and padding and isinstance(padding[0], (list, tuple)):
    pads = [tuple(p) for p in padding]
  else:
    pads = [(p, p) for p in _pairs(padding)]
  y = jax.lax.conv_general_dilated(x, w, stride, pads, rhs_dilation=dilation,
                                   feature_group_count=int(groups),
                                   dimension_numbers=(layout, "OIHW", layout))
  if b is not None:
    shape = [1, 1, 1, 1]
    shape[_channel(layout)] = -1
    y = y + b.reshape(shape)
  return y


def _pool_pads(size, kernel, stride, padding, dilation, ceil_mode):
  """PyTorch's pooling pads per spatial axis: (pad, pad + the extra of ceil_mode); explicit
  [[lo, hi], [lo, hi]] pairs (Keras' "same") are taken as they are."""
  if padding and isinstance(padding[0], (list, tuple)):
    return [tuple(p) for p in padding]
  pads = []
  for n, k, s, p, d in zip(size, kernel, stride, padding, dilation):
    span = n + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + p:  # the last window must start inside
      out -= 1
    pads.append((p, max(0, (out - 1) * s + d * (k - 1) + 1 - n - p)))
  return pads


def _padding(padding):
  if isinstance(padding, (list, tuple)) and padding and isinstance(padding[0], (list, tuple)):
    return [list(p) for p in padding]
  return _pairs(padding)


def pad2d(layout, x, pads):
  """Zero padding of the spatial axes by [[top, bottom], [left, right]]."""
  return jnp.pad(x, _full_pads(layout, [tuple(p) for p in pads]))


def _window(layout, values):
  full = [1, 1, 1, 1]
  for axis, v in zip(_spatial(layout), values):
    full[axis] = v
  return full


def _full_pads(layout, pads):
  full = [(0, 0)] * 4
  for axis, p in zip(_spatial(layout), pads):
    full[axis] = p
  return full


def max_pool2d(layout, x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False):
  kernel = _pairs(kernel)
  stride = _pairs(stride) if stride else kernel
  padding, dilation = _padding(padding), _pairs(dilation)
  size = [x.shape[a] for a in _spatial(layout)]
  pads = _pool_pads(size, kernel, stride, padding, dilation, ceil_mode)
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, _window(layout, kernel),
                               _window(layout, stride), _full_pads(layout, pads),
                               window_dilation=_window(layout, dilation))


def avg_pool2d(layout, x, kernel, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
  kernel = _pairs(kernel)
  stride = _pairs(stride) if stride else kernel
  padding = _padding(padding)
  size = [x.shape[a] for a in _spatial(layout)]
  pads = _pool_pads(size, kernel, stride, padding, [1, 1], ceil_mode)
  if isinstance(padding[0], (list, tuple)):
    padding, count_include_pad = [0, 0], False  # Keras' "same" counts the input only
  args = (_window(layout, kernel), _window(layout, stride), _full_pads(layout, pads))
  total = jax.lax.reduce_window(x, 0.0, jax.lax.add, *args)
  if divisor_override:
    return total / divisor_override
  # The divisor counts the input and, with count_include_pad, the symmetric pads (never the
  # extra of ceil_mode), as PyTorch does.
  ones_shape = [1, 1, 1, 1]
  for axis, n, p in zip(_spatial(layout), size, padding):
    ones_shape[axis] = n + (2 * p if count_include_pad else 0)
  ones = jnp.ones(ones_shape, x.dtype)
  inner = [(0 if count_include_pad else lo, hi - (p if count_include_pad else 0))
           for (lo, hi), p in zip(pads, padding)]
  count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, args[0], args[1],
                                _full_pads(layout, inner))
  return total / count


def _adaptive_matrix(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) averaging matrix of PyTorch's adaptive pooling along one axis."""
  matrix = np.zeros((n_out, n_in), np.float32)
  for i in range(n_out):
    start, end = (i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)
    matrix[i, start:end] = 1.0 / (end - start)
  return matrix


def adaptive_avg_pool2d(layout, x, output_size):
  sizes = [output_size] * 2 if isinstance(output_size, int) else list(output_size)
  out = [x.shape[a] if o is None else int(o) for a, o in zip(_spatial(layout), sizes)]
  h_axis, w_axis = _spatial(layout)
  mh = jnp.asarray(_adaptive_matrix(x.shape[h_axis], out[0]))
  mw = jnp.asarray(_adaptive_matrix(x.shape[w_axis], out[1]))
  if layout == "NCHW":
    return jnp.einsum("nchw,ih,jw->ncij", x, mh, mw, precision=jax.lax.Precision.HIGHEST)
  return jnp.einsum("nhwc,ih,jw->nijc", x, mh, mw, precision=jax.lax.Precision.HIGHEST)


def group_norm(layout, x, groups, w=None, b=None, eps=1e-5, *unused):
  del unused
  moved = x if layout == "NCHW" else jnp.moveaxis(x, -1, 1)
  shape = moved.shape
  g = moved.reshape(shape[0], int(groups), -1)
  mean, var = g.mean(-1, keepdims=True), g.var(-1, keepdims=True)
  y = ((g - mean) * jax.lax.rsqrt(var + eps)).reshape(shape)
  affine = (1, -1) + (1,) * (len(shape) - 2)
  y = y * (1 if w is None else w.reshape(affine)) + (0 if b is None else b.reshape(affine))
  return y if layout == "NCHW" else jnp.moveaxis(y, 1, -1)


def layer_norm(layout, x, shape, w=None, b=None, eps=1e-5, *unused):
  del layout, unused
  axes = tuple(range(x.ndim - len(shape), x.ndim))
  mean, var = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
  y = (x - mean) * jax.lax.rsqrt(var + eps)
  return y * (1 if w is None else w) + (0 if b is None else b)


def _reshape(x, shape):
  return jnp.reshape(x, [-1 if s is None else s for s in shape])


def _slice(x, dim=0, start=None, end=None, step=1):
  index = [slice(None)] * x.ndim
  index[dim] = slice(start, min(end, x.shape[dim]) if end is not None else None, step)
  return x[tuple(index)]


def _flatten(x, start=0, end=-1):
  end = end % x.ndim
  return jnp.reshape(x, (*x.shape[:start], -1, *x.shape[end + 1:]))


_hardsigmoid = lambda x: jnp.clip(x + 3.0, 0.0, 6.0) / 6.0
_LAYOUT_FREE = {
    "linear": lambda x, w, b=None: (jnp.matmul(x, w.T) + (0 if b is None else b)),
    "addmm": lambda b, x, w, beta=1, alpha=1: beta * b + alpha * jnp.matmul(x, w),
    "mm": jnp.matmul, "t": jnp.transpose,
    "relu": jax.nn.relu, "silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh,
    "gelu": lambda x, approximate="none": jax.nn.gelu(x, approximate=approximate == "tanh"),
    "hardsigmoid": _hardsigmoid, "hardswish": lambda x: x * _hardsigmoid(x),
    "hardtanh": lambda x, low=-1.0, high=1.0: jnp.clip(x, low, high),
    "leaky_relu": lambda x, slope=0.01: jax.nn.leaky_relu(x, slope),
    "softmax": lambda x, dim, *unused: jax.nn.softmax(x, axis=dim),
    "add": lambda a, b, alpha=1: a + alpha * b, "sub": lambda a, b, alpha=1: a - alpha * b,
    "mul": jnp.multiply, "div": jnp.divide,
    "mean": lambda x, dims, keepdim=False, dtype=None: jnp.mean(x, tuple(dims), keepdims=keepdim),
    "cat": lambda xs, dim=0: jnp.concatenate(xs, axis=dim),
    "view": _reshape, "reshape": _reshape, "permute": jnp.transpose,
    "transpose": lambda x, a, b: jnp.swapaxes(x, a, b), "flatten": _flatten, "slice": _slice,
    "unsqueeze": jnp.expand_dims, "squeeze": lambda x, dims=None: jnp.squeeze(
        x, None if dims is None else tuple(d for d in _pairs(dims, 1) if x.shape[d] == 1)),
    "identity": lambda x, *unused, **unused_kw: x,  # clone, dropout in eval, contiguous
    "getitem": lambda x, i: x[i],
    "sym_size": lambda x, dim: x.shape[dim],  # a program exported with a dynamic batch size
}
_WITH_LAYOUT = {"conv2d": conv2d, "max_pool2d": max_pool2d, "avg_pool2d": avg_pool2d,
                "adaptive_avg_pool2d": adaptive_avg_pool2d, "group_norm": group_norm,
                "layer_norm": layer_norm, "pad2d": pad2d}
OPS = frozenset(_LAYOUT_FREE) | frozenset(_WITH_LAYOUT) | {"batch_norm"}


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> dict[str, Any]:
  return json.loads(text)


def dumps(program: dict[str, Any]) -> str:
  """The program's one canonical text (stored, hashed, and the module's static attribute)."""
  return json.dumps(program, sort_keys=True, separators=(",", ":"))


class GraphClassifier(nnx.Module):
  """Runs a program (module docstring) as a classifier of (B, H, W, C) inputs.

  Args:
    program: the program, or its `dumps` text.
    rngs: only for nnx.BatchNorm's constructor; every array is set by the importer.
  """

  def __init__(self, program: dict[str, Any] | str, *, rngs: nnx.Rngs | None = None):
    text = program if isinstance(program, str) else dumps(program)
    program = _parsed(text)
    if program.get("format") != FORMAT:
      raise ValueError(f"graph program format {program.get('format')!r}, expected {FORMAT}")
    self.text = text  # static: part of the graphdef, so two programs never share a trace
    rngs = rngs or nnx.Rngs(0)
    self.arrays = nnx.List([nnx.Param(jnp.zeros(shape, jnp.float32))
                            for shape in program["params"]])
    axis = _channel(program["layout"])
    self.norms = nnx.List([
        nnx.BatchNorm(n["channels"], axis=n.get("axis", axis), epsilon=n["eps"],
                      use_scale=n["affine"], use_bias=n["affine"], use_running_average=True,
                      rngs=rngs)
        for n in program["norms"]])

  def _value(self, arg: Any, values: dict[str, Any]) -> Any:
    if isinstance(arg, dict):
      if "v" in arg:
        return values[arg["v"]]
      return self.arrays[arg["p"]][...]
    if isinstance(arg, list):
      return [self._value(a, values) for a in arg]
    return arg

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    """x: (B, H, W, C) -> logits (B, K), features (B, F): the input of the last linear layer
    (the output when there is none), hint: the same features."""
    program = _parsed(self.text)
    layout = program["layout"]
    values = {"input": jnp.transpose(x, (0, 3, 1, 2)) if layout == "NCHW" else x}
    for node in program["nodes"]:
      op = node["op"]
      if op == "batch_norm":
        out = self.norms[node["norm"]](self._value(node["args"][0], values),
                                       use_running_average=not train)
      else:
        args = [self._value(a, values) for a in node.get("args", [])]
        kwargs = {k: self._value(v, values) for k, v in node.get("kwargs", {}).items()}
        if op in _WITH_LAYOUT:
          out = _WITH_LAYOUT[op](layout, *args, **kwargs)
        else:
          out = _LAYOUT_FREE[op](*args, **kwargs)
      values[node["name"]] = out
    logits = self._value(program["output"], values)
    features = self._value(program["features"], values)
    features = features.reshape(features.shape[0], -1)
    return core.ClassifierOutput(logits, features, features)


def write_program(directory: str, program: dict[str, Any]) -> dict[str, Any]:
  """Writes the program to `directory`/FILE; returns the card's `graph` entry."""
  text = dumps(program)
  with open(os.path.join(directory, FILE), "w", encoding="utf-8") as f:
    f.write(text)
  return {"file": FILE, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
          "nodes": len(program["nodes"]), "batch_norms": len(program["norms"]),
          "operations": sorted({node["op"] for node in program["nodes"]})}


def read_program(workdir: str, card: dict[str, Any], where: str) -> str | None:
  """A graph teacher's program text, checked against the SHA-256 on its card; None for a
  teacher of another model. `where` names the teacher in the one-line errors."""
  if card.get("config", {}).get("model") != MODEL:
    return None
  entry = card.get("graph") or {}
  path = os.path.join(workdir, str(entry.get("file", FILE)))
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as error:
    raise errors.UserError(f"{where} is a graph teacher without its program {path} "
                           f"({error.strerror}); import it again") from error
  if hashlib.sha256(raw).hexdigest() != entry.get("sha256"):
    raise errors.UserError(f"{where}: {path} does not match the SHA-256 on its card; import "
                           "it again")
  return raw.decode("utf-8")
