"""Benchmark scripts (run as ``python -m bench.<name>``); results go to ``bench/results/``."""
