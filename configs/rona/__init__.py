"""Recipes of `python -m experiments.rona` (configs/__init__.py)."""
