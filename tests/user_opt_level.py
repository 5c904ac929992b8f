"""`jit`: jax.jit at XLA's default backend optimisation level, for the exact samplers' tests.

tests/conftest.py compiles the suite at LLVM -O0 because compiling is most of its time. The
exact integer samplers are the exception: their rejection loops run one `lax.while_loop` over
tens of thousands of lanes for many iterations, and at -O0 that loop runs 20-40x slower (40,000
discrete-Gaussian draws: 4 s to compile, 40 s to run; at level 2: 4 s and 1.5 s). Compiling
them at level 2, the level users get, changes how fast the loop runs, not what it computes: the
draws are integers from integer arithmetic, equal at every level.
"""

import jax

USER_OPTIMIZATION_LEVEL = {"xla_backend_optimization_level": 2}


def jit(fun, **kwargs):
  """jax.jit(fun, **kwargs), compiled at the default backend optimisation level."""
  return jax.jit(fun, compiler_options=USER_OPTIMIZATION_LEVEL, **kwargs)
