"""The same PPO update on 1 device, on 4 fake CPU devices (fsdp and tensor layouts) and on 2 processes x 2
devices (jax.distributed over gloo). Each runtime lives in its own subprocess (tests/rl/workers.py) so the
fake-device flag never touches the other tests."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}


def worker(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "tests.rl.workers", *args], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert res.returncode == 0, f"worker {args[0]} failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    return res


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    worker("sharded", "--out", str(out))
    runs = json.loads((out / "sharded.json").read_text())
    result = {name: (runs[name], dict(np.load(out / f"{name}.npz"))) for name in runs}
    result["init"] = dict(np.load(out / "single_init.npz"))
    return result


def assert_same_update(a, b):
    (meta_a, params_a), (meta_b, params_b) = a, b
    assert sorted(params_a) == sorted(params_b)
    for name in params_a:
        np.testing.assert_allclose(params_b[name], params_a[name], rtol=1e-4, atol=1e-6, err_msg=name)
    for step_a, step_b in zip(meta_a["metrics"], meta_b["metrics"], strict=True):
        for k, v in step_a.items():
            np.testing.assert_allclose(step_b[k], v, rtol=1e-4, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("layout,axis,weight", [
    ("fsdp", "fsdp", "policy['model']['layers']['0']['mlp']['gate_proj']"),
    ("tensor", "tensor", "policy['model']['layers']['0']['mlp']['gate_proj']"),
])  # fmt: skip
def test_sharded_update_equals_single_device(sharded_runs, layout, axis, weight):
    single, sharded = sharded_runs["single"], sharded_runs[layout]
    assert axis in sharded[0]["specs"][weight]  # the weights really are split over 4 devices
    assert "fsdp" not in single[0]["specs"][weight] and "tensor" not in single[0]["specs"][weight]
    assert_same_update(single, sharded)
    # the two updates moved the weights by far more than the tolerance
    gaps = [np.abs(single[1][k] - sharded_runs["init"][k]).max() for k in single[1]]
    assert np.median(gaps) > 1e-3, gaps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_processes(mode: str, out: Path, *args: str) -> None:
    """`python -m tests.rl.workers MODE` as processes 0 and 1 of one jax.distributed run on 127.0.0.1."""
    cmd = [sys.executable, "-m", "tests.rl.workers", mode, "--out", str(out), "--port", str(free_port()), *args]
    procs = [subprocess.Popen([*cmd, "--process_id", str(i)], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]  # fmt: skip
    try:
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)


def test_two_processes_equal_one_process_with_four_devices(sharded_runs, tmp_path):
    two_processes("multihost", tmp_path)
    meta = json.loads((tmp_path / "multihost.json").read_text())
    params = dict(np.load(tmp_path / "multihost.npz"))
    assert "fsdp" in meta["specs"]["policy['model']['embed_tokens']"]
    assert_same_update(sharded_runs["fsdp"], (meta, params))


def test_leader_sends_batches_followers_train_on_them(sharded_runs, tmp_path):
    """rl/hosts.py on 2 processes: the follower waits for each batch in jax.distributed's key-value store (the
    leader publishes after a delay longer than its poll), trains on it in the same update as the leader, and
    stops with LeaderAborted when the leader aborts; the leader's weights equal one process's on 4 devices."""
    two_processes("channel", tmp_path, "--delay", "3")
    leader = json.loads((tmp_path / "channel_0.json").read_text())
    follower = json.loads((tmp_path / "channel_1.json").read_text())
    assert follower["big_equal"]  # a batch of several key-value parts arrived whole
    assert follower["follower_step"] == 2 and follower["synced_versions"] == [1, 2]
    assert "the leader's test abort" in follower["aborted"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["1", "2"]
    params = dict(np.load(tmp_path / "channel.npz"))
    assert_same_update(sharded_runs["fsdp"], ({"metrics": leader["metrics"]}, params))


def test_batch_encoding_round_trips():
    """A paper-sized batch comes back equal through the channel's encoding, with its meta, and in more than one
    key-value part."""
    from mle_jax.rl.hosts import PART_BYTES, decode_batch, encode_batch
    from tests.rl.workers import _big_batch

    batch = _big_batch()
    data = encode_batch(batch, {"step": 3, "version": 7})
    assert len(data) > PART_BYTES
    got, meta = decode_batch(data)
    assert meta == {"step": 3, "version": 7}
    for f in dataclasses.fields(batch):
        np.testing.assert_array_equal(getattr(got, f.name), getattr(batch, f.name), err_msg=f.name)
    assert batch.task_ids.tolist()[:4] == [0, 1, 2, 0]  # every field, the task of each sample included
