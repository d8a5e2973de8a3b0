"""Benchmarks: `make bench` prints each figure next to a baseline measured in the same run."""
