"""Recipes of `python -m experiments.dpdfd` (configs/__init__.py).

`BY_DATASET`: the recipe file `--dataset=<name>` runs without `--config` (--help names it);
other datasets start from `DPDFDConfig`'s own defaults.
"""

BY_DATASET = {"digits": "configs/dpdfd/digits_quickstart.py",
              "mnist": "configs/dpdfd/mnist_engine.py",
              "fashion_mnist": "configs/dpdfd/fashion_mnist_engine.py"}
