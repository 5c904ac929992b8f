"""benchmarks/performance_doc.py: docs/PERFORMANCE.md's tables are those of their records."""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import performance_doc  # noqa: E402  (a benchmark script, not a package module)


def test_every_table_of_the_page_is_its_record():
  assert performance_doc.main(["--check"]) == 0


def test_a_changed_record_makes_the_page_stale(tmp_path):
  for name in ("secure_noise_cost__cpu.json", "dpdfd_cifar10_dry_run.json"):
    record = json.loads((performance_doc.RECORDS / name).read_text())
    if name.startswith("secure"):
      record["dpdfd_step"]["ratio"] += 1
    else:
      record["steps"] += 1
    (tmp_path / name).write_text(json.dumps(record))
  text = performance_doc.DOC.read_text()
  assert performance_doc.render(text, tmp_path) != text
  assert performance_doc.render(text, performance_doc.RECORDS) == text
