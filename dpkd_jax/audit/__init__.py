"""One-run canary audits of whole training runs (Steinke, Nasr, Jagielski, NeurIPS 2023).

`privacy.audit` audits one release of one mechanism (neighbouring inputs, many draws). This
package audits what a user releases after a whole run: m canaries are inserted into the private
training data, each included with probability 1/2 from a recorded key, the method runs once
end to end, every canary is scored from the released classifier only, and
`jax_privacy.auditing.CanaryScoreAuditor` turns the scores into lower bounds on ε at 95%
confidence.

Canaries (`canaries`): mislabelled training records. Canary i is a record (x_i, y_i) of the
private split and a wrong label y'_i drawn per canary; the run trains on (x_i, y'_i) if its
inclusion bit is 1, on (x_i, y_i) if 0: replace-one neighbours of one size, the library's
relation. A model fits a wrong label only by memorising that record, so a non-private teacher
separates the two cases clearly (the audit's power), and a DP run may not separate them by more
than its ε allows.

Modules:
  canaries    the design (indices, wrong labels, inclusion bits from `fold_in` tags of the audit
              key), insertion into a training split, the public view a scorer gets
  scores      each canary's log-odds of its wrong label under the released classifier (student
              weights as exported, or the teacher's for the power reference); DP-SGD's
              white-box last iterate (loss decrease from the public initialisation); DPDFD's
              generator samples (distance to the nearest released sample); threat models
  statistics  `audit_scores` -> `AuditResult`: one-run ε and f-DP lower bounds, AUROC, TPR at
              1% FPR, the bound's ceiling for m canaries
  methods     per method: train function, threat models, the `private_rows` hook that keeps
              canaries in the records the run protects, teachers trained on the canary data
  run         `run_audit`: canary data -> the method's run -> scores -> the `audit` block of the
              run's record, results and model card (one block per threat model)

A lower bound above a sound claim is a privacy defect; a paper-mode run's bound above the
paper's ε is measured evidence against that accounting; a bound of 0 proves nothing by itself
(docs/privacy.md, "Claimed and measured").
"""

from dpkd_jax.audit.canaries import CanaryDesign
from dpkd_jax.audit.canaries import design_canaries
from dpkd_jax.audit.canaries import insert
from dpkd_jax.audit.canaries import public_view
from dpkd_jax.audit.run import run_audit
from dpkd_jax.audit.scores import log_odds
from dpkd_jax.audit.scores import released_scores
from dpkd_jax.audit.statistics import audit_scores
from dpkd_jax.audit.statistics import AuditResult

__all__ = [
    "AuditResult",
    "CanaryDesign",
    "audit_scores",
    "design_canaries",
    "insert",
    "log_odds",
    "public_view",
    "released_scores",
    "run_audit",
]
