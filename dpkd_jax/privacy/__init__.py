"""dpkd_jax.privacy: jitted DP mechanisms, dp-accounting events, calibration, ledger, audit.

Every privacy-relevant value of a method crosses exactly one mechanism of this package, and
every ε comes from `accounting.epsilon` over the `DpEvent` of the noise actually executed
(see docs/privacy.md). `paper_accounting` reproduces the papers' own figures, always with a
`PaperAccountingWarning`, never as the default. This package imports only JAX, NumPy, SciPy,
chex, optax and dp_accounting, so it can be used on its own inside any JAX code: `clipped_grad`,
`dpsgd_privatizer` (an optax transform) and `dpdfd_step` are DP-SGD and DPDFD for a user's own
models and loop, each built from a frozen plan (`dpsgd_plan`, `dpdfd_plan`) that a
`PlanAccountant` charges. `__all__` is the public API (each name has an entry with an
example in docs/MECHANISMS.md); the submodules hold more (e.g.
`dpsgd_mechanism.clip_per_example_gradients`, the sensitivities of `query_model_releases`).
"""

from dpkd_jax.privacy.accounting import (
    delta_for_epsilon,
    discrete_laplace_counts_event,
    dpdfd_event,
    dpsgd_event,
    epsilon,
    laplace_counts_event,
    pate_event,
    rona_event,
    rona_num_queries,
    srr_event,
)
from dpkd_jax.privacy.aggregation import (
    NoisyVotes,
    calibrate_noise_std,
    gnmax,
    noisy_histogram,
    vote_histogram,
)
from dpkd_jax.privacy.audit import AuditResult, audit_mechanism
from dpkd_jax.privacy.calibration import (
    CalibrationError,
    calibrate_dpdfd_noise_multiplier,
    calibrate_dpdfd_steps,
    calibrate_noise_multiplier,
    calibrate_steps,
)
from dpkd_jax.privacy.clipped_sums import ClippedGrad, clipped_grad
from dpkd_jax.privacy.counts import (
    collision_report,
    collision_unbiased_counts,
    laplace_counts,
    ldp_flip_bits,
    ldp_unbiased_counts,
)
from dpkd_jax.privacy.dpdfd_update import (
    DPDFDReleasePlan,
    DPDFDStep,
    DPDFDStepState,
    dpdfd_plan,
    dpdfd_step,
    dpdfd_student_loss,
    dpdfd_student_target,
)
from dpkd_jax.privacy.dpsgd_mechanism import (
    DPSGDRelease,
    dpsgd_add_noise,
    dpsgd_clip_and_sum,
    dpsgd_gaussian_mechanism,
)
from dpkd_jax.privacy.dpsgd_optax import SGDPlan, dpsgd_plan, dpsgd_privatizer
from dpkd_jax.privacy.ledger import BudgetExceededError, PrivacyLedger
from dpkd_jax.privacy.plan import Plan, PlanAccountant
from dpkd_jax.privacy.mechanisms import (
    GaussianRelease,
    clip_rows,
    multi_teacher_output_gradients,
    normalize_rows,
    output_gradient_mechanism,
    sanitize,
)
from dpkd_jax.privacy.paper_accounting import (
    PaperAccountingWarning,
    paper_dpdfd_epsilon,
    paper_rona_epsilon,
    paper_srr_label_epsilon,
)
from dpkd_jax.privacy.query_model_releases import (
    noisy_cluster_sums,
    noisy_cluster_variances,
    second_moment_release,
)
# `randomized_response` (the k-ary RR function) is not re-exported here: the name is the
# submodule's, and shadowing it would break `from dpkd_jax.privacy import randomized_response`.
from dpkd_jax.privacy.randomized_response import SelectiveRRResult, selective_randomized_response

__all__ = [
    "audit_mechanism",
    "AuditResult",
    "BudgetExceededError",
    "calibrate_dpdfd_noise_multiplier",
    "calibrate_dpdfd_steps",
    "calibrate_noise_multiplier",
    "calibrate_noise_std",
    "calibrate_steps",
    "CalibrationError",
    "clip_rows",
    "clipped_grad",
    "ClippedGrad",
    "collision_report",
    "collision_unbiased_counts",
    "delta_for_epsilon",
    "discrete_laplace_counts_event",
    "dpdfd_event",
    "dpdfd_plan",
    "dpdfd_step",
    "dpdfd_student_loss",
    "dpdfd_student_target",
    "DPDFDReleasePlan",
    "DPDFDStep",
    "DPDFDStepState",
    "dpsgd_add_noise",
    "dpsgd_clip_and_sum",
    "dpsgd_event",
    "dpsgd_gaussian_mechanism",
    "dpsgd_plan",
    "dpsgd_privatizer",
    "DPSGDRelease",
    "epsilon",
    "GaussianRelease",
    "gnmax",
    "laplace_counts",
    "laplace_counts_event",
    "ldp_flip_bits",
    "ldp_unbiased_counts",
    "multi_teacher_output_gradients",
    "noisy_cluster_sums",
    "noisy_cluster_variances",
    "noisy_histogram",
    "NoisyVotes",
    "normalize_rows",
    "output_gradient_mechanism",
    "paper_dpdfd_epsilon",
    "paper_rona_epsilon",
    "paper_srr_label_epsilon",
    "PaperAccountingWarning",
    "pate_event",
    "Plan",
    "PlanAccountant",
    "PrivacyLedger",
    "rona_event",
    "rona_num_queries",
    "sanitize",
    "second_moment_release",
    "selective_randomized_response",
    "SelectiveRRResult",
    "SGDPlan",
    "srr_event",
    "vote_histogram",
]
