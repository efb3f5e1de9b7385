"""Save, SIGKILL mid-run, resume: the resumed run continues on exactly the uninterrupted run's curve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
STEPS = 12


def cmd(ckpt: Path, cache: Path, steps: int, resume: bool = False) -> list[str]:
    args = [sys.executable, "-m", "tests.rl.workers", "resume", "--ckpt", str(ckpt), "--steps", str(steps),
            "--cache_dir", str(cache)]  # fmt: skip
    return args + (["--resume"] if resume else [])


def parse(stdout: str) -> dict[int, dict]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {line["step"]: line for line in lines if "step" in line}


def test_kill_and_resume_follows_the_same_curve(tmp_path):
    cache = tmp_path / "xla_cache"  # the three runs compile the same program once
    full = subprocess.run(cmd(tmp_path / "full", cache, STEPS), cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert full.returncode == 0, full.stderr[-5000:]
    reference = parse(full.stdout)
    assert sorted(reference) == list(range(1, STEPS + 1))

    # a run that will not finish on its own; killed right after its second update (saves in flight)
    crashed = tmp_path / "crashed"
    proc = subprocess.Popen(cmd(crashed, cache, 10_000), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith('{"step": 2,'):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-2000:]
    before_kill = parse("".join(seen))
    for step, line in before_kill.items():  # the doomed run was on the same curve too
        assert line == reference[step]

    resumed = subprocess.run(cmd(crashed, cache, STEPS, resume=True), cwd=REPO, env=ENV, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    start = json.loads(resumed.stdout.splitlines()[0])["resumed_from"]
    assert 1 <= start < STEPS  # step 2 may still have been writing when killed: then step 1 is the latest
    after = parse(resumed.stdout)
    assert sorted(after) == list(range(start + 1, STEPS + 1))
    for step, line in after.items():
        assert line["digest"] == reference[step]["digest"], step  # params bit for bit
        assert line["metrics"] == reference[step]["metrics"], step
