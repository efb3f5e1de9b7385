"""The docker backend via Podman's Docker-compatible socket: the pizza solution, hostile programs, the
Docker API failing mid-run."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import docker
import pytest

from mle_jax.executor.docker import DockerSandbox
from mle_jax.executor.fleet import local_fleet
from mle_jax.executor.image import ImageMissing, ensure_image
from mle_jax.executor.podman import PodmanService
from mle_jax.executor.result import Status
from mle_jax.executor.runtime import default_venv
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.tasks.graders import grade
from mle_jax.tasks.prompts import data_mount
from tests.executor import programs
from tests.executor.conftest import CLOCK, HOSTILE, NORMAL, graded_outcomes
from tests.executor.unix_proxy import UnixProxy

pytestmark = pytest.mark.integration
RESET_ERRORS = r"(ConnectionError|ChunkedEncodingError): "  # what requests raises for a reset connection


@pytest.fixture(scope="module")
def docker_url():
    """A private Podman service whose store holds the sandbox image, which `make test` builds before the suite
    (the suite runs with no network): a missing image fails every test here in one line naming the make target."""
    with PodmanService() as url:
        missing = None
        try:
            ensure_image(docker.DockerClient(base_url=url), ExecutorSettings.image, build=False)
        except ImageMissing as e:
            missing = str(e)
        if missing:  # outside the except: the line alone, no chained exception
            pytest.fail(missing, pytrace=False)
        yield url


def test_a_missing_image_is_one_line_naming_make_not_a_build(docker_url, monkeypatch):
    """Inside the suite's namespace nothing is built (debootstrap needs the mirror): a missing image is refused at
    once, naming `make sandbox-image`."""
    monkeypatch.setenv("MLE_JAX_TEST_NETNS", "1")
    client = docker.DockerClient(base_url=docker_url)
    with pytest.raises(ImageMissing) as err:
        ensure_image(client, "localhost/mle-jax-sandbox-absent:never")
    message = str(err.value)
    assert "\n" not in message and "`make sandbox-image`" in message and "is missing" in message
    assert client.images.list(name="localhost/mle-jax-sandbox-absent") == []


@pytest.fixture(scope="module")
def sandbox(docker_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("docker")
    settings = ExecutorSettings(backend="docker", docker_url=docker_url)
    return make_sandbox(settings, work_root=root / "work", out_root=root / "results")


def _normal_run_works(sandbox, task):
    r = sandbox.run(programs.NORMAL, task, NORMAL)
    assert r.status is Status.OK, (r.status, r.stderr_tail)
    assert r.submission_path is not None and r.submission_path.is_file()


def test_pizza_sklearn_solution_grades(sandbox, pizza_task):
    r = sandbox.run(programs.PIZZA_SKLEARN, pizza_task, NORMAL)
    assert r.status is Status.OK, r.stderr_tail
    assert 0.5 < r.duration_s <= r.extra["wall_s"] + 0.5
    g = grade(pizza_task, r.submission_path)
    assert g.valid, g.reason
    assert 0.6 < g.score < 1.0
    assert sandbox.client.containers.list(all=True, filters={"id": r.extra["container"]}) == []


def test_fork_bomb(sandbox, pizza_task):
    r = sandbox.run(programs.FORK_BOMB, pizza_task, CLOCK)
    assert r.status in (Status.TIMEOUT, Status.KILLED)
    _normal_run_works(sandbox, pizza_task)


def test_allocate_50gb(sandbox, pizza_task):
    litter = Path.cwd() / "oom"  # conmon's OOM marker, once left in the service's working directory (the repo)
    existed = litter.exists()
    r = sandbox.run(programs.ALLOCATE_50GB, pizza_task, HOSTILE)
    assert r.status is Status.OOM, (r.status, r.exit_code, r.stderr_tail[-300:])
    assert "allocated 1000 MB" not in r.stdout_tail
    assert existed or not litter.exists()  # nothing written where the learner runs
    _normal_run_works(sandbox, pizza_task)


def test_sleep_past_timeout(sandbox, pizza_task):
    r = sandbox.run(programs.SLEEP_PAST_TIMEOUT, pizza_task, CLOCK)
    assert r.status is Status.TIMEOUT
    assert r.extra["wall_s"] < CLOCK.timeout_s + 10
    _normal_run_works(sandbox, pizza_task)


def test_no_network(sandbox, pizza_task):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    try:
        code = programs.CONNECT_HOST_LOOPBACK.replace("PORT", str(listener.getsockname()[1]))
        r = sandbox.run(code + programs.LIST_INTERFACES, pizza_task, HOSTILE)
        assert r.status is Status.OK, r.stderr_tail
        assert "connect failed" in r.stdout_tail
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    flags = json.loads(next(x for x in r.stdout_tail.splitlines() if x.startswith("IFACES "))[7:])
    assert set(flags) <= {"lo"}
    _normal_run_works(sandbox, pizza_task)


def test_private_answers_shadow_and_writes_outside(sandbox, pizza_task):
    paths = [str(pizza_task.answers_path), str(pizza_task.private_dir), "/work", "/root"]
    code = programs.READ_PRIVATE.replace("PATHS", repr(paths)) + programs.READ_SHADOW
    code += programs.WRITE_OUTSIDE.replace("TMPNAME", "x")
    r = sandbox.run(code, pizza_task, HOSTILE)
    assert r.status is Status.OK, r.stderr_tail
    assert "FOUND" not in r.stdout_tail and r.stdout_tail.count("absent:") == len(paths)
    assert "root:" not in r.stdout_tail
    wrote = [x for x in r.stdout_tail.splitlines() if x.startswith("WROTE")]
    assert wrote == ["WROTE /tmp/x"], wrote
    _normal_run_works(sandbox, pizza_task)


def test_settings_reach_the_docker_sandbox(docker_url, pizza_task, tmp_path):
    # docker_url: without it the SDK would look for DOCKER_HOST / a local Docker, and there is none here
    settings = ExecutorSettings(backend="docker", docker_url=docker_url, max_work_mb=256)
    sb = make_sandbox(settings, work_root=tmp_path / "work", out_root=tmp_path / "results")
    assert isinstance(sb, DockerSandbox) and sb.image == settings.image and sb.venv == default_venv()
    r = sb.run(programs.FILL_DISK, pizza_task, HOSTILE)  # 64 files of 48 MB against a 256 MB work dir cap
    assert r.status is Status.KILLED and r.extra["killed_reason"] == "disk", (r.status, r.stderr_tail[-300:])
    assert "file 63" not in r.stdout_tail


def test_a_write_after_the_program_exited_is_never_graded(docker_url, pizza_task):
    """The program is the container's pid 1 (it was `timeout`'s child): a detached child that rewrites
    submission.csv once it is gone dies with it, every time (3 runs in 40 had the child's file or a truncated one).
    The sandbox's own roots (none named here) are gone once it closes."""
    sb = make_sandbox(ExecutorSettings(backend="docker", docker_url=docker_url))
    try:
        outcomes = graded_outcomes(sb, pizza_task, programs.LATE_WRITER, HOSTILE, runs=10)
    finally:
        sb.close()
    assert len(outcomes) == 1, outcomes
    status, submission, _, _ = next(iter(outcomes))
    assert status is Status.OK and submission == programs.LATE_WRITER_MAIN_SUBMISSION
    assert sb.roots.temporary is not None and not sb.roots.temporary.exists()


def _gated(gate: str) -> str:
    """programs.NORMAL once the test has created `gate` in the task's public dir."""
    return f"import os, time\nwhile not os.path.exists({gate!r}):\n    time.sleep(0.05)\n" + programs.NORMAL


def test_an_api_failure_mid_wait_is_retried_not_a_timeout(docker_url, pizza_task, tmp_path):
    """The connection of the container's wait call is reset while the program runs (the Podman service
    behind the proxy and every other call keep working). That is the executor's failure: the run is
    retried, not reported as a TIMEOUT the agent is punished for."""
    gate = pizza_task.public_dir / f"gate_{tmp_path.name}"
    with UnixProxy(docker_url, tmp_path / "api.sock") as proxy:
        settings = ExecutorSettings(backend="docker", slots=1, docker_url=proxy.url)
        fleet = local_fleet(settings, work_root=tmp_path / "work", out_root=tmp_path / "results")
        try:
            future = fleet.submit(_gated(data_mount(pizza_task.id) + gate.name), pizza_task, NORMAL)
            assert proxy.wait_seen.wait(120)  # the program runs (held by the gate), its wait call is in flight
            assert proxy.reset_waits() == 1
            gate.touch()
            r = future.result(timeout=300)
        finally:
            fleet.close()
            gate.unlink(missing_ok=True)
    assert r.status is Status.OK, (r.status, r.stderr_tail[-500:])
    # the reset reaches requests as a ConnectionError, or as a ChunkedEncodingError once the response has begun
    assert r.extra["attempts"] == 2 and re.match(RESET_ERRORS, r.extra["retried_after"]), r.extra
    assert r.submission_path is not None and r.submission_path.is_file()


def test_an_api_that_keeps_failing_is_infra(docker_url, pizza_task, tmp_path):
    """Every wait call's connection is reset: after the retry the result is INFRA (never trained on)."""
    with UnixProxy(docker_url, tmp_path / "api.sock", reset_every_wait=True) as proxy:
        settings = ExecutorSettings(backend="docker", slots=1, docker_url=proxy.url)
        with local_fleet(settings, work_root=tmp_path / "work", out_root=tmp_path / "results") as fleet:
            r = fleet.submit(programs.NORMAL, pizza_task, NORMAL).result(timeout=300)
        assert proxy.waits_reset == 2
    assert r.status is Status.INFRA and r.infra_failure, (r.status, r.stderr_tail)
    assert r.extra["attempts"] == 2 and re.match(RESET_ERRORS, r.extra["infra_error"]), r.extra
