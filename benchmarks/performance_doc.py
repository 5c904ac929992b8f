"""docs/PERFORMANCE.md's tables, written from their records: `python benchmarks/performance_doc.py
[--check]`.

Each marked section is rendered from one JSON record under docs/results/benchmarks/:

  perf-table                   perf_table__cpu.json (`benchmarks/perf_table.py --write`)
  record-table:secure-noise    secure_noise_cost__cpu.json (`benchmarks/secure_noise_cost.py`)
  record-table:dry-run         dpdfd_cifar10_dry_run.json (`experiments.dpdfd --dry_run`)

`--check` writes nothing and exits 1 if a section differs from its record. A record that does not
exist leaves its section as it is (the perf table before its first idle run).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "PERFORMANCE.md"
RECORDS = ROOT / "docs" / "results" / "benchmarks"


def _link(name: str) -> str:
  return f"[results/benchmarks/{name}](results/benchmarks/{name})"


def secure_noise(record: dict[str, Any]) -> str:
  step, noise = record["dpdfd_step"], record["dpsgd_noise"]
  return "\n".join([
      f"Record: {_link('secure_noise_cost__cpu.json')} ({record['date']}, {record['host']}, "
      f"load average {record['load_before']:.2f} at the start, {record['repeats']} interleaved "
      f"repeats; `{record['command']}`).",
      "",
      "| what | coordinates | float median s | secure median s | secure / float |",
      "| --- | --- | --- | --- | --- |",
      f"| one DPDFD step, digits quickstart shape | {step['rows']:,} | {step['float_s']:.3g} | "
      f"{step['secure_s']:.3g} | {step['ratio']:.2f} |",
      f"| DP-SGD noise half of a lenet5 step (the sampler only: the mode is not offered) | "
      f"{noise['coordinates']:,} | {noise['float_s']:.3g} | {noise['secure_s']:.3g} | "
      f"{noise['ratio']:.0f} |"])


def _seconds(value: float) -> str:
  return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def dry_run(record: dict[str, Any]) -> str:
  memory = record["memory"]
  lines = [
      f"Record: {_link('dpdfd_cifar10_dry_run.json')} (`{record['command']}`, jax "
      f"{record['jax']}, {record['date']}): teacher {record['teacher_model']} x"
      f"{record['num_teachers']}, student {record['student_model']}, generator "
      f"{record['generator_model']} of width {record['generator_channels']}, batch "
      f"{record['batch_size']}, {record['steps']:,} steps.",
      "",
      "| per step | value | from |",
      "| --- | --- | --- |",
      f"| FLOPs | {record['flops_per_step'] / 1e9:,.1f} GFLOP | XLA cost analysis of the step "
      f"lowered for {record['flops_lowered_for']} |",
      f"| bytes accessed | {record['bytes_accessed_per_step'] / 1e9:.1f} GB "
      f"({record['bytes_accessed_unfused_per_step'] / 1e9:.1f} GB unfused) | the step compiled "
      f"for {record['compiled_for']}, after its fusions |",
      f"| memory | {record['peak_memory_bytes'] / 2**30:.2f} GiB "
      f"({memory.get('temp_size_in_bytes', 0) / 2**30:.2f} GiB temporaries) | "
      f"`memory_analysis()` of the {record['compiled_for']} compile |",
      "",
      f"| chip (peaks assumed) | JAX's float32 runs as | compute / memory bound per step | at "
      f"{record['utilisation']:.0%} of both peaks | {record['steps']:,} steps |",
      "| --- | --- | --- | --- | --- |"]
  for chip in record["chips"]:
    peaks = ", ".join(f"{name} {value / 1e12:,.1f}" for name, value in chip["peaks"].items())
    lines.append(
        f"| {chip['name']} ({peaks} TFLOP/s; {chip['hbm_bytes_per_s'] / 1e12:.3g} TB/s) | "
        f"{chip['precision'].split(' (')[0]} | "
        f"{_seconds(chip['compute_bound_s'])} / {_seconds(chip['memory_bound_s'])} | "
        f"{_seconds(chip['step_s'])} | {_seconds(chip['run_s'])} |")
  return "\n".join(lines)


def dropin(record: dict[str, Any]) -> str:
  lines = [f"Record: {_link('dropin_dpsgd__cpu.json')} ({record['host']}, load average "
           f"{record['load_before']:.2f} at the start, {record['rounds']} interleaved rounds"
           f"{'' if record['intervals_tight'] else ', intervals not tight'}; "
           f"`{record['command']}`). One DP-SGD step of {record['model']} (GroupNorm), batch "
           f"{record['batch_size']}; the ratio is a row's median time over the CLI step's "
           "(below 1: faster).",
           "",
           "| step | median | / CLI step (95% interval) |",
           "| --- | --- | --- |"]
  for name, row in record["rows"].items():
    ratio, low, high = row["ratio_to_cli"]
    lines.append(f"| {name} | {_seconds(row['median_s'])} | "
                 + ("1" if (low, high) == (1.0, 1.0) else f"{ratio:.3f} ({low:.3f}-{high:.3f})")
                 + " |")
  return "\n".join(lines)


def perf_table(record: dict[str, Any]) -> str:
  return record["markdown"]


SECTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "<!-- perf-table:": ("perf_table__cpu.json", perf_table),
    "<!-- record-table:secure-noise:": ("secure_noise_cost__cpu.json", secure_noise),
    "<!-- record-table:dry-run:": ("dpdfd_cifar10_dry_run.json", dry_run),
    "<!-- record-table:dropin-dpsgd:": ("dropin_dpsgd__cpu.json", dropin),
}


def render(text: str, records: pathlib.Path = RECORDS) -> str:
  """`text` with every marked section whose record exists rendered from it."""
  for marker, (name, render_fn) in SECTIONS.items():
    path = records / name
    begin, end = f"{marker}begin -->", f"{marker}end -->"
    if not path.exists() or begin not in text or end not in text:
      continue
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    body = render_fn(json.loads(path.read_text()))
    text = f"{head}{begin}\n{body}\n{end}{tail}"
  return text


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
  args = parser.parse_args(argv)
  text = DOC.read_text()
  rendered = render(text)
  if args.check:
    print("stale: none" if rendered == text else f"stale: {DOC.relative_to(ROOT)} "
          "(run: python benchmarks/performance_doc.py)")
    return int(rendered != text)
  DOC.write_text(rendered)
  print(f"wrote {DOC.relative_to(ROOT)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
