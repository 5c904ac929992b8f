"""Recipes of `python -m experiments.srr` (configs/__init__.py).

`DEFAULT`: the recipe the CLI runs without `--config` (--help names it), for every dataset:
its flags (`--dataset`, `--teacher_dir`, `--epsilon`, ...) override it.
"""

DEFAULT = "configs/srr/mnist_eps10.py"
# The recipe measured where plain RR at ε keeps under half of the labels (the CLI points to it).
NOISY_LABELS = "configs/srr/mnist_eps1.py"
