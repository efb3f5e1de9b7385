"""mle_jax: RL for machine-learning-engineering agents (arXiv 2509.01684), in JAX."""

__version__ = "0.1.0"
