"""A VLLMSampler over several servers (sampling/servers.py ServerPool), against loopback stand-ins (stand_in.py):
each prompt's group goes whole to the least-loaded server, a server killed mid-run costs no sample (its requests are
re-sent to the others, nothing waits for it), every sync reaches every live server, and a server that comes back is
given the weights last synced before it serves again. The real two-server run: tests/sampling/test_vllm_pool.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from mle_jax.run.dry_run import plan_lines
from mle_jax.run.settings import SamplerSettings, from_config
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer, VLLMServerError, free_port
from tests.sampling.stand_in import StandIn


def folder(root: Path, name: str) -> Path:
    """A weights folder as the sampler passes it to the servers (read by the stand-in as a name only)."""
    path = root / name
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    return path


def pool_of(*ports: int, wait_s: float = 30.0) -> VLLMSampler:
    return VLLMSampler([VLLMServer(f"http://127.0.0.1:{p}") for p in ports], eos_ids=[2], server_wait_s=wait_s)


def wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_each_group_goes_whole_to_the_least_loaded_server():
    ports = free_port(), free_port()
    servers = [StandIn(p, delay_s=1.0) for p in ports]  # slow enough that all six requests are out at once
    sampler = pool_of(*ports)
    try:
        prompts = [[10 + i] for i in range(6)]
        out = sampler.generate(prompts, n=3, max_tokens=4)
        assert len(out) == 18 and [c.prompt_ids.tolist() for c in out] == [p for p in prompts for _ in range(3)]
        urls = [sampler.pool.urls[0], sampler.pool.urls[1]]
        for g in range(6):  # a group's three samples came from one request on one server
            group = out[3 * g : 3 * g + 3]
            assert len({c.server for c in group}) == 1 and group[0].server in urls
            assert [group[0].prompt_ids.tolist()] == [p for s in servers for p in s.prompts if p == prompts[g]]
        assert [s.requests for s in servers] == [3, 3]  # least-loaded: three groups each
        # one request at a time: the tie goes to the server sent less so far, so both take turns
        for s in servers:
            s.delay_s = 0.0
        firsts = [sampler.generate([[1]], max_tokens=2)[0].server for _ in range(4)]
        assert sorted(firsts) == sorted(urls * 2)
    finally:
        sampler.close()
        for s in servers:
            s.kill()


def test_a_server_killed_mid_run_costs_no_sample_and_comes_back_with_the_weights_last_synced(tmp_path):
    ports = free_port(), free_port()
    first, second = StandIn(ports[0], delay_s=2.0), StandIn(ports[1], delay_s=2.0)
    sampler = pool_of(*ports)
    url_first, url_second = sampler.pool.urls
    try:
        v1 = folder(tmp_path, "v1")
        sampler.sync(v1, version=1)  # every sync to every server, each told its version
        assert [s.reloads for s in (first, second)] == [[str(v1.resolve())]] * 2
        assert sampler.pool.versions() == {url_first: 1, url_second: 1}
        assert [VLLMServer(u).weights_version() for u in (url_first, url_second)] == [1, 1]

        out: dict = {}
        thread = threading.Thread(target=lambda: out.setdefault("c", sampler.generate([[1], [2], [3], [4]], n=2)))
        thread.start()
        assert wait_for(lambda: first.requests == 2 and second.requests == 2)
        first.kill()  # its two requests in flight get a reset: re-sent to the second server at once
        thread.join(30)
        assert not thread.is_alive()
        completions = out["c"]
        assert [c.prompt_ids.tolist() for c in completions] == [[p] for p in (1, 2, 3, 4) for _ in range(2)]
        assert {c.server for c in completions} == {url_second} and {c.version for c in completions} == {1}
        assert all(c.text == str(v1.resolve()) for c in completions)
        assert second.requests == 4 and sampler.recoveries == []  # nothing waited for the dead server
        assert sampler.pool.versions() == {url_first: None, url_second: 1}

        v2 = folder(tmp_path, "v2")
        sampler.sync(v2, version=2)  # the live server only; the dead one gets it when it is back
        assert sampler.version == 2 and second.version == 2
        back = StandIn(ports[0])  # restarted at its URL, serving its start-up model
        assert wait_for(lambda: sampler.pool.versions() == {url_first: 2, url_second: 2})
        assert back.reloads == [str(v2.resolve())] and back.version == 2  # the weights last synced, not v1
        assert [VLLMServer(u).weights_version() for u in (url_first, url_second)] == [2, 2]
        assert [r["server"] for r in sampler.recoveries] == [url_first]
        back.delay_s = second.delay_s = 1.0  # both requests out at once: one on each server
        again = sampler.generate([[5], [6]], max_tokens=2)
        assert {c.server for c in again} == {url_first, url_second} and {c.version for c in again} == {2}
        assert all(c.text == str(v2.resolve()) for c in again)
        back.kill()
    finally:
        sampler.close()
        second.kill()


def test_with_no_server_left_a_request_fails_at_once_when_told_not_to_wait():
    ports = free_port(), free_port()
    servers = [StandIn(p) for p in ports]
    sampler = pool_of(*ports, wait_s=0)
    try:
        sampler.generate([[1], [2]], max_tokens=2)
        servers[0].kill()
        assert {c.server for c in sampler.generate([[1], [2]], max_tokens=2)} == {sampler.pool.urls[1]}
        servers[1].kill()
        with pytest.raises(VLLMServerError, match=r"every vLLM server .* died"):
            sampler.generate([[1]], max_tokens=2)
    finally:
        sampler.close()


def test_preflight_and_the_dry_run_name_every_server(tmp_path):
    from configs import pizza

    port = free_port()
    server = StandIn(port)
    try:
        ok, dead = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"
        problems = VLLMSampler.preflight(SamplerSettings(vllm_urls=(ok, dead)), None)
        assert problems == [f"no vLLM server answers at sampler.vllm_urls[1]={dead}: " + problems[0].split(": ", 1)[1]]
        assert VLLMSampler.preflight(SamplerSettings(vllm_url=ok), None) == []
        assert "sampler.vllm_url is empty" in VLLMSampler.preflight(SamplerSettings(), None)[0]
    finally:
        server.kill()
    cfg = pizza.get_config("cpu")
    cfg.sampler.backend = "vllm"
    cfg.sampler.vllm_urls = (ok, dead)
    [line] = [x for x in plan_lines(from_config(cfg), ["cpu"]) if x.startswith("sampler:")]
    assert f"on 2 servers, each group to the least-loaded ({ok}, {dead})" in line
