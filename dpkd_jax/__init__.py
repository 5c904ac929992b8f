"""dpkd-jax: differentially private knowledge distillation in JAX/Flax."""

__version__ = "0.1.0"
