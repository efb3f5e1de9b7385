"""Checkpointer: round trip, keep-last-k, restore into targets, atomicity under SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mle_jax.checkpoint import Checkpointer

REPO = Path(__file__).resolve().parents[1]


def state(seed: float):
    params = {"w": jnp.full((3, 4), seed), "b": jnp.arange(4.0) + seed}
    opt = optax.adamw(1e-3).init(params)
    return {
        "params": params,
        "opt": opt,
        "step": jnp.asarray(int(seed), jnp.int32),
        "rng": jax.random.PRNGKey(int(seed)),
    }


def test_round_trip_keep_and_targets(tmp_path):
    with Checkpointer(tmp_path / "ck", keep=2) as ck:
        assert ck.latest_step() is None and ck.restore_latest() is None
        for step in (1, 2, 3):
            ck.save(step, {"learner": state(float(step)), "loop": {"version": step, "buffer": ["a", "b"]}})
        ck.wait()
        assert ck.all_steps() == [2, 3] and ck.latest_step() == 3
        target = state(0.0)
        got = ck.restore(2, {"learner": target})
        assert got["loop"] == {"version": 2, "buffer": ["a", "b"]}
        chex_equal = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), got["learner"], state(2.0))
        assert all(jax.tree.leaves(chex_equal))
        # structure of the target is kept (optax namedtuples, not dicts)
        assert jax.tree.structure(got["learner"]) == jax.tree.structure(target)
        step, latest = ck.restore_latest({"learner": target})
        assert step == 3 and int(latest["learner"]["step"]) == 3
        raw = ck.restore(3)
        np.testing.assert_array_equal(np.asarray(raw["learner"]["params"]["w"]), np.full((3, 4), 3.0))
        with pytest.raises(FileNotFoundError, match="step 1"):
            ck.restore(1)
        with pytest.raises(KeyError, match="nope"):
            ck.restore(3, {"nope": target})
        with pytest.raises(TypeError, match="non-array leaves"):
            ck.save(4, {"learner": {"w": jnp.ones(2), "name": "x"}})
    with pytest.raises(ValueError, match="keep"):
        Checkpointer(tmp_path / "other", keep=0)


WRITER = r"""
import sys, jax.numpy as jnp
from mle_jax.checkpoint import Checkpointer
ck = Checkpointer(sys.argv[1], keep=3)
step = 0
while True:
    step += 1
    ck.save(step, {"a": {"w": jnp.full((256, 256), float(step))}, "loop": {"step": step}})
"""


def test_sigkill_mid_save_leaves_consistent_steps(tmp_path):
    """Kill a process saving in a tight loop: every step that is listed restores whole and consistent."""
    d = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(d)], cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if d.is_dir() and len([p for p in d.iterdir() if p.name.isdigit()]) >= 2:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("writer never produced two checkpoints")
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    ck = Checkpointer(d, keep=3)
    steps = ck.all_steps()
    assert steps, "no complete step survived"
    for step in steps:
        got = ck.restore(step)
        assert got["loop"]["step"] == step
        np.testing.assert_array_equal(np.asarray(got["a"]["w"]), np.full((256, 256), float(step)))
    ck.close()
