"""Performance benchmarks (CONTRACT §6): ``headroom bench``. One ``bench_*.py`` module per area."""
