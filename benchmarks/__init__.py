"""Benchmarks of foam_jax: memory, step time and convergence on examples.llama."""
