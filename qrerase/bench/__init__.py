"""Runtime benchmarks and the per-method cost tables."""
