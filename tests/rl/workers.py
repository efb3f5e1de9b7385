"""Subprocess entry points for tests that need their own JAX runtime (fake devices, several processes,
SIGKILL). Run as `python -m tests.rl.workers MODE ...` from the repo root; prints/writes results."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tests.xla_flags import with_device_count


def _setup_runtime(n_devices: int, cache_dir: str | None) -> None:
    os.environ["XLA_FLAGS"] = with_device_count(n_devices)
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


LAYOUTS = {"single": (1, 1, 1), "fsdp": (1, 4, 1), "tensor": (1, 1, 4)}


def _host_params(learner):
    import jax
    from jax.experimental import multihost_utils

    params, specs = {}, {}
    for name, tree in (("policy", learner.state.policy), ("value", learner.state.value)):
        for path, x in jax.tree_util.tree_leaves_with_path(tree):
            key = name + jax.tree_util.keystr(path)
            specs[key] = str(x.sharding.spec)
            full = multihost_utils.process_allgather(x, tiled=True) if jax.process_count() > 1 else x
            params[key] = jax.device_get(full)
    return params, specs


def _run_updates(mesh_shape, devices=None, steps: int = 2):
    """Fresh tiny learner on a mesh, `steps` updates; returns (metrics per step, initial and final host
    params, param shardings)."""
    from mle_jax.rl.learner import Learner
    from tests.rl.tiny import learner_config, linear_adam, make_models, mesh, random_batch

    learner = Learner(linear_adam(learner_config()), *make_models(0), mesh=mesh(mesh_shape, devices))
    init, _ = _host_params(learner)
    metrics = [learner.update(random_batch(10 + i)) for i in range(steps)]
    params, specs = _host_params(learner)
    return metrics, init, params, specs


def sharded(args) -> None:
    _setup_runtime(4, args.cache_dir)
    import jax
    import numpy as np

    assert jax.device_count() == 4, jax.devices()
    out = {}
    for name in args.layouts.split(","):
        devices = jax.devices()[:1] if name == "single" else None
        metrics, init, params, specs = _run_updates(LAYOUTS[name], devices)
        out[name] = {"metrics": metrics, "specs": specs}
        np.savez(os.path.join(args.out, f"{name}.npz"), **params)
        np.savez(os.path.join(args.out, f"{name}_init.npz"), **init)
    with open(os.path.join(args.out, "sharded.json"), "w") as f:
        json.dump(out, f)


def multihost(args) -> None:
    _setup_runtime(2, args.cache_dir)
    import jax
    import numpy as np

    from mle_jax.infra.sharding import maybe_initialize_distributed

    assert maybe_initialize_distributed(f"127.0.0.1:{args.port}", 2, args.process_id)
    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    # a multi-process CPU run compiles its own programs: executables from the persistent cache ran their gloo
    # collectives out of step (infra/sharding.maybe_initialize_distributed)
    assert not jax.config.jax_enable_compilation_cache
    metrics, _, params, specs = _run_updates(LAYOUTS["fsdp"])
    if jax.process_index() == 0:
        np.savez(os.path.join(args.out, "multihost.npz"), **params)
        with open(os.path.join(args.out, "multihost.json"), "w") as f:
            json.dump({"metrics": metrics, "specs": specs}, f)
    jax.distributed.shutdown()


def _big_batch(b: int = 32, prompt: int = 100, response: int = 8000):
    """A RolloutBatch of random tokens and logprobs, about 1.6 MB as the channel encodes it."""
    import numpy as np

    from mle_jax.rl.batch import RolloutBatch

    rng = np.random.default_rng(0)
    return RolloutBatch.from_sequences(
        prompt_ids=[rng.integers(1, 150000, prompt).tolist() for _ in range(b)],
        response_ids=[rng.integers(1, 150000, response).tolist() for _ in range(b)],
        logprobs=[(-rng.random(response)).tolist() for _ in range(b)],
        rewards=rng.normal(size=b).tolist(),
        durations_s=(rng.random(b) * 100).tolist(),
        versions=list(range(b)),
        pad_to=prompt + response,
        group_ids=[i // 4 for i in range(b)],
        task_ids=[i % 3 for i in range(b)],
    )


def channel(args) -> None:
    """The leader/follower split of rl/hosts.py on 2 processes x 2 devices over a real jax.distributed store:
    process 0 publishes a 1.6 MB batch the follower only compares, then each training batch (after a delay longer
    than the follower's poll) and trains on it, process 1
    trains on what it receives through `follow`; both checkpoint each step. Then the leader aborts while the
    follower waits for a third batch. Each process writes what it saw to channel_<i>.json (+ params of 0)."""
    _setup_runtime(2, args.cache_dir)
    import time

    import jax
    import numpy as np

    from mle_jax.infra.checkpoint import Checkpointer
    from mle_jax.infra.sharding import maybe_initialize_distributed
    from mle_jax.rl.hosts import BatchChannel, LeaderAborted, distributed_store, follow
    from mle_jax.rl.learner import Learner
    from tests.rl.tiny import learner_config, linear_adam, make_models, mesh, random_batch

    assert maybe_initialize_distributed(f"127.0.0.1:{args.port}", 2, args.process_id)
    learner = Learner(linear_adam(learner_config()), *make_models(0), mesh=mesh(LAYOUTS["fsdp"]))
    ckpt = Checkpointer(os.path.join(args.out, "ckpt"), keep=3)
    chan = BatchChannel(distributed_store(), poll_ms=1000)
    out = {"process": jax.process_index()}
    big = _big_batch()  # more than one 1 MiB part in the store
    if jax.process_index() == 0:
        chan.publish(50, big, {"version": 0})
        for step in (1, 2):
            time.sleep(args.delay)  # the follower polls the store meanwhile, in no collective
            batch = random_batch(10 + step - 1)
            chan.publish(step, batch, {"version": step})
            out.setdefault("metrics", []).append(learner.update(batch))
            learner.save(ckpt, step, loop={"counters": {"step": step, "version": step}})
        time.sleep(args.delay)
        chan.abort("RuntimeError: the leader's test abort")
        ckpt.close()
        params, _ = _host_params(learner)  # gathers: the follower joins them after its abort
        np.savez(os.path.join(args.out, "channel.npz"), **params)
    else:

        class Versions:
            seen: list[int] = []

            def sync(self, params, version: int) -> None:
                self.seen.append(version)

        sampler = Versions()
        got, meta = chan.receive(50)
        out["big_equal"] = meta["step"] == 50 and all(
            np.array_equal(getattr(got, name), getattr(big, name))
            for name in ("tokens", "attention_mask", "response_mask", "behaviour_logprobs", "rewards")
        )
        try:
            follow(chan, learner, sampler, ckpt, steps=3)
        except LeaderAborted as e:
            out["aborted"] = str(e)
        out["synced_versions"] = sampler.seen
        out["follower_step"] = learner.step
        ckpt.close()
        _host_params(learner)  # the leader's gather partner
    with open(os.path.join(args.out, f"channel_{jax.process_index()}.json"), "w") as f:
        json.dump(out, f)


def resume(args) -> None:
    """Train `steps` updates, checkpointing after each; with --resume continue from the latest checkpoint.
    Prints one JSON line per finished update: step, metrics, params digest."""
    _setup_runtime(1, args.cache_dir)
    from mle_jax.infra.checkpoint import Checkpointer
    from mle_jax.rl.learner import Learner
    from tests.rl.tiny import learner_config, make_models, mesh, params_digest, random_batch

    learner = Learner(learner_config(), *make_models(0), mesh())
    ckpt = Checkpointer(args.ckpt, keep=2)
    start = 0
    if args.resume:
        found = ckpt.restore_latest({"learner": learner.state_dict()})
        if found is not None:
            step, items = found
            learner.load_state_dict(items["learner"])
            start = items["loop"]["step"]
            assert start == step == learner.step
            print(json.dumps({"resumed_from": start}), flush=True)
    for step in range(start, args.steps):
        metrics = learner.update(random_batch(100 + step))
        ckpt.save(step + 1, {"learner": learner.state_dict(), "loop": {"step": step + 1}})
        line = {"step": step + 1, "metrics": metrics, "digest": params_digest(learner.state)}
        print(json.dumps(line), flush=True)
    ckpt.close()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sharded")
    s.add_argument("--out", required=True)
    s.add_argument("--layouts", default="single,fsdp,tensor")
    s.add_argument("--cache_dir", default=None)
    m = sub.add_parser("multihost")
    m.add_argument("--out", required=True)
    m.add_argument("--port", type=int, required=True)
    m.add_argument("--process_id", type=int, required=True)
    m.add_argument("--cache_dir", default=None)
    c = sub.add_parser("channel")
    c.add_argument("--out", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--process_id", type=int, required=True)
    c.add_argument("--delay", type=float, default=3.0)
    c.add_argument("--cache_dir", default=None)
    r = sub.add_parser("resume")
    r.add_argument("--ckpt", required=True)
    r.add_argument("--steps", type=int, default=5)
    r.add_argument("--resume", action="store_true")
    r.add_argument("--cache_dir", default=None)
    args = p.parse_args(argv)
    {"sharded": sharded, "multihost": multihost, "channel": channel, "resume": resume}[args.mode](args)


if __name__ == "__main__":
    main(sys.argv[1:])
