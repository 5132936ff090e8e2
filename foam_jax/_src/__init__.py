"""Private implementation of foam_jax; import from ``foam_jax`` instead."""
