"""Release of a finished run: its model card, and its student exported for other runtimes.

  students.py    which methods release a classifier student, where each keeps it in its
                 checkpoint, and `load_student(workdir)` (the trained student, checked)
  model_card.py  `write_model_card(workdir)`: model_card.md + model_card.json from the run's
                 results.json and record.json (called by `train.outputs.finish_run`)
  export.py      ONNX (jax2onnx) and `jax.export` StableHLO files of the student, each checked
                 against JAX on test inputs
  latency.py     CPU latency per image of the exported student beside jitted JAX
  bundle.py      `export_run(workdir, out_dir, formats)`: the release bundle (exports, checks,
                 latency, card) behind `python -m experiments.export`

This `__init__` imports nothing: `train.outputs` imports `release.model_card`, while `bundle`
imports the checkpoint and model code, so importing the package must not pull in either.
onnx, onnxruntime and jax2onnx are imported only when an ONNX file is written or run.
"""
