"""Benchmark and device scripts (a regular package, so that tests/benchmarks on sys.path never
shadows it)."""
