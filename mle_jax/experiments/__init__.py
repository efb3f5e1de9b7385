"""Simulated experiments that check the method's claims (duration bias)."""
