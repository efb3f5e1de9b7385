"""`python -m mle_jax.launch`: a user's mistake or a missing piece ends in one line saying what and how to fix
it, before any work starts (no traceback, exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mle_jax.launch", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--config=configs/pizza.py:gpu-typo"], "unknown config arg 'gpu-typo'"),
        (
            ["--config=configs/pizza.py:cpu", "--config.loop.stepz=3"],
            '--config.loop.stepz: no such config field (did you mean "steps"?)',
        ),
        (["--config=configs/pizza.py:cpu", "--config.ppo.loss_agg=sum"], "ppo.loss_agg must be one of"),
        (
            ["--config=configs/pizza.py:cpu", "--config.model.path=/no/such/model"],
            "model.path=/no/such/model is not an HF model folder",
        ),
        (
            ["--config=configs/pizza.py:cpu", "--config.sampler.backend=vllm"],
            "sampler.vllm_url is empty but sampler.backend=vllm",
        ),
        (
            [
                "--config=configs/pizza.py:cpu",
                "--config.executor.backend=docker",
                "--config.executor.docker_url=unix:///tmp/no-such-docker.sock",
            ],
            "no Docker daemon answers at unix:///tmp/no-such-docker.sock",
        ),
        (
            ["--config=configs/pizza.py:cpu", "--config.task.raw_dir=/no/such/data"],
            "no data for random-acts-of-pizza at /no/such/data",
        ),
    ],
)
def test_user_errors_are_one_line(args, says, tmp_path):
    done = launch(*args, f"--config.workdir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    err = done.stderr.strip()
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert err.startswith("error: ") and says in err, err
    assert not (tmp_path / "run").exists()  # nothing started
