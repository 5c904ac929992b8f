"""Recipes of `python -m experiments.dpsgd` (configs/__init__.py)."""
