"""Instrumentation: progress prints by a frozen LM, verification, AST fallback."""
