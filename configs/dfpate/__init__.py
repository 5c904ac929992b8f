"""Recipes of `python -m experiments.dfpate` (configs/__init__.py)."""
