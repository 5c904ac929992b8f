"""The DPDFD quickstart notebook: teacher, conversion, privacy–utility curve, sample grid."""

from nb_common import DEVICE
from nb_common import INSTALL


def dpdfd_quickstart() -> list[tuple[str, str]]:
  return [
      ("md", """
# DPDFD quickstart: convert a teacher into a differentially private student

DPDFD (Liu et al., IJCAI 2023) distils a sensitive teacher into a student without touching the
private data: a generator makes synthetic queries, and the only teacher-side quantity that
leaves is the per-sample output gradient, normalized to norm C and noised
(`privacy.output_gradient_mechanism`). Every ε printed here is the **sound** figure from
`dp_accounting` (sensitivity 2C√B per step, see docs/privacy.md); the paper's formula is shown
beside it and is **not** a guarantee.

Steps: (1) train or load a teacher on the embedded `digits` data, (2) convert it at one or more
privacy targets, (3) plot the privacy–utility curve, (4) look at the synthetic samples.
With `SMALL = True` everything is tiny (a few steps): the pipeline runs, the student does not
learn much. Results at scale, with their commands, are in docs/RESULTS.md.
"""),
      ("code", INSTALL),
      ("code", DEVICE),
      ("code", '''
# Configuration. SMALL: one teacher epoch and 12 DPDFD steps; otherwise the README's digits
# teacher and the docs/RESULTS.md digits schedule (600 steps) at three privacy targets.
if SMALL:
  TEACHER = dict(model="lenet5", epochs=1, batch_size=64, learning_rate=3e-3)
  DPDFD = dict(student_model="lenet5_half", steps=12, eval_every=6, batch_size=16,
               latent_dim=16, generator_channels=16)
  TARGET_EPSILONS = [10.0]
else:
  TEACHER = dict(model="small_cnn", epochs=30)
  DPDFD = dict(student_model="lenet5", steps=600, eval_every=100, batch_size=64,
               generator_channels=64)
  TARGET_EPSILONS = [1.0, 10.0, 100.0]
DELTA = 1e-5
# A published seed makes the noise reproducible by anyone (research only). For a release use
# SEED = None: the library then draws a secret seed from OS entropy.
SEED = 0
WORKDIR = os.path.join("notebook_runs", "dpdfd_small" if SMALL else "dpdfd")'''),
      ("md", "## 1. The teacher (non-private: it is the model we convert)"),
      ("code", '''
from dpkd_jax import teacher as teacher_lib

teacher_dir = os.path.join(WORKDIR, "teacher")
if os.path.exists(os.path.join(teacher_dir, "card.json")):  # trained before: load it
  card = teacher_lib.load_teacher(teacher_dir, dataset="digits").card
else:
  teacher_config = teacher_lib.TeacherConfig(dataset="digits", **TEACHER)
  card = teacher_lib.train_teacher(teacher_config, teacher_dir, progress=False)
print(f"teacher {card['model']}: test accuracy {card['test_accuracy']:.4f}, "
      f"{card['param_count']:,} parameters")'''),
      ("md", """
## 2. Convert it with DPDFD

For each target ε, σ is calibrated so that the whole run (T steps of B rows) spends at most
that ε under `dpdfd_event` (`SelfComposedDpEvent(GaussianDpEvent(σ/(2√B)), T)`). The RDP
accountant calibrates in milliseconds and is slightly conservative; the run then reports the
tighter PLD ε of the σ it executed. (`DPDFDConfig(target_epsilon=...)` calibrates with PLD
itself, which takes a few seconds more.) A privacy ledger records every release before it
happens.
"""),
      ("code", '''
from dpkd_jax import privacy
from dpkd_jax.methods import dpdfd

run_dirs = []
for target in TARGET_EPSILONS:
  sigma = privacy.calibrate_dpdfd_noise_multiplier(
      target_epsilon=target, delta=DELTA, batch_size=DPDFD["batch_size"], steps=DPDFD["steps"],
      accountant="rdp")
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=(teacher_dir,), noise_multiplier=sigma,
                             delta=DELTA, seed=SEED, **DPDFD)
  run_dir = os.path.join(WORKDIR, f"eps{target:g}")
  results = dpdfd.train_dpdfd(config, run_dir, progress=False)
  run_dirs.append(run_dir)
  print(f"target eps {target:g}: sigma {results['noise_multiplier']:.2f}, "
        f"sound eps {results['epsilon']:.3f} (delta {DELTA:g}), paper-formula eps "
        f"{results['paper_epsilon']:.3g} (NOT a guarantee), student accuracy "
        f"{results['test_accuracy']:.4f} after {results['steps']} steps")'''),
      ("md", """
## 3. Privacy–utility curve

`dpkd_jax.plotting` reads each run's `results.json` (one point per run: final accuracy at the
sound ε) and, with `trajectories=True`, the (ε spent, accuracy) of every evaluation from
`metrics.csv`. The same plot from the shell: `python -m experiments.plot --runs <dirs> --out
curve.png --trajectories`.
"""),
      ("code", '''
from IPython.display import Image, display

from dpkd_jax import plotting

runs = plotting.load_runs(run_dirs)
curve_path = plotting.plot_privacy_utility(
    runs, os.path.join(WORKDIR, "privacy_utility.png"), trajectories=True, paper_epsilon=True,
    title="DPDFD on digits" + (" (SMALL config)" if SMALL else ""))
for run in runs:
  print(run.label, [(round(e, 3), a) for e, a in run.trajectory])
display(Image(curve_path))'''),
      ("md", """
## 4. Synthetic samples

Each run writes `samples.png`, a grid of generator outputs. They are post-processing of the
noisy releases, so they carry the run's ε. A labelled synthetic dataset of any size is released
the same way: `python -m experiments.dpdfd sample --workdir=<run_dir> --num=10000`.
"""),
      ("code", '''
display(Image(os.path.join(run_dirs[-1], "samples.png")))'''),
  ]
