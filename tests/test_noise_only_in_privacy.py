"""Every random draw on private data is made inside `dpkd_jax.privacy`.

An AST scan of every module under dpkd_jax/ outside dpkd_jax/privacy/ finds each reference to
a `jax.random` sampler (however imported: `jax.random.normal`, `from jax import random`,
`import jax.random as jr`, `from jax.random import normal`) and fails unless the site is in
`ALLOWED`, keyed by (module, enclosing function, sampler), with the reason the draw is public
randomness (it is not a release of private data, so it needs no sensitivity or event). A new
draw on private data belongs in a mechanism of `dpkd_jax.privacy` with its sensitivity; a new
public draw needs an entry here saying why it is public. Stale entries fail too.
"""

from __future__ import annotations

import ast
import pathlib

import jax.random

_ROOT = pathlib.Path(__file__).resolve().parent.parent / "dpkd_jax"
# Key management, not draws. Every other public name of jax.random is a sampler.
_NOT_DRAWS = {"PRNGKey", "clone", "fold_in", "key", "key_data", "key_dtype", "key_impl",
              "split", "wrap_key_data", "random_gamma_p"}
DRAWS = frozenset(n for n in dir(jax.random) if not n.startswith("_")) - _NOT_DRAWS

_LATENT = "generator latent z ~ N(0, I): the generator's input, independent of the data"
_PROCEDURAL = "procedural query image: drawn from a fixed public program, no data involved"
_AUGMENT = "data augmentation of a training batch: its output is not released"
_REPLAY = ("which released (x, y_s) rows the student re-reads: drawn independently of the data, "
           "with weights from released targets only (post-processing, dpdfd/replay.py)")
_CANARY = ("canary design of an audit (dpkd_jax/audit): drawn from the audit key, from N, K and "
           "the chosen records' labels only; it makes the training data the run then protects")
ALLOWED: dict[tuple[str, str, str], str] = {
    # --- generator latents
    ("train/samples.py", "generate", "normal"): _LATENT + " (evaluation / sample grids)",
    ("methods/dpdfd/step.py", "build_train_step.train_step", "normal"): _LATENT,
    ("methods/dpdfd/step.py", "build_train_step.train_step", "randint"): (
        "the class a class-conditional generator is asked for: part of its latent input, "
        "uniform and independent of the data"),
    ("methods/dpdfd/probes.py", "unit_directions", "normal"): (
        "probe directions of the disagreement generator: uniform on the unit sphere, drawn "
        "independently of the data; the probes' teacher rows go through A_{C,σ} in privacy/"),
    ("methods/srr/run.py", "_save_grid", "normal"): _LATENT + " (sample grid)",
    ("methods/srr/step.py", "build_pretrain_step.step", "normal"): _LATENT,
    ("methods/srr/stage.py", "run_stage", "normal"): (
        _LATENT + "; the teacher's labels of the images it makes go through SRR in privacy/"),
    ("methods/srr/selection.py", "balanced_subset", "permutation"): (
        "which of the drawn latents a stage asks about: random orders chosen from the student's "
        "predictions (earlier releases), independently of the teacher and its data"),
    # --- procedural query images (data-free PATE's public queries)
    ("data/procedural.py", "_stroke_points", "uniform"): _PROCEDURAL,
    ("data/procedural.py", "_stroke_points", "bernoulli"): _PROCEDURAL,
    ("data/procedural.py", "_smooth_texture", "normal"): _PROCEDURAL,
    ("data/procedural.py", "render_image", "uniform"): _PROCEDURAL,
    ("data/procedural.py", "render_image", "randint"): _PROCEDURAL,
    ("data/procedural.py", "render_image", "bernoulli"): _PROCEDURAL,
    ("data/procedural.py", "render_image", "normal"): _PROCEDURAL + " (pixel noise)",
    # --- augmentation (teacher, student and SimCLR training batches)
    ("representations/augment.py", "_affine_one", "uniform"): (
        _AUGMENT + " (SimCLR views of public images; rknn student on public images)"),
    ("representations/augment.py", "random_photometric.one_image", "normal"): (
        _AUGMENT + " (SimCLR views of public images)"),
    ("data/pipeline.py", "random_translate", "randint"): (
        _AUGMENT + " (DF-PATE teachers, which are not private, and the student on released "
        "queries)"),
    # --- sampling and shuffles: which rows, not what is released
    ("data/pipeline.py", "<module>", "bernoulli"): (
        "Poisson sampling of DP-SGD's batches (`poisson_batch`): data-independent, and "
        "the sampling rate q is part of the analysed event (`dpsgd_event`'s PoissonSampled)"),
    ("data/pipeline.py", "<module>", "permutation"): (
        "epoch shuffles of a training set (`epoch_batches`): data-independent orders"),
    ("representations/spectral.py", "fit", "randint"): (
        "the eigen-solver's seed for the PUBLIC images' graph (no data involved)"),
    ("representations/simclr.py", "_make_train_step.train_step", "choice"): (
        "SimCLR batch indices over PUBLIC images (module docstring: public images only)"),
    ("teacher_ensemble/ensemble.py", "train_ensemble", "permutation"): (
        "teachers' epoch shuffles: data-independent orders; the teachers are not private (the "
        "vote aggregation in privacy/aggregation.py is the release)"),
    ("methods/dfpate/student.py", "train_student", "permutation"): (
        "student epoch shuffles over queries and labels already released (post-processing)"),
    ("methods/rona/run.py", "_query_batches", "permutation"): "order of PUBLIC query samples",
    ("methods/dpdfd/replay.py", "_sample_ring", "randint"): _REPLAY,
    ("methods/dpdfd/replay.py", "_sample_ring", "uniform"): _REPLAY + " (class-balanced)",
    ("methods/dpdfd/replay.py", "_sample_per_class", "uniform"): _REPLAY + " (the class)",
    ("methods/dpdfd/replay.py", "_sample_per_class", "randint"): _REPLAY + " (the row)",
    ("methods/rona/run.py", "_private_epoch", "permutation"): (
        "hint epochs' random PUBLIC query samples (RONA's public split)"),
    ("methods/rknn/votes.py", "kmeans_plus_plus_init", "randint"): (
        "k-means++ on the PUBLIC embeddings (rknn's queries are public: module docstring)"),
    ("methods/rknn/votes.py", "kmeans_plus_plus_init.add_centre", "categorical"): (
        "k-means++ D^2 sampling on the PUBLIC embeddings"),
    ("methods/rona/query_selection.py", "_k_center", "randint"): (
        "first centre, uniform over the candidate queries (no data involved)"),
    ("methods/rona/query_selection.py", "random_selection", "choice"): (
        "uniform selection of candidate queries (baseline), no data involved"),
    # --- one-run audits: the auditor's design of its experiment, not a release
    ("audit/canaries.py", "design_canaries", "permutation"): _CANARY + " (which records)",
    ("audit/canaries.py", "design_canaries", "randint"): _CANARY + " (the wrong labels)",
    ("audit/canaries.py", "design_canaries", "bernoulli"): _CANARY + " (the inclusion bits)",
    # --- DF-PATE query model: post-processing of its DP releases (privacy/query_model_releases)
    ("methods/dfpate/query_model.py", "fit_query_model.draw", "normal"): (
        "centroid init / re-draw from the released Gaussian fit (post-processing)"),
    ("methods/dfpate/query_model.py", "sample_queries", "choice"): (
        "cluster of a query, by the released noisy counts (post-processing)"),
    ("methods/dfpate/query_model.py", "sample_queries", "normal"): (
        "query drawn from the released mixture (post-processing)"),
}


def _sampler(node: ast.AST, aliases: dict[str, str]) -> str | None:
  """The jax.random sampler `node` refers to, or None. `aliases`: local name -> dotted path."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name) or node.id not in aliases:
    return None
  dotted = ".".join([aliases[node.id]] + parts[::-1])
  module, _, name = dotted.rpartition(".")
  return name if module == "jax.random" and name in DRAWS else None


def _aliases(tree: ast.Module) -> dict[str, str]:
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name == "jax" or a.name.startswith("jax."):
          # `import jax.random` binds `jax`; `import jax.random as jr` binds jr = jax.random.
          aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "jax"
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "jax":
      for a in node.names:
        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
  return aliases


def scan(source: str) -> set[tuple[str, str]]:
  """{(enclosing function qualname or "<module>", sampler)} of every sampler referenced."""
  tree = ast.parse(source)
  aliases, found = _aliases(tree), set()

  def visit(node: ast.AST, scope: list[str]) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      scope = scope + [node.name]
    if isinstance(node, (ast.Attribute, ast.Name)):
      name = _sampler(node, aliases)
      if name is not None:
        found.add((".".join(scope) or "<module>", name))
        return  # the inner Attribute/Name of the same reference must not count again
    for child in ast.iter_child_nodes(node):
      visit(child, scope)

  visit(tree, [])
  return found


def _sites() -> set[tuple[str, str, str]]:
  sites = set()
  for path in sorted(_ROOT.rglob("*.py")):
    relative = path.relative_to(_ROOT).as_posix()
    if relative.startswith("privacy/"):
      continue
    sites |= {(relative, scope, name) for scope, name in scan(path.read_text("utf-8"))}
  return sites


def test_the_scanner_sees_every_import_style():
  source = """
import jax
import jax.random as jr
from jax import random
from jax import random as rnd
from jax.random import laplace, gumbel as g
def f(k):
  a = jax.random.normal(k, ())
  b = jr.bernoulli(k)
  def inner():
    return random.exponential(k) + rnd.truncated_normal(k, 0, 1)
  return laplace(k) + g(k) + jax.random.split(k)[0] + jax.numpy.ones(())
sampler = jax.random.categorical
"""
  assert scan(source) == {("f", "normal"), ("f", "bernoulli"), ("f.inner", "exponential"),
                          ("f.inner", "truncated_normal"), ("f", "laplace"), ("f", "gumbel"),
                          ("<module>", "categorical")}


def test_noise_distributions_are_scanned():
  assert {"normal", "laplace", "bernoulli", "gumbel", "exponential", "truncated_normal",
          "categorical", "uniform", "choice", "permutation"} <= DRAWS


def test_no_random_draw_outside_privacy_except_the_allowed_public_ones():
  unexplained = sorted(_sites() - set(ALLOWED))
  assert not unexplained, (
      "random draws outside dpkd_jax/privacy/ without a reason (move a draw on private data "
      "into a mechanism of dpkd_jax.privacy; add a public one to ALLOWED with why): "
      f"{unexplained}")


def test_every_allowed_site_still_exists_and_has_a_reason():
  stale = sorted(set(ALLOWED) - _sites())
  assert not stale, f"ALLOWED entries that no longer match a draw (remove them): {stale}"
  assert all(reason.strip() for reason in ALLOWED.values())
