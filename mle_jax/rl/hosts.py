"""Several JAX processes, one environment: process 0 samples, runs and grades; every process trains.

In a multi-process run (a TPU pod slice, several GPU hosts) the learner's update is one SPMD program over the
global mesh: every process must call it with the same batch at about the same time. Only process 0, the
leader, runs the environment (prompts, sampler, instrumenter, executor fleet, grader). The followers wait for
each step's batch in jax.distributed's key-value store, not inside a collective: a step whose programs run for
an hour must not meet a collective's connect timeout (Gloo's on CPU hosts) or the shutdown barrier. Then they
join the update, the weight sync's gathers and the checkpoint save, as the leader does.

    leader:    batch = ...; channel.publish(step, batch); learner.update(batch); ...; channel.finish()
    follower:  follow(channel, learner, sampler, checkpointer, loop_settings, steps); channel.wait_finished()
"""

from __future__ import annotations

import io
import json
from dataclasses import fields
from typing import Any, Protocol

import numpy as np
from jax._src import distributed  # its key-value client is not public API; jax 0.10 and 0.11 keep it here

from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.learner import Learner

PREFIX = "mle_jax/loop"
PART_BYTES = 1 << 20  # gRPC's default message limit is 4 MiB: a paper-sized batch is sent in 1 MiB parts
POLL_MS = 10_000  # a follower checks for the leader's abort this often while it waits


class KeyValueStore(Protocol):
    """The part of jax.distributed's client (`DistributedRuntimeClient`) the channel uses."""

    def key_value_set_bytes(self, key: str, value: bytes) -> None: ...

    def blocking_key_value_get_bytes(self, key: str, timeout_in_ms: int) -> bytes: ...

    def key_value_try_get_bytes(self, key: str) -> bytes: ...

    def key_value_delete(self, key: str) -> None: ...


class LeaderAborted(RuntimeError):
    """The leader process stopped with an error; the followers stop too."""


def distributed_store() -> KeyValueStore:
    """jax.distributed's key-value client (after `jax.distributed.initialize`)."""
    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized: no key-value store to exchange batches over")
    return client


def encode_batch(batch: RolloutBatch, meta: dict[str, Any]) -> bytes:
    """The batch's arrays (compressed npz) and a JSON-able `meta` dict, as bytes."""
    buf = io.BytesIO()
    arrays = {f.name: getattr(batch, f.name) for f in fields(batch)}
    np.savez_compressed(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    return buf.getvalue()


def decode_batch(data: bytes) -> tuple[RolloutBatch, dict[str, Any]]:
    """Inverse of `encode_batch`."""
    with np.load(io.BytesIO(data)) as z:
        meta = json.loads(z["__meta__"].tobytes().decode())
        batch = RolloutBatch(**{f.name: z[f.name] for f in fields(RolloutBatch)})
    return batch, meta


def _is_missing(e: Exception) -> bool:
    text = str(e)
    return "NOT_FOUND" in text or "DEADLINE_EXCEEDED" in text or "not found" in text.lower()


class BatchChannel:
    """Step batches from the leader to the followers through a key-value store (one writer, many readers)."""

    def __init__(self, store: KeyValueStore, poll_ms: int = POLL_MS):
        self.store, self.poll_ms = store, poll_ms

    # ---- leader --------------------------------------------------------------------------------
    def publish(self, step: int, batch: RolloutBatch, meta: dict[str, Any] | None = None) -> None:
        """Makes step `step`'s batch readable; drops the step before it (every follower has read it: it
        trained on it in the update the leader took part in)."""
        data = encode_batch(batch, {"step": step, **(meta or {})})
        parts = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
        for i, part in enumerate(parts):
            self.store.key_value_set_bytes(f"{PREFIX}/batch/{step}/{i}", part)
        self.store.key_value_set_bytes(f"{PREFIX}/batch/{step}", str(len(parts)).encode())  # last: complete
        self._drop(step - 1)

    def _drop(self, step: int) -> None:
        try:
            n = int(self.store.key_value_try_get_bytes(f"{PREFIX}/batch/{step}").decode())
        except Exception:  # noqa: BLE001 (never published, or dropped already)
            return
        self.store.key_value_delete(f"{PREFIX}/batch/{step}")
        for i in range(n):
            self.store.key_value_delete(f"{PREFIX}/batch/{step}/{i}")

    def finish(self) -> None:
        """The leader's run is over (report written): the followers may exit."""
        self.store.key_value_set_bytes(f"{PREFIX}/done", b"1")

    def abort(self, reason: str) -> None:
        """The leader failed: the followers raise `LeaderAborted` instead of waiting forever."""
        self.store.key_value_set_bytes(f"{PREFIX}/abort", reason.encode()[-2000:])

    # ---- followers -----------------------------------------------------------------------------
    def _wait(self, key: str) -> bytes:
        """The value of `key`, waiting as long as it takes unless the leader aborts."""
        while True:
            try:
                return self.store.blocking_key_value_get_bytes(key, self.poll_ms)
            except Exception as e:
                if not _is_missing(e):
                    raise
            try:
                reason = self.store.key_value_try_get_bytes(f"{PREFIX}/abort")
            except Exception:  # noqa: BLE001 (no abort: keep waiting)
                continue
            raise LeaderAborted(f"the leader process stopped: {reason.decode(errors='replace')}")

    def receive(self, step: int) -> tuple[RolloutBatch, dict[str, Any]]:
        """Step `step`'s batch and the meta the leader sent with it (blocks until published)."""
        n = int(self._wait(f"{PREFIX}/batch/{step}").decode())
        data = b"".join(self.store.blocking_key_value_get_bytes(f"{PREFIX}/batch/{step}/{i}", 60_000) for i in range(n))
        return decode_batch(data)

    def wait_finished(self) -> None:
        """Blocks until the leader calls `finish` (so that no follower reaches jax.distributed's shutdown
        barrier while the leader still evaluates)."""
        self._wait(f"{PREFIX}/done")


class SyncTarget(Protocol):
    def sync(self, params: Any, version: int) -> None: ...


def follow(
    channel: BatchChannel,
    learner: Learner,
    sampler: SyncTarget,
    checkpointer: Checkpointer,
    steps: int,
    sync_every: int = 1,
    checkpoint_every: int = 1,
    resume: bool = True,
    sync_source: str = "hf",
) -> int:
    """A follower's RL loop: the leader's batches through the same update, sync and checkpoint cadence as
    `AsyncRLLoop.step` (whose collectives it joins in the same order). Returns the last step trained."""
    step, version = 0, 0
    # orbax writes JSON items on the primary process only: the leader's loop state is the one kept
    loop_item = {"follower": True}

    def sync() -> None:
        if sync_source == "orbax":  # the leader's sampler loads the step's checkpoint: nothing to gather here
            checkpointer.wait()
            sampler.sync(checkpointer.item_dir(step, "learner"), version)
        else:
            sampler.sync(learner.policy_state(), version)

    if resume:
        found = learner.restore_latest(checkpointer)  # a collective restore, as the leader's loop.restore
        if found is not None:
            counters = found["loop"]["counters"]
            step, version = int(counters["step"]), int(counters["version"])
            sync()
    while step < steps:
        batch, meta = channel.receive(step + 1)
        if int(meta["step"]) != step + 1:
            raise RuntimeError(f"follower expected step {step + 1}, the leader sent {meta['step']}")
        learner.update(batch)
        step, version = step + 1, int(meta["version"])
        saved = False
        if step % sync_every == 0:
            saved = sync_source == "orbax"
            if saved:
                learner.save(checkpointer, step, loop=loop_item)
            sync()
        if step % checkpoint_every == 0 and not saved:
            learner.save(checkpointer, step, loop=loop_item)
    return step
