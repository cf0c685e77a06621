"""Unit tests of bench/: the benchmarks' own logic."""
