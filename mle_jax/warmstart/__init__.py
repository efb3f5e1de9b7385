"""Warm start for small models: a sandbox-verified corpus of solution programs and SFT on it."""
