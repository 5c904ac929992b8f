"""dpkd-jax: differentially private knowledge distillation in JAX/Flax.

Importing the package has no side effects: it sets no environment variable and writes no file
(the opt-in CPU kernels: `dpkd_jax.kernels`).
"""

__version__ = "0.1.0"
