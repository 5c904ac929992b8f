"""Data-free PATE (being split into rooms)."""

from dpkd_jax.methods.dfpate.run import DFPATEConfig
from dpkd_jax.methods.dfpate.run import train_dfpate

__all__ = ["DFPATEConfig", "train_dfpate"]
