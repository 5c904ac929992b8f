"""The DPDFD quickstart notebook: the README's main job (teacher, conversion, summary), then the
run report, other privacy targets and the synthetic samples."""

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

This notebook runs the same function and recipe as the README's Quickstart command
`python -m experiments.dpdfd --config=configs/dpdfd/digits_quickstart.py`
(`quickstart.prepare_teachers`, then `dpdfd.train_dpdfd`, the method's one entry point):
(1) train or reuse a teacher on the embedded `digits` data and convert it at sound ε = 10,
(2) read the run report every run writes, (3) add other privacy targets, (4) look at the
synthetic samples. With `SMALL = True` everything is tiny (a few steps): the pipeline runs, the
student does not learn. Results at scale, with their commands, are in docs/RESULTS.md.
"""),
      ("code", INSTALL),
      ("code", DEVICE),
      ("code", '''
# Configuration: the Quickstart's recipe file (configs/dpdfd/digits_quickstart.py); SMALL
# shrinks it to seconds.
import dataclasses
from configs.dpdfd import digits_quickstart
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import quickstart

RECIPE = digits_quickstart.get_config()  # steps, batch, generator width, student, target ε 10
SMALL_CHANGES = {}
if SMALL:
  TEACHER = teacher_lib.TeacherConfig(dataset="digits", model="lenet5", epochs=1, batch_size=64,
                                      learning_rate=3e-3)
  SMALL_CHANGES = dict(student_model="lenet5_half", steps=12, eval_every=6, batch_size=16,
                       latent_dim=16, generator_channels=16)
  OTHER_TARGETS = []
else:
  TEACHER = teacher_lib.TeacherConfig(dataset="digits", model=quickstart.TEACHER_MODEL,
                                      epochs=digits_quickstart.TEACHER_EPOCHS)
  OTHER_TARGETS = [1.0, 100.0]
# A published seed makes the noise reproducible by anyone (research only). For a release use
# SEED = None: the library then draws a secret seed from OS entropy.
SEED = 0
WORKDIR = os.path.join("notebook_runs", "dpdfd_small" if SMALL else "dpdfd")
config = dataclasses.replace(
    RECIPE, seed=SEED,
    teacher_dirs=(quickstart.default_teacher_dir("digits", TEACHER.model, root=WORKDIR),),
    **SMALL_CHANGES)
print(config)'''),
      ("md", """
## 1. The main job: teacher, conversion, summary

`quickstart.prepare_teachers` reuses the teacher in `teacher_dirs[0]` when its card matches
(else trains it: the teacher is **not** private, it is the model we convert); then
`dpdfd.train_dpdfd` calibrates σ so that the whole run spends at most the target ε under `dpdfd_event` (PLD accountant), charges a privacy ledger
before every release, and writes the student checkpoint, results.json, record.json and
report.md. The summary names where the private diagnostics are (the teacher's accuracy among
them; their values are never printed), and says why when the student is at chance.
"""),
      ("code", '''
RUN_DIR = os.path.join(WORKDIR, "eps10")
quickstart.prepare_teachers(config, teacher_config=TEACHER, progress=False)
results = dpdfd.train_dpdfd(config, RUN_DIR, resume=True, progress=False)
print("\\n".join(quickstart.summary_lines(results, RUN_DIR)))'''),
      ("md", """
## 2. The run report

Every run of every method ends with `<workdir>/report.md` (`dpkd_jax.train.report`): the
learning curves, the sound ε spent over the steps, the sample grid, and the run on the
privacy–utility plot beside the committed records of its dataset (docs/results/). Private
diagnostics appear only in its last section, marked. From the shell:
`python -m experiments.results report --run=<workdir>`.
"""),
      ("code", '''
import re

from IPython.display import Image, Markdown, display


def show_report(run_dir):
  """Displays report.md: its text as Markdown, its images inline."""
  text = []
  for line in open(os.path.join(run_dir, "report.md"), encoding="utf-8").read().splitlines():
    image = re.fullmatch(r"!\\[[^]]*\\]\\(([^)]+)\\)", line.strip())
    if image:
      display(Markdown("\\n".join(text)))
      display(Image(os.path.join(run_dir, image.group(1))))
      text = []
    else:
      text.append(line)
  display(Markdown("\\n".join(text)))


show_report(RUN_DIR)'''),
      ("md", """
## 3. Other privacy targets

The same conversion at other sound targets (skipped with `SMALL`), on one privacy–utility
plot: `dpkd_jax.plotting` reads each run's results.json and, with `trajectories=True`, the
(ε spent, accuracy) of every evaluation from metrics.csv. From the shell:
`python -m experiments.plot --runs <dirs> --out curve.png --trajectories`.
"""),
      ("code", '''
import dataclasses

from dpkd_jax import plotting

run_dirs = [RUN_DIR]
for target in OTHER_TARGETS:
  run_dir = os.path.join(WORKDIR, f"eps{target:g}")
  other = dpdfd.train_dpdfd(dataclasses.replace(config, target_epsilon=target), run_dir,
                            resume=True, progress=False)
  print(f"target eps {target:g}: sound eps {other['epsilon']:.4g}, student accuracy "
        f"{other['test_accuracy']:.4f}")
  run_dirs.append(run_dir)
curve_path = plotting.plot_privacy_utility(
    plotting.load_runs(run_dirs), os.path.join(WORKDIR, "privacy_utility.png"),
    trajectories=True, paper_epsilon=True,
    title="DPDFD on digits" + (" (SMALL config)" if SMALL else ""))
display(Image(curve_path))'''),
      ("md", """
## 4. Synthetic samples

Each run writes `samples.png`, a grid of generator outputs. They are post-processing of the
noisy releases, so they carry the run's ε. A labelled synthetic dataset of any size is released
the same way: `python -m experiments.dpdfd sample --workdir=<run_dir> --num=10000`.
"""),
      ("code", '''
display(Image(os.path.join(RUN_DIR, "samples.png")))'''),
  ]
