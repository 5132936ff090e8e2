"""Examples of foam_jax: ``examples.llama`` pre-trains a LLaMA with FOAM."""
