"""Samplers: protocol, in-process JAX sampler, vLLM server client."""
