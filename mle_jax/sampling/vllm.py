"""The vLLM sampler backend: `VLLMSampler`, a `Sampler` over one or more OpenAI-compatible vLLM servers
(`mle_jax.sampling.vllm_server.VLLMServer`; several: `mle_jax.sampling.servers.ServerPool` routes between them and
outlives their deaths), with in-place weight sync to every server.

`generate` sends `POST /v1/completions` with token-id prompts; `sync()` writes the policy as HF
safetensors with `mle_jax.models.hf.write_weights` and has the running server load them
(`VLLMServer.reload_weights`). By default the caller waits only for the weights' HF layouts to be made on
the device and copied to host memory (`hf.hf_host_tensors`); writing the file and the reload run in a
background thread while generation goes on with the previous weights (`background_sync=False`: all of it
before `sync` returns). bench/weight_sync.py measures each part at 3B. `sync_source="shm"` hands the host copy to
the servers of this host through shared memory instead of a file (`mle_jax.sampling.shm_sync`).

Behaviour logprobs: the server is started with `--logprobs-mode processed_logprobs`, so the logprob
vLLM returns for a sampled token is log-softmax(logits / temperature) after top-k/top-p masking, i.e.
the log-probability under the distribution the token was actually drawn from. With top_p=1 and
top_k=-1 (the paper's setting) that is exactly the protocol's log-softmax(logits / temperature),
and what JaxSampler returns (tests/sampling/test_vllm.py checks it against our JAX Qwen2 to 1e-3).
With top_p < 1 or top_k > 0 the two backends differ: vLLM renormalises over the kept tokens
(no vLLM mode gives temperature-scaled but untruncated logprobs), JaxSampler does not; `generate`
warns once. vLLM's default (`raw_logprobs`) would ignore the temperature. For temperature 0
(greedy) vLLM returns log-softmax(logits).
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import tempfile
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jax
import numpy as np
from flax import nnx

from mle_jax.models.hf import hf_device_tensors, hf_host_tensors, write_weights
from mle_jax.models.safetensors_io import write_safetensors
from mle_jax.models.tokenizer import stop_token_ids
from mle_jax.sampling.protocol import Completion, SamplingSettings, check_completion
from mle_jax.sampling.servers import ServerPool
from mle_jax.sampling.shm_sync import SharedWeights
from mle_jax.sampling.vllm_server import VLLMServer, VLLMServerError
from mle_jax.sampling.vllm_worker import is_orbax_item


def weights_folder(params: Any, out_dir: Path) -> Path:
    """The HF folder the server should load for `params`; writes it unless params already is one.

    params: our Qwen2ForCausalLM, an nnx.State of it or its nnx.to_pure_dict (written by
    `mle_jax.models.hf.write_weights`); a flat {HF tensor name: array} mapping (written as is); or an HF
    folder path or the learner's orbax checkpoint item (`<ckpt>/<step>/learner`; used as is, nothing written: the
    worker reads either, `vllm_worker.iter_weights`). Multi-host: every process calls it; process 0 writes.
    """
    if isinstance(params, (str, Path)):
        src = Path(params)
        if not (any(src.glob("*.safetensors")) or is_orbax_item(src)):
            raise FileNotFoundError(f"{src} has no *.safetensors files and is no orbax checkpoint item")
        return src
    nested = isinstance(params, Mapping) and any(isinstance(v, (Mapping, nnx.Variable)) for v in params.values())
    if isinstance(params, (nnx.Module, nnx.State)) or nested:  # nnx states may become plain dicts
        return write_weights(params, out_dir)
    if isinstance(params, Mapping):
        if jax.process_index() == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
            write_safetensors(out_dir / "model.safetensors", {str(k): np.asarray(v) for k, v in params.items()})
        return out_dir
    raise TypeError(
        "sync() takes our Qwen2 model, an nnx.State of it, a {HF name: array} mapping, an HF folder or an orbax item,"
        f" got {type(params).__name__}"
    )


def _completion(prompt: Sequence[int], choice: Mapping[str, Any], version: int, server: str = "") -> Completion:
    """One OpenAI completion choice (with return_token_ids and logprobs=0) as a `Completion` of `server`'s weights
    of `version`."""
    token_ids = np.asarray(choice["token_ids"], dtype=np.int32)
    logprobs = np.asarray(choice["logprobs"]["token_logprobs"], dtype=np.float32)
    if logprobs.shape != token_ids.shape:
        raise VLLMServerError(f"{token_ids.shape} tokens but {logprobs.shape} logprobs in {choice}")
    return check_completion(
        Completion(
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            token_ids=token_ids,
            logprobs=logprobs,
            text=choice["text"],
            finish_reason="stop" if choice["finish_reason"] == "stop" else "length",
            version=version,
            server=server,
        )
    )


def server_problems(url: str, what: str) -> list[str]:
    """[] when a vLLM server answers `GET url/health`, else one line saying how to start one (what: the config
    field that holds url)."""
    fix = (
        "start one with launch/vllm_server.sh MODEL_DIR PORT (launch/gpu_node.sh starts both), "
        "or pass --config.sampler.backend=jax"
    )
    if not url:
        return [f"{what} is empty but sampler.backend=vllm: {fix}"]
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5) as r:
            if r.status == 200:
                return []
    except (urllib.error.URLError, OSError):
        pass
    return [f"no vLLM server answers at {what}={url}: {fix}"]


class VLLMSampler:
    """`Sampler` over vLLM OpenAI servers.

    server: a `VLLMServer`, or the URL of a running one (e.g. from launch/vllm_server.sh), or a list of these: the
    servers of a pool (`servers.ServerPool`): each prompt's n samples go to the least-loaded live server, every sync
    to every server, and each `Completion` records the server and the weights' version that produced it.
    tokenizer: optional HF tokenizer; its eos and ChatML stop tokens (<|im_end|>, <|endoftext|>)
    become the stop ids. eos_ids: explicit stop ids instead (at least one is needed); sent as
    stop_token_ids, the stop token is kept at the end of `token_ids`.
    export_dir: where `sync` writes weight exports (one folder per version, the previous one deleted
    after a successful reload); it must be readable by the server's workers (same node or shared FS).
    Multi-host: call `sync` on every process (sharded params are gathered); process 0 writes and
    triggers the reload (in the foreground: the gathers are collectives of all processes).
    sync_source: "hf" (or "orbax": the loop passes a checkpoint item, a folder like any other) writes our params as
    safetensors; "shm" hands them to the servers through a shared-memory segment of this host (one process only;
    folders given to `sync` are still loaded as folders).
    background_sync: `sync` returns once the weights are in host memory; the export and the reload run in a
    thread (a request meanwhile is served by the previous weights and tagged with their version). The next
    `sync` or `wait_sync()` waits for it and raises its error, if any.
    ignore_eos: every completion runs to max_tokens, stop tokens ignored (vLLM's ignore_eos): equal work for a
    throughput benchmark, never for sampling a policy.
    server_wait_s: a server that dies (connection refused or reset, an engine error) is taken out and every request
    that was in flight on it sent again to the others; with none left, a request waits this long for one to answer
    /health again (restarted by its supervisor, or a replacement at the same URL). A server that comes back is first
    given the weights last synced (a restarted server serves the model it was started with). 0: fail at once when
    no server is left.
    """

    name = "vllm"  # its sampler.backend (sampling/registry.py)

    @classmethod
    def from_settings(
        cls,
        settings: Any,
        model: Any,
        tokenizer: Any,
        workdir: Path,
        url: str | None = None,
        frozen: bool = False,
    ) -> VLLMSampler:
        """The sampler over the servers at `settings.urls` (sampler.vllm_urls, or sampler.vllm_url alone) or at `url`
        (the instrumenter's); it holds its own copy of the weights, so `model` and `frozen` change nothing. Weight
        syncs are written under workdir/vllm_export."""
        urls = list(settings.urls) if url is None else [url]
        if not urls or not all(urls):
            raise ValueError(
                "sampler.backend='vllm' needs --config.sampler.vllm_url or sampler.vllm_urls (and instrument.vllm_url"
                " for the frozen instrumenter); launch/gpu_node.sh starts the servers"
            )
        sync_source = getattr(settings, "sync_source", "hf")
        return cls(urls, tokenizer, export_dir=Path(workdir) / "vllm_export", sync_source=sync_source)

    @classmethod
    def preflight(cls, settings: Any, instrumenter_url: str | None) -> list[str]:
        """A vLLM server answers at every URL of sampler.vllm_urls (or at sampler.vllm_url), and at
        instrument.vllm_url for an LM instrumenter."""
        urls = list(settings.urls)
        if len(urls) > 1:
            problems = [p for i, u in enumerate(urls) for p in server_problems(u, f"sampler.vllm_urls[{i}]")]
        else:
            problems = server_problems(urls[0] if urls else "", "sampler.vllm_url")
        if getattr(settings, "sync_source", "hf") == "shm":
            problems += [
                f"sampler.sync_source=shm hands the weights over in this host's memory, but {u} is not on this host:"
                " use sync_source=hf (files on shared storage) for servers elsewhere"
                for u in urls
                if not _on_this_host(u)
            ]
        if instrumenter_url is not None:
            problems += server_problems(instrumenter_url, "instrument.vllm_url")
        return problems

    @classmethod
    def memory(cls, settings: Any, samplers: int, device_memory_gib: float, decode_gib: float) -> dict[str, Any]:
        """Its device memory: each server takes sampler.vllm_gpu_memory_utilization of the device."""
        return {
            "servers_per_device": samplers,
            "gpu_memory_utilization": settings.vllm_gpu_memory_utilization,
            "gib": samplers * settings.vllm_gpu_memory_utilization * device_memory_gib,
            "method": "vllm servers: sampler.vllm_gpu_memory_utilization x device memory, each",
        }

    def __init__(
        self,
        server: VLLMServer | str | Sequence[VLLMServer | str],
        tokenizer: Any = None,
        eos_ids: Sequence[int] | None = None,
        export_dir: str | Path | None = None,
        version: int = 0,
        request_timeout_s: float = 3600.0,
        max_concurrent_requests: int = 64,
        background_sync: bool = True,
        ignore_eos: bool = False,
        server_wait_s: float = 900.0,
        sync_source: str = "hf",
    ) -> None:
        if eos_ids is None:
            eos_ids = stop_token_ids(tokenizer) if tokenizer is not None else []
        if not eos_ids:
            raise ValueError("VLLMSampler needs stop tokens: pass a tokenizer or eos_ids (EOS / <|im_end|>)")
        servers = [server] if isinstance(server, (str, VLLMServer)) else list(server)
        self.pool = ServerPool([VLLMServer.attach(s) if isinstance(s, str) else s for s in servers], version,
                               wait_s=server_wait_s)  # fmt: skip
        self.tokenizer = tokenizer
        self.eos_ids = sorted({int(t) for t in eos_ids})
        self.export_dir = Path(export_dir) if export_dir is not None else None  # None: a temp dir at first sync
        self.version = version
        self.request_timeout_s = request_timeout_s
        self.max_concurrent_requests = max_concurrent_requests
        self._last_export: Path | None = None
        self.background_sync = background_sync
        self.sync_source = sync_source
        self._last_shared: SharedWeights | None = None  # the segment the servers hold (kept for a returning one)
        self._spare: SharedWeights | None = None  # the one before: the next shm sync refills it
        self._sync_thread: threading.Thread | None = None
        self._sync_error: BaseException | None = None
        self.ignore_eos = ignore_eos  # every completion runs to max_tokens: a throughput benchmark's equal work

    @property
    def server(self) -> VLLMServer:
        """The first server of the pool (the only one, in a one-server run)."""
        return self.pool.replicas[0].server

    @property
    def server_wait_s(self) -> float:
        return self.pool.wait_s

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        """{"server", "outage_s", "weights"} per server that came back, for the run's records."""
        return self.pool.recoveries

    def close(self) -> None:
        """Stops watching dead servers and removes the shared-memory segment of the last sync (the servers
        themselves are not ours to stop). A background sync still running is waited for; its error, if any, printed
        (close runs on the way out, where another error may be the one to raise)."""
        if self._sync_thread is not None:
            self._sync_thread.join()
            self._sync_thread = None
        if self._sync_error is not None:
            print(f"the last weight sync failed: {self._sync_error}", flush=True)
            self._sync_error = None
        self.pool.close()
        for shared in (self._last_shared, self._spare):
            if shared is not None:
                shared.unlink()
        self._last_shared = self._spare = None

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
        SamplingSettings(temperature, top_p, top_k, max_tokens)  # validates
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if temperature > 0 and (top_p < 1 or top_k > 0):
            warnings.warn(
                "vLLM logprobs with top_p < 1 or top_k > 0 are renormalised over the kept tokens, "
                "not the protocol's full log-softmax(logits / T) that the learner recomputes",
                stacklevel=2,
            )
        body = {
            "n": n,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k) if top_k > 0 else 0,  # vLLM: 0 disables
            "max_tokens": int(max_tokens),
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "stop_token_ids": [] if self.ignore_eos else self.eos_ids,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": True,
        }

        def one(i: int) -> list[Completion]:
            prompt = [int(t) for t in prompts[i]]

            def request(server: VLLMServer) -> dict[str, Any]:  # on the least-loaded live server (ServerPool.call)
                context = server.max_model_len()  # a server dead before its first request: re-sent like any request
                if len(prompt) >= context:
                    raise ValueError(f"prompt {i} has {len(prompt)} tokens; the server's max_model_len is {context}")
                # the response is cut where the context ends (finish_reason "length")
                req = dict(body, model=server.served_model_name, prompt=prompt,
                           max_tokens=min(int(max_tokens), context - len(prompt)))  # fmt: skip
                if seed is not None:
                    req["seed"] = int(seed) + i * n
                return server.post("/v1/completions", json=req, timeout_s=self.request_timeout_s)

            out, lease = self.pool.call(request, samples=n)  # the group's n samples on one server
            choices = sorted(out["choices"], key=lambda c: c["index"])
            if len(choices) != n:
                raise VLLMServerError(f"prompt {i}: asked for {n} completions, got {len(choices)}")
            # the version of the weights the server held when the request was sent (a sync during it: reload_weights)
            return [_completion(prompt, c, lease.version, lease.replica.url) for c in choices]

        if len(prompts) == 1:
            return one(0)
        with ThreadPoolExecutor(max_workers=min(len(prompts), self.max_concurrent_requests)) as pool:
            return [c for group in pool.map(one, range(len(prompts))) for c in group]

    def sync(self, params: Any, version: int) -> None:
        """Exports params as HF safetensors (sync_source "shm": a shared-memory segment) and reloads them into every
        running server; tags `version`.

        With background_sync (single process, params not already a folder): returns after copying the
        weights to host memory; the export (or the copy into shared memory) and the reload finish in a thread
        (`wait_sync`).
        """
        self.wait_sync()
        if self.export_dir is None:
            self.export_dir = Path(tempfile.mkdtemp(prefix="vllm-sync-"))
        if isinstance(params, nnx.Module):
            params = nnx.state(params, nnx.Param)
        ours = isinstance(params, nnx.State) or (
            isinstance(params, Mapping) and any(isinstance(v, (Mapping, nnx.Variable)) for v in params.values())
        )  # our model's params (written by hf.write_weights); folders and HF-named mappings go in the foreground
        shared = self.sync_source == "shm" and not isinstance(params, (str, Path))
        if shared and jax.process_count() > 1:
            raise ValueError("sampler.sync_source=shm moves weights within one host; a multi-process run syncs by hf")
        if not shared and (not (self.background_sync and ours) or jax.process_count() > 1):
            self._export_and_reload(params, version)
            return
        # the one part the caller waits for: HF layouts made on the device, then every tensor copied to host (shm
        # from an accelerator: straight into the shared-memory segment; on CPU the device arrays are host memory, and
        # the host "copy" is views of them: the copy into the segment runs in the thread)
        if shared:
            tensors = hf_device_tensors(params) if ours else _flat_host_tensors(params)
            if _on_cpu(tensors):
                host: Any = dict(jax.device_get(tensors))
            else:
                host, self._spare = SharedWeights.write(tensors, spare=self._spare), None
        else:
            host = hf_host_tensors(params)
        apply = self._load_shared if shared else self._export_and_reload
        if not self.background_sync:
            apply(host, version)
            return

        def run() -> None:
            try:
                apply(host, version)
            except BaseException as e:  # noqa: BLE001 (re-raised by wait_sync in the caller's thread)
                self._sync_error = e

        self._sync_thread = threading.Thread(target=run, name=f"vllm-sync-v{version}", daemon=True)
        self._sync_thread.start()

    def wait_sync(self) -> None:
        """Blocks until a background sync has finished; raises the error it ended with."""
        if self._sync_thread is not None:
            self._sync_thread.join()
            self._sync_thread = None
        if self._sync_error is not None:
            error, self._sync_error = self._sync_error, None
            raise error

    def _load_shared(self, shared: SharedWeights | Mapping[str, np.ndarray], version: int) -> None:
        """A shared-memory segment (or {HF name: host array} to put in the spare one) loaded by every live server; the
        segment they held before becomes the spare (the new one is removed if they failed)."""
        if not isinstance(shared, SharedWeights):
            shared, self._spare = SharedWeights.write(shared, spare=self._spare), None
        try:
            self.pool.load(shared, version, _load_segment)
        except BaseException:
            shared.unlink()
            raise
        self.version = version
        self._spare, self._last_shared = self._last_shared, shared

    def _export_and_reload(self, params: Any, version: int) -> None:
        target = self.export_dir / f"v{version:08d}"
        leader = jax.process_index() == 0  # the other hosts only join the export's gathers: the folder (on storage
        # every host shares) is process 0's to write, reload and remove
        if leader and target.exists():
            shutil.rmtree(target)
        hf_dir = weights_folder(params, target)
        if leader:  # every live server (a dead one gets them when it is back; none left: waited for)
            self.pool.load(hf_dir, version, _reload_folder)
        self.version = version
        if not leader:
            return
        if self._last_export is not None and self._last_export != hf_dir and self._last_export.exists():
            shutil.rmtree(self._last_export, ignore_errors=True)
        self._last_export = hf_dir if hf_dir == target else None


def _reload_folder(server: VLLMServer, folder: Path, version: int) -> None:
    """A pool's reload (`ServerPool.load`) of an HF folder or an orbax item."""
    server.reload_weights(folder, version)


def _load_segment(server: VLLMServer, shared: SharedWeights, version: int) -> None:
    """A pool's reload (`ServerPool.load`) of a shared-memory segment of this host."""
    server.load_shared(shared.name, shared.manifest_json(), version)


def _flat_host_tensors(params: Any) -> dict[str, np.ndarray]:
    """{HF name: host array} of a flat mapping (what `weights_folder` writes as is); anything else is a TypeError."""
    if not isinstance(params, Mapping):
        raise TypeError(f"sync() takes our Qwen2 model, an nnx.State of it or a {{HF name: array}} mapping, got "
                        f"{type(params).__name__}")  # fmt: skip
    return {str(k): np.asarray(v) for k, v in params.items()}


def _on_this_host(url: str) -> bool:
    """Whether the server at `url` runs on this machine (loopback, or one of this host's names)."""
    host = urlparse(url).hostname or ""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _on_cpu(tensors: Mapping[str, Any]) -> bool:
    """Whether every array of `tensors` is in host memory already (numpy, or jax arrays on CPU devices)."""
    return all(not isinstance(x, jax.Array) or all(d.platform == "cpu" for d in x.devices()) for x in tensors.values())
