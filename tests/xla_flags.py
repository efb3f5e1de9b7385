"""The XLA flags of the test session, for this process (tests/conftest.py sets them before JAX is imported) and for
every subprocess a test starts, also those that set XLA_FLAGS of their own (fake devices).

XLA:CPU's legacy elemental emitters instead of its MLIR fusion emitters, and one LLVM module per program: the
suite's JAX time is mostly compiling tiny models, and these compiles take a third of the CPU (the tiny PPO update
at three micro-batch sizes: 10.6 s -> 2.8 s of CPU; tests/rl/test_{learner,objectives,ppo,loop}.py: 174 s -> 118 s
of CPU). The programs compute the same results, checked against the same references.
MLE_JAX_TEST_XLA_FLAGS names others ("" for XLA's defaults).
"""

from __future__ import annotations

import os

SUITE_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
_ENV = "MLE_JAX_TEST_XLA_FLAGS"


def suite_xla_flags() -> str:
    return os.environ.get(_ENV, SUITE_XLA_FLAGS)


def with_device_count(n: int) -> str:
    """XLA_FLAGS for a subprocess with n fake CPU devices, and the session's flags."""
    return f"{suite_xla_flags()} --xla_force_host_platform_device_count={n}".strip()


def optimised_compile_env() -> dict[str, str]:
    """Environment overrides for a subprocess that compiles as a real run does: most of XLA's optimisation passes on
    (the suite turns them off, tests/conftest.py) and XLA's own emitters (this process's XLA_FLAGS less the
    session's). For a real-size model's compute and for a plan's memory figures: with the legacy emitters the
    optimised compile was slower (gpu_node.sh's SmolLM2 run: 96 s -> 134 s; the tiny plan's compile: 13 s -> 20 s)."""
    flags = os.environ.get("XLA_FLAGS", "").replace(suite_xla_flags(), "").strip()
    return {"JAX_DISABLE_MOST_OPTIMIZATIONS": "0", "XLA_FLAGS": flags}


def set_session_flags() -> None:
    """Adds the session's flags to this process's XLA_FLAGS (before jax is imported), for it and its children."""
    os.environ.setdefault(_ENV, SUITE_XLA_FLAGS)
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ[_ENV] and os.environ[_ENV] not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {os.environ[_ENV]}".strip()
