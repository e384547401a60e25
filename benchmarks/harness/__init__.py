"""Harnesses shared by the benchmarks and the tests: rank spawning, a synthetic model,
reshard measurement."""
