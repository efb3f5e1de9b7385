"""Checkpointer: round trip, keep-last-k, restore into targets, atomicity under SIGKILL, resuming past a step
that does not read back."""

from __future__ import annotations

import logging
import os
import shutil
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

from mle_jax.infra.checkpoint import TMP_MARK, Checkpointer, CheckpointError
from mle_jax.infra.metrics import MetricsWriter, read_metrics
from mle_jax.infra.tensorboard_events import scalar_points

REPO = Path(__file__).resolve().parents[2]


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
from mle_jax.infra.checkpoint import Checkpointer
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


def _truncate_arrays(step_dir: Path) -> None:
    """Halves every array data file of the learner item (what a disk that filled up mid-write leaves)."""
    files = [p for p in (step_dir / "learner").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert files
    for f in files:
        os.truncate(f, f.stat().st_size // 2)


def _run_until(workdir: Path, steps: range, ck: Checkpointer, writer: MetricsWriter, offset: float = 0.0) -> None:
    """What the loop leaves per step: a metrics row (JSONL + TensorBoard), its samples, a checkpoint."""
    for step in steps:
        writer.write(step, {"reward/mean": step + offset})
        writer.write_samples(step, [{"reward": step + offset}])
        ck.save(step, {"learner": state(float(step)), "loop": {"step": step}})
    ck.wait()


def test_a_read_only_reader_of_a_run_that_is_writing_moves_and_cleans_up_nothing(tmp_path):
    """What `evaluate` and `--progress` open (Checkpointer(read_only=True)) while the run may still write: a save in
    flight (orbax's temporary step folder) stays, an unreadable newest step is skipped, not moved aside, and the
    latest readable step is read."""
    ck, writer = Checkpointer(tmp_path / "checkpoints", keep=3), MetricsWriter(tmp_path)
    _run_until(tmp_path, range(1, 4), ck, writer)
    ck.close()
    writer.close()
    _truncate_arrays(tmp_path / "checkpoints" / "3")
    in_flight = tmp_path / "checkpoints" / f"4{TMP_MARK}-1"
    in_flight.mkdir()
    reader = Checkpointer(tmp_path / "checkpoints", read_only=True)
    step, items = reader.restore_latest({"learner": state(0.0)})
    assert step == 2 and items["loop"] == {"step": 2}
    assert in_flight.is_dir() and (tmp_path / "checkpoints" / "3").is_dir()
    assert not (tmp_path / "checkpoints.unreadable").exists() and reader.all_steps() == [1, 2, 3]


def test_a_truncated_newest_step_is_moved_aside_and_the_resume_rewrites_its_step_once(tmp_path, caplog):
    """Three checkpoints, the newest with truncated array files: the rerun resumes from the second (said in one
    line, the bad step moved aside, not deleted), writes the step again, and every view has one point per step."""
    ck, writer = Checkpointer(tmp_path / "checkpoints", keep=3), MetricsWriter(tmp_path)
    _run_until(tmp_path, range(1, 6), ck, writer)
    ck.close()
    writer.close()
    assert Checkpointer(tmp_path / "checkpoints").all_steps() == [3, 4, 5]
    _truncate_arrays(tmp_path / "checkpoints" / "5")

    ck, writer = Checkpointer(tmp_path / "checkpoints", keep=3), MetricsWriter(tmp_path)
    with caplog.at_level(logging.WARNING, logger="mle_jax.infra.checkpoint"):
        step, items = ck.restore_latest({"learner": state(0.0)})
    assert step == 4 and items["loop"] == {"step": 4}
    np.testing.assert_array_equal(np.asarray(items["learner"]["params"]["w"]), np.full((3, 4), 4.0))
    # this module's lines only: asyncio may also log orbax's unretrieved read error, depending on when it is collected
    [warning] = [r.getMessage() for r in caplog.records if r.name == "mle_jax.infra.checkpoint"]
    assert "\n" not in warning and "step 5" in warning and "unreadable" in warning and "from step 4" in warning
    aside = tmp_path / "checkpoints.unreadable" / "5"
    assert aside.is_dir() and str(aside) in warning and (aside / "learner").is_dir()
    assert ck.all_steps() == [3, 4]

    writer.truncate_after(step)  # as AsyncRLLoop.restore does
    _run_until(tmp_path, range(5, 7), ck, writer, offset=100.0)  # step 5's number is free again
    ck.close()
    writer.close()
    assert Checkpointer(tmp_path / "checkpoints").all_steps() == [4, 5, 6]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in read_metrics(tmp_path / "samples.jsonl")] == [1, 2, 3, 4, 5, 6]
    points = sorted((s, v) for tag, s, v in scalar_points(tmp_path / "tb") if tag == "reward/mean")
    assert points == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 105.0), (6, 106.0)]


def test_a_torn_loop_item_falls_back_and_none_readable_is_one_line(tmp_path):
    with Checkpointer(tmp_path / "ck", keep=3) as ck:
        for step in (1, 2, 3):
            ck.save(step, {"learner": state(float(step)), "loop": {"step": step}})
    (tmp_path / "ck" / "3" / "loop" / "metadata").write_text('{"ste')  # JSONDecodeError
    with Checkpointer(tmp_path / "ck", keep=3) as ck:
        step, items = ck.restore_latest({"learner": state(0.0)})
        assert step == 2 and items["loop"] == {"step": 2}
        for s in (1, 2):
            _truncate_arrays(tmp_path / "ck" / str(s))
        with pytest.raises(CheckpointError) as err:
            ck.restore_latest({"learner": state(0.0)})
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "ck") in message and "step 2: ValueError" in message
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.isdigit()) == ["1", "2"]  # nothing moved
    assert [p.name for p in (tmp_path / "ck.unreadable").iterdir()] == ["3"]


def test_a_half_written_tmp_step_is_not_a_step(tmp_path):
    """A save killed mid-write leaves <step>.orbax-checkpoint-tmp-<n>: never listed or restored, and cleaned up."""
    with Checkpointer(tmp_path / "ck", keep=3) as ck:
        ck.save(1, {"learner": state(1.0), "loop": {"step": 1}})
    half = tmp_path / "ck" / "2.orbax-checkpoint-tmp-1700000000"
    shutil.copytree(tmp_path / "ck" / "1", half)
    (half / "_CHECKPOINT_METADATA").unlink()
    _truncate_arrays(half)
    with Checkpointer(tmp_path / "ck", keep=3) as ck:
        assert ck.all_steps() == [1]
        step, _ = ck.restore_latest({"learner": state(0.0)})
        assert step == 1
    assert not half.exists()
    assert not (tmp_path / "ck.unreadable").exists()
