"""Executors: sandbox backends and fleets that run untrusted agent code."""
