"""Benchmark and measurement scripts (run as files; a package so that its name is not taken by
another distribution's top-level `benchmarks`, e.g. Opacus's)."""
