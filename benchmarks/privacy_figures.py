"""Prints every privacy figure quoted in docs/privacy.md.

Run from the repository root:

  PYTHONPATH=. python benchmarks/privacy_figures.py

Sections: (1) one DPDFD step, sound vs paper; (2) DPDFD over T steps;
(3) DPDFD calibration; (4) SRR record-level vs per-query; (5) RONA;
(6) reverse k-NN local reports; (7) the RR count trap; (8) the default evaluation (closed
form, exact lattice or self-refining grid) against fixed PLD grids; (9) DP-SGD under both
neighbouring relations.
"""

import time
import warnings

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import paper_accounting

DELTA = 1e-5


def _paper(fn, **kwargs) -> float:
  # The warning is the point of paper_*; here we tabulate them on purpose.
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    return fn(**kwargs)


def dpdfd_one_step() -> None:
  print("## 1. One DPDFD step, B = 256, sigma = 100, delta = 1e-5")
  event = accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256,
                                 steps=1)
  print(f"event: {event}")
  print(f"sound eps (PLD): {accounting.epsilon(event, delta=DELTA):.4f}")
  print("sound eps (RDP): "
        f"{accounting.epsilon(event, delta=DELTA, accountant='rdp'):.4f}")
  for bound in (1.0, 1e-4):
    paper = _paper(paper_accounting.paper_dpdfd_epsilon, noise_multiplier=100.0,
                   l2_clip_norm=bound, steps=1, delta=DELTA)
    print(f"paper eps (Theorem 3 reconstruction, C = {bound:g}): {paper:.3g}")
  print()


def dpdfd_steps() -> None:
  print("## 2. DPDFD over T steps, B = 256, sigma = 100, delta = 1e-5")
  print("| T | sound eps (PLD) | sound eps (RDP) | paper eps (C = 1) |")
  print("|---|---|---|---|")
  for steps in (1, 10, 100, 1000):
    event = accounting.dpdfd_event(noise_multiplier=100.0, batch_size=256,
                                   steps=steps)
    pld = accounting.epsilon(event, delta=DELTA)
    rdp = accounting.epsilon(event, delta=DELTA, accountant="rdp")
    paper = _paper(paper_accounting.paper_dpdfd_epsilon, noise_multiplier=100.0,
                   l2_clip_norm=1.0, steps=steps, delta=DELTA)
    print(f"| {steps} | {pld:.3f} | {rdp:.3f} | {paper:.3g} |")
  print()


def dpdfd_calibration() -> None:
  print("## 3. DPDFD calibration, B = 256, delta = 1e-5 (PLD)")
  for target, steps in ((1.0, 1), (10.0, 1000)):
    sigma = calibration.calibrate_dpdfd_noise_multiplier(
        target_epsilon=target, delta=DELTA, batch_size=256, steps=steps)
    print(f"sigma for eps <= {target:g} over T = {steps}: {sigma:.1f}")
  steps = calibration.calibrate_dpdfd_steps(
      target_epsilon=10.0, delta=DELTA, noise_multiplier=100.0, batch_size=256,
      max_steps=100_000)
  print(f"max T at sigma = 100 for eps <= 10: {steps}")
  print()


def srr() -> None:
  print("## 4. SRR, eps = 1 per query, delta = 1e-5 (binary-RR bound)")
  paper = _paper(paper_accounting.paper_srr_label_epsilon,
                 epsilon_per_query=1.0)
  print("| queries n | record-level eps (PLD) | record-level eps (RDP) | "
        "k = 10 known (PLD) | paper per-query label eps |")
  print("|---|---|---|---|---|")
  for n in (1, 10, 100, 1000):
    event = accounting.srr_event(epsilon_per_query=1.0, num_queries=n)
    k10 = accounting.srr_event(epsilon_per_query=1.0, num_queries=n,
                               num_classes=10)
    print(f"| {n} | {accounting.epsilon(event, delta=DELTA):.3f} | "
          f"{accounting.epsilon(event, delta=DELTA, accountant='rdp'):.3f} | "
          f"{accounting.epsilon(k10, delta=DELTA):.3f} | {paper:g} |")
  print()


def rona() -> None:
  print("## 6. RONA, sigma = 6, delta = 1e-5")
  paper = _paper(paper_accounting.paper_rona_epsilon, noise_multiplier=6.0,
                 delta=DELTA)
  print(f"paper per-query eps (classic bound, sensitivity B): {paper:.3f}")
  for queries in (1, 100):
    composed = _paper(paper_accounting.paper_rona_composed_epsilon, noise_multiplier=6.0,
                      num_queries=queries, delta=DELTA)
    print(f"paper Theorem 2 eps, {queries} queries (reconstruction, sensitivity B): "
          f"{composed:.3f}")
    event = accounting.rona_event(noise_multiplier=6.0, num_queries=queries)
    print(f"sound eps, {queries} queries (sensitivity 2B, PLD): "
          f"{accounting.epsilon(event, delta=DELTA):.3f}")
  print()


def local_reverse_knn() -> None:
  print("## 5. Reverse k-NN, local bit flipping: eps = 4, k = 5, r = 1")
  # Two records' vote vectors differ in <= 2kr bits, each flipped with
  # p = 1/(e^{eps/(2kr)} + 1): 2kr binary RR with eps/(2kr) each.
  k, r, eps = 5, 1, 4.0
  bits = accounting.srr_event(epsilon_per_query=eps / (2 * k * r),
                              num_queries=2 * k * r)
  print(f"pure eps of one report: {eps:g}")
  print(f"eps of one report at delta = 1e-5 (PLD over {2 * k * r} bits): "
        f"{accounting.epsilon(bits, delta=DELTA):.3f}")
  print()


def rr_trap() -> None:
  print("## 9. dp-accounting 0.6.0 PLDAccountant RR count trap, eps0 = 1")
  single = accounting.srr_event(epsilon_per_query=1.0, num_queries=1).event
  relation = pld_privacy_accountant.NeighborRel.REPLACE_ONE
  for n in (1, 100):
    trap = pld_privacy_accountant.PLDAccountant(relation).compose(
        dp_event.SelfComposedDpEvent(single, n)).get_epsilon(DELTA)
    ours = accounting.epsilon(dp_event.SelfComposedDpEvent(single, n),
                              delta=DELTA)
    print(f"n = {n}: PLDAccountant eps = {trap:.3f}, ours = {ours:.3f}")
  print()


def grid_step() -> None:
  print("## 8. PLD grid step: default (closed form / exact / self-refining grid) vs fixed grids")
  events = {
      "DPDFD B=256 sigma=100 T=100 (closed form)": accounting.dpdfd_event(
          noise_multiplier=100.0, batch_size=256, steps=100),
      "DPDFD B=256 sigma=1 T=100 (closed form)": accounting.dpdfd_event(
          noise_multiplier=1.0, batch_size=256, steps=100),
      "SRR eps=1 n=1000 (exact lattice)": accounting.srr_event(epsilon_per_query=1.0,
                                                                num_queries=1000),
      "DP-SGD q=0.01 z=1 T=10000, add/remove": accounting.dpsgd_event(
          noise_multiplier=1.0, sampling_rate=0.01, steps=10_000, relation="add-remove"),
      "DP-SGD q=0.0011 z=2.72 T=6089, add/remove": accounting.dpsgd_event(
          noise_multiplier=2.72, sampling_rate=0.0011, steps=6089, relation="add-remove"),
      "DP-SGD q=0.0011 z=2.72 T=6089, replace-one": accounting.dpsgd_event(
          noise_multiplier=2.72, sampling_rate=0.0011, steps=6089, relation="replace-one"),
      "DP-SGD q=256/60000 z=0.3 T=2344, replace-one": accounting.dpsgd_event(
          noise_multiplier=0.3, sampling_rate=256 / 60000, steps=2344,
          relation="replace-one"),
  }
  print("| event | eps default | s default | eps @1e-3 | eps @1e-4 |")
  print("|---|---|---|---|---|")
  for name, event in events.items():
    start = time.perf_counter()
    row = [f"{accounting.epsilon(event, delta=DELTA):.4f}",
           f"{time.perf_counter() - start:.2f}"]
    for interval in (1e-3, 1e-4):
      eps = accounting.epsilon(event, delta=DELTA, value_discretization_interval=interval)
      row.append(f"{eps:.4f}")
    print(f"| {name} | " + " | ".join(row) + " |")
  print()


def dpsgd_relations() -> None:
  print("## 7. DP-SGD under both neighbouring relations, delta = 1e-5 (PLD)")
  print("| q | z | T | eps add/remove | eps replace-one | eps add/remove (RDP) |")
  print("|---|---|---|---|---|---|")
  for q, z, steps in ((256 / 60000, 1.0, 2344), (256 / 60000, 0.5, 2344), (0.0011, 2.72, 6089)):
    row = [accounting.epsilon(accounting.dpsgd_event(
        noise_multiplier=z, sampling_rate=q, steps=steps, relation=relation), delta=DELTA)
           for relation in ("add-remove", "replace-one")]
    row.append(accounting.epsilon(accounting.dpsgd_event(
        noise_multiplier=z, sampling_rate=q, steps=steps,
        relation="add-remove"), delta=DELTA, accountant="rdp"))
    print(f"| {q:.5f} | {z:g} | {steps} | " + " | ".join(f"{e:.3f}" for e in row) + " |")
  print()


if __name__ == "__main__":
  dpdfd_one_step()
  dpdfd_steps()
  dpdfd_calibration()
  srr()
  local_reverse_knn()
  rona()
  dpsgd_relations()
  grid_step()
  rr_trap()
