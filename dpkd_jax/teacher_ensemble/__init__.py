"""Stacked teacher ensembles: n teachers on disjoint equal shards, trained at once, saved as one.

Shared by the methods that need many disjoint-shard teachers (data-free PATE's vote
histograms, multi-teacher DPDFD's summed rows) so that neither imports the other:

  architectures.py  `TEACHER_MODELS`: mlp and patch_cnn (written for vmap on CPU) + the zoo.
  ensemble.py       `Ensemble` (graphdef + params stacked on a leading axis of size n),
                    `init_ensemble`, `equal_shards`, `train_ensemble` (one vmapped jitted
                    step for all teachers), `ensemble_logits`, `ensemble_accuracy`.
  config.py         `TeacherEnsembleConfig` (validated, frozen) and its `identity()`.
  store.py          a teachers directory: `save`, `read_meta`, `load`, the `partition` record
                    and `overlap` (how many teachers one record reaches, from that record).
  fit.py            `fit` (train + report + meta) and `train_and_save` (the command
                    `python -m experiments.teacher_ensemble`).

Privacy. The teachers are not private: one record may change the teacher of its shard
arbitrarily. Shard i trains teacher i only, so one record reaches at most one teacher; the
saved `partition` record proves it to a later run (`teacher_partition.
ensemble_teachers_per_record`: m = 1, else m = n). Whatever a method releases from the
teachers goes through a mechanism of `dpkd_jax.privacy`.
"""

from dpkd_jax.teacher_ensemble.architectures import TEACHER_MODELS
from dpkd_jax.teacher_ensemble.config import IDENTITY_FIELDS
from dpkd_jax.teacher_ensemble.config import TeacherEnsembleConfig
from dpkd_jax.teacher_ensemble.ensemble import Ensemble
from dpkd_jax.teacher_ensemble.ensemble import ensemble_accuracy
from dpkd_jax.teacher_ensemble.ensemble import ensemble_logits
from dpkd_jax.teacher_ensemble.ensemble import equal_shards
from dpkd_jax.teacher_ensemble.ensemble import init_ensemble
from dpkd_jax.teacher_ensemble.ensemble import train_ensemble
from dpkd_jax.teacher_ensemble.fit import fit
from dpkd_jax.teacher_ensemble.fit import train_and_save
from dpkd_jax.teacher_ensemble.store import load
from dpkd_jax.teacher_ensemble.store import overlap
from dpkd_jax.teacher_ensemble.store import read_meta
from dpkd_jax.teacher_ensemble.store import save

__all__ = [
    "Ensemble",
    "IDENTITY_FIELDS",
    "TEACHER_MODELS",
    "TeacherEnsembleConfig",
    "ensemble_accuracy",
    "ensemble_logits",
    "equal_shards",
    "fit",
    "init_ensemble",
    "load",
    "overlap",
    "read_meta",
    "save",
    "train_and_save",
    "train_ensemble",
]
