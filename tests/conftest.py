"""Shared set-up of the test session, and the fixtures every folder uses.

- JAX's persistent compilation cache in one folder for the whole session (this process, its pytest-xdist workers
  and every subprocess a test starts inherit it through the environment): the same shapes are compiled once per
  `make test`, not once per test or process. A fresh folder per session (MLE_JAX_TEST_JAX_CACHE names a lasting
  one), so a run's time never depends on an earlier run's leftovers.
- Loopback only: under `make test` (MLE_JAX_TEST_NETNS=1) the session runs in a network namespace of its own
  whose only interface is `lo`; the session refuses to start if that is not so.
- MLE_JAX_TEST_TIMES=FILE records how long each tier took (docs/testing.md's test-tier table renders it).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from tests.xla_flags import set_session_flags

SESSION_JAX_CACHE = None  # the folder this process made (and removes at the end), if it made one
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # set before jax is imported, here and in every subprocess
    if not os.environ.get("MLE_JAX_TEST_JAX_CACHE"):
        SESSION_JAX_CACHE = tempfile.mkdtemp(prefix="mle_jax-test-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ.get("MLE_JAX_TEST_JAX_CACHE") or SESSION_JAX_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # tiny models compile fast, but often
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# XLA without most of its optimisation passes (JAX's `jax_disable_most_optimizations`), here and in every
# subprocess: the suite's JAX time is mostly compiling tiny models, and unoptimised compiles are ~40 % faster
# (tests/models/test_qwen2.py + tests/rl/test_distributed.py: 194 s -> 117 s) while the real-size models' tests
# (SmolLM2) run as fast. Results are the same computations, checked against the same references.
# JAX_DISABLE_MOST_OPTIMIZATIONS=0 runs the suite with the optimised compiles.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA:CPU's legacy emitters, one LLVM module per program: a third of the compile CPU (tests/xla_flags.py)
set_session_flags()

import pytest  # noqa: E402

from mle_jax.tasks.prepare import RAW_DATA_DIR  # noqa: E402

TIERS = ("model", "integration", "e2e")  # a test with none of these marks is in the unit tier

# pytest-xdist (`make test`: two workers, --dist loadfile --no-loadscope-reorder): a module's tests run on one
# worker, so that its module-scoped fixtures (servers, clusters, trained models) are built once, and two of the
# launch/ scripts' runs, which each take most of the machine's memory, never run at once. The longest modules are
# collected first, longest first (their times in a `make test` run), so that neither worker is left with one of them
# at the end; the others follow in pytest's order. gpu_node.sh's run (~17 GB) is the first test, and SmolLM2's and
# Qwen's modules (a vLLM server beside the model) come after the two e2e modules: by then the other worker's
# gpu_node.sh run has ended.
LONGEST_FIRST = (
    "tests/test_launch_scripts.py",
    "tests/test_e2e_tasks.py",
    "tests/test_e2e.py",
    "tests/test_launch_hostile.py",
    "tests/models/test_smollm2.py",
    "tests/models/test_qwen_coder.py",  # ~10 GB with its vLLM server: after the e2e modules too
    "tests/test_plan.py",
    "tests/rl/test_loop.py",
    "tests/rl/test_distributed.py",
    "tests/planner/test_plan_targets.py",
)


def network_interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("MLE_JAX_TEST_NETNS") == "1" and network_interfaces() != ["lo"]:
        raise pytest.UsageError(
            f"MLE_JAX_TEST_NETNS=1 but this network namespace has {network_interfaces()}, not only lo: "
            "run the suite with `make test` (tests/loopback_only.sh), which gives it a namespace of its own"
        )
    session.config._tier_started = time.time()  # type: ignore[attr-defined]
    session.config._tier_seconds = defaultdict(float)  # type: ignore[attr-defined]
    session.config._tier_counts = defaultdict(int)  # type: ignore[attr-defined]
    session.config._worker_seconds = defaultdict(float)  # type: ignore[attr-defined]


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return LONGEST_FIRST.index(module_of(item)) if module_of(item) in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each module, and of the other modules, is kept
    for item in items:  # a test of no other tier is a unit test: `pytest -m unit` runs that tier alone
        if tier_of(item.keywords) == "unit":
            item.add_marker(pytest.mark.unit)


def tier_of(keywords) -> str:
    return next((t for t in TIERS if t in keywords), "unit")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each phase's time to its test's tier (in the controller when pytest-xdist runs the tests)."""
    config = _CONFIG.get("config")
    if config is None or not hasattr(config, "_tier_seconds"):
        return
    tier = tier_of(report.keywords)
    config._tier_seconds[tier] += report.duration
    node = getattr(getattr(report, "node", None), "gateway", None)  # the pytest-xdist worker that ran it
    config._worker_seconds[getattr(node, "id", "main")] += report.duration
    if report.when == "call":
        config._tier_counts[tier] += 1


_CONFIG: dict[str, pytest.Config] = {}


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if SESSION_JAX_CACHE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(SESSION_JAX_CACHE, ignore_errors=True)  # nothing the session made outlives it
    out = os.environ.get("MLE_JAX_TEST_TIMES")
    if not out or hasattr(session.config, "workerinput"):  # only the controller writes
        return
    config = session.config
    record = {
        "command": os.environ.get("MLE_JAX_TEST_COMMAND") or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs",
        "workers": int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or getattr(config.option, "numprocesses", 0) or 1),
        "exit_status": int(exitstatus),
        "wall_s": round(time.time() - config._tier_started, 1),
        "tiers": {
            t: {"tests": config._tier_counts[t], "test_seconds": round(config._tier_seconds[t], 1)}
            for t in ("unit", *TIERS)
        },
        # each worker's sum of test phases: the suite's wall time is about the busiest worker's
        "worker_seconds": {w: round(v, 1) for w, v in sorted(config._worker_seconds.items())},
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=2) + "\n")


@pytest.fixture(scope="session")
def raw_data_dir() -> Path:
    if not RAW_DATA_DIR.is_dir():
        raise FileNotFoundError(f"real task data not found at {RAW_DATA_DIR}: the repository ships it in data/raw/")
    return RAW_DATA_DIR
