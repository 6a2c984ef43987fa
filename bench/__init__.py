"""Benchmarks for sqlqueue; run ``python -m bench.drain --help`` from the repository root."""
