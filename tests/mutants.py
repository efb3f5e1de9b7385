"""Mutation check of the core: each mutant below breaks one thing the method depends on, and the tests named
beside it must fail on it. Run after changing tests (a faster suite must still catch them):

    .venv/bin/python -m tests.mutants [--only NAME ...] [--out docs/results/mutants.json]

Each mutant is applied to a copy of the repository's code in a temporary folder (the working tree is never
touched), its tests run there, and the mutant is "caught" when pytest fails. Exit 1 if any mutant survives.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # from the repository root
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments


MUTANTS = (
    Mutant("duration weights set to ones", "mle_jax/rl/duration.py",
           "    w = d / jnp.maximum(mean(d), 1e-12)\n", "    w = jnp.ones_like(d)\n",
           ("tests/rl/test_core.py",)),
    Mutant("same-id statistics pooled over every id", "mle_jax/rl/groups.py",
           "return ids[:, None] == ids[None, :]", "return jnp.ones((ids.size, ids.size), bool)",
           ("tests/rl/test_groups.py",)),
    Mutant("GAE without lambda", "mle_jax/rl/core.py",
           "adv = delta + gamma * lam * next_adv", "adv = delta + gamma * next_adv",
           ("tests/rl/test_core.py",)),
    Mutant("value clip off", "mle_jax/rl/core.py",
           "clipped_values = old_values + jnp.clip(values - old_values, -value_clip, value_clip)",
           "clipped_values = values", ("tests/rl/test_core.py",)),
    Mutant("reward sign flipped", "mle_jax/tasks/reward.py",
           "floored(-score if lower_is_better else score,", "floored(score if lower_is_better else -score,",
           ("tests/tasks/test_reward.py",)),
    Mutant("print credit doubled", "mle_jax/tasks/reward.py",
           "settings.failure + settings.per_print * len(prints)",
           "settings.failure + 2 * settings.per_print * len(prints)", ("tests/tasks/test_reward.py",)),
    Mutant("sandbox on the host network", "mle_jax/executor/bwrap.py",
           'cmd += ["unshare", "--net", "--mount",', 'cmd += ["unshare", "--mount",',
           ("tests/executor/test_bwrap.py", "-k", "loopback or network or socket or connect")),
    Mutant("learner ignoring its weights", "mle_jax/rl/objectives.py",
           'lp, old, mb["advantages"], mask, mb["weights"], s.clip_ratio',
           'lp, old, mb["advantages"], mask, None, s.clip_ratio',
           ("tests/rl/test_learner.py",)),
    Mutant("grader ignoring row order", "mle_jax/tasks/graders/frames.py",
           "return sub.iloc[s_order].reset_index(drop=True), answers.iloc[a_order].reset_index(drop=True)",
           "return sub.reset_index(drop=True), answers.reset_index(drop=True)",
           ("tests/tasks/test_graders.py", "tests/tasks/test_mlebench_graders.py")),
)  # fmt: skip


def copy_repo(dst: Path) -> None:
    """The code and tests (the environments and data are linked, not copied)."""
    for name in ("mle_jax", "tests", "configs", "bench", "launch", "sandboxes"):
        shutil.copytree(REPO / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy2(REPO / name, dst / name)
    for name in ("data", ".venv", ".sandbox-venv", ".vllm-venv", "checkpoints", "build"):
        if (REPO / name).exists():
            (dst / name).symlink_to((REPO / name).resolve())


def run_mutant(m: Mutant, root: Path) -> dict:
    path = root / m.path
    source = path.read_text()
    if source.count(m.old) != 1:
        raise SystemExit(f"mutant {m.name!r}: {m.old!r} occurs {source.count(m.old)} times in {m.path}")
    path.write_text(source.replace(m.old, m.new))
    start = time.monotonic()
    try:
        done = subprocess.run([str(REPO / ".venv/bin/python"), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               *m.tests], cwd=root, capture_output=True, text=True, env={**os.environ})  # fmt: skip
    finally:
        path.write_text(source)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    return {"mutant": m.name, "file": m.path, "tests": " ".join(m.tests), "caught": done.returncode == 1,
            "pytest": last, "seconds": round(time.monotonic() - start, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="mutant names (default: all)")
    ap.add_argument("--out", default=None, help="write the results (with the command and date) to this JSON file")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if args.only is None or m.name in args.only]
    results = []
    with tempfile.TemporaryDirectory(prefix="mle_jax-mutants-") as tmp:
        copy_repo(Path(tmp))
        for m in chosen:
            r = run_mutant(m, Path(tmp))
            print(f"{'caught  ' if r['caught'] else 'SURVIVED'} {r['mutant']}: {r['pytest']} ({r['seconds']} s)",
                  flush=True)  # fmt: skip
            results.append(r)
    if args.out:
        from mle_jax.reporting import provenance

        provenance.write_json(args.out, {"mutants": results})
    sys.exit(0 if all(r["caught"] for r in results) else 1)


if __name__ == "__main__":
    main()
