"""DP-SGD (Abadi et al. 2016) on the private training split, as jax_privacy / Opacus do it.

The sound baseline of the comparison tables: the student is trained directly on the private
data, with no teacher. Each step: a Poisson sample (every record in independently w.p. q);
per-example gradients, each clipped to L2 norm C over the whole parameter pytree; their sum
plus N(0, z²C²) per coordinate, divided by the expected batch size B = q N (data-independent,
unlike the realised size); an optax update. Padding rows of the fixed-size batch weigh 0; an
oversized sample raises, never truncates; a non-finite per-example gradient becomes zero.

Privacy (docs/privacy.md): T steps are `accounting.dpsgd_event(noise_multiplier=z,
sampling_rate=q, steps=T, relation=...)` (N public, as in Opacus / jax_privacy). The run's
`epsilon` (ledger, budget, `target_epsilon` calibration) is REPLACE-ONE, the relation of every
other method here; `epsilon_add_remove` (Opacus' figure) is reported beside it.
`noise_multiplier=0` trains without noise: allowed, reported as ε = inf (NOT private).

Clipping (`--clipping`): "vmap" (default) takes per-example gradients with `vmap(grad)`, a
(B, num_params) array; "ghost" computes the same clipped sum and norms (to float rounding) by
ghost clipping (`models.ghost.ghost_clipped_sum`: per-layer norms from each layer's input and
output gradient, then one weighted product per layer), without the Gram (ghost-norm) form whose
rounding could let a contribution exceed C. The noise, σ, the event and ε are the same; models
with BatchNorm or layers ghost clipping does not know are refused when the config is built.
The saved config (`DPSGDConfig.to_json`) omits `clipping` at its default "vmap", so workdirs
saved before the flag existed resume; a workdir resumes only with the clipping it ran with.

Features (`--features=scatternet`): the model reads ScatterNet features of the images
(`representations.scatternet`, a fixed transform: no privacy cost), computed once by `run.py`;
optionally standardized per channel with moments released by `privacy.feature_moments`
(`--standardize_noise_multiplier`, composed into the plan's ε and charged once). A validation
hold-out (`--validation_examples`) serves tuning; its accuracy is not covered by ε.

Parameter averaging (`--param_averaging_decay=d`, De et al. 2022): the optimizer state keeps a
bias-corrected EMA of the iterates (`train.averaging.param_averaging`, optionally from
`--param_averaging_start_step`), and the run evaluates, checkpoints and releases it instead of the
last iterate; post-processing, so σ, the events and ε are unchanged. Off (0) by default.

Augmentation multiplicity (`--augmult=V`, De et al. 2022; ScatterNet features, vmap clipping):
each record's gradient is the mean over V views of it (itself and V − 1 copies translated by
shifts drawn from the seed, featurized once by `augmult.augmented_features`), averaged BEFORE
clipping, so a record still contributes one clipped vector: σ, the events and ε are unchanged.
Validation and test read the unshifted images. Off (0) by default.

Rooms, in the order the data flows (flags -> config -> plan -> step -> mechanism -> ledger ->
record):
* `config.py`: `DPSGDConfig`, the user's flags, validated at construction.
* `privacy.py`: `DPSGDPlan` (q, T, M, z, C, the planned replace-one and add/remove ε, the
  budget) and `make_plan`, the one place z is given or calibrated; `plan.event(n)` is what
  the ledger charges for n steps.
* `augmult.py`: the views' shifts (`view_shifts`, data-independent) and their features.
* `step.py`: `build_train_step(plan, ..., clipping=..., augmult=...)` (the clipped sum by one
  call of `dpkd_jax.privacy.clipped_grad`, vmap or ghost, then the single noise draw of
  `dpkd_jax.privacy.dpsgd_mechanism`, with z and C from the plan), `make_train_step` (jitted,
  cached), `init_state(config, key, ...)` / `init_model` / `make_optimizer` (with
  `param_averaging`), `released_parts` (the averaged model, if any).
* `run.py`: `train_dpsgd(config, workdir, *, resume=False)`: workdir, data, plan, state, then
  per expected epoch charge -> releases -> seal -> evaluate -> checkpoint, and the results
  record.
"""

from dpkd_jax.methods.dpsgd.config import DPSGDConfig
from dpkd_jax.methods.dpsgd.privacy import DPSGDPlan
from dpkd_jax.methods.dpsgd.privacy import make_plan
from dpkd_jax.methods.dpsgd.run import train_dpsgd
from dpkd_jax.methods.dpsgd.step import build_train_step
from dpkd_jax.methods.dpsgd.step import init_model
from dpkd_jax.methods.dpsgd.step import init_state
from dpkd_jax.methods.dpsgd.step import make_optimizer
from dpkd_jax.methods.dpsgd.step import make_train_step
from dpkd_jax.train.averaging import param_averaging
from dpkd_jax.methods.dpsgd.step import per_example_gradients
from dpkd_jax.train.averaging import released_parts

__all__ = [
    "DPSGDConfig",
    "DPSGDPlan",
    "build_train_step",
    "init_model",
    "init_state",
    "make_optimizer",
    "make_plan",
    "make_train_step",
    "param_averaging",
    "per_example_gradients",
    "released_parts",
    "train_dpsgd",
]
