"""Recipes of `python -m experiments.rknn` (configs/__init__.py)."""
