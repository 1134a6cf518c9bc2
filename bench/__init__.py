"""Performance benchmarks (BENCHMARKS.md): ``headroom bench``. One ``bench_*.py`` module per
area."""
