"""The duration-bias simulation: plain async PPO drifts to the fast kind, duration weights to the better."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mle_jax.experiments.duration_bias import InFlight, Kind, SimConfig, SimulatedFleet, run, to_rollout_batch

REPO = Path(__file__).resolve().parents[2]
KINDS = (Kind("fail", -9.7, 0.5), Kind("fast", 0.64, 1.0), Kind("slow", 0.8, 20.0))


def test_fleet_returns_first_finished_and_tags_versions():
    fleet = SimulatedFleet([Kind("a", 0.0, 1.0), Kind("b", 0.0, 10.0)], 0.0, 0.0, np.random.default_rng(0))
    fleet.submit(np.log(np.array([0.5, 0.5])), version=0, n=40)
    batch = fleet.next_batch(10, version=0, max_version_lag=0)
    assert all(s.kind == 0 for s in batch)  # the 1 s kind always finishes before the 10 s kind
    assert fleet.clock_s == pytest.approx(1.0) and len(fleet) == 30
    fleet.submit(np.log(np.array([0.5, 0.5])), version=3, n=10)
    later = fleet.next_batch(10, version=3, max_version_lag=2)  # version-0 samples are 3 behind: dropped
    assert {s.version for s in later} == {3} and len(fleet) == 0
    with pytest.raises(RuntimeError, match="ran dry"):
        fleet.next_batch(1, version=3, max_version_lag=2)
    rb = to_rollout_batch(batch)
    assert rb.tokens.shape == (10, 2) and np.allclose(rb.behaviour_logprobs[:, 1], np.log(0.5))
    assert isinstance(batch[0], InFlight)


@pytest.mark.model
@pytest.mark.parametrize("seed", [0, 1])
def test_arms_end_on_different_kinds(seed):
    cfg = SimConfig(kinds=KINDS, init_logits=(1.0, 0.0, 0.0), steps=60, batch_size=32, seed=seed)
    hist = run(cfg, show_progress=False)
    off, weighted = hist["off"].probs[-1], hist["batch_mean"].probs[-1]
    assert int(np.argmax(off)) == 1 and off[1] > 0.8, off  # fast & worse
    assert int(np.argmax(weighted)) == 2 and weighted[2] > 0.8, weighted  # slow & better
    assert hist["batch_mean"].policy_mean_duration[-1] > 5 * hist["off"].policy_mean_duration[-1]


@pytest.mark.model
def test_cli_writes_plot_and_prints(tmp_path):
    out, results = tmp_path / "db.png", tmp_path / "db.jsonl"
    cmd = ["-m", "mle_jax.experiments.duration_bias", "--steps", "40", "--out", str(out), "--results", str(results)]
    res = subprocess.run(
        [sys.executable, *cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    assert "weights        off: final probabilities" in res.stdout
    assert "argmax fast" in res.stdout and "argmax slow" in res.stdout
    (record,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert record["command"] == "python " + " ".join(cmd) and record["date"][:2] == "20"
    assert record["settings"]["steps"] == 40 and record["final"]["off"]["argmax"] == "fast"
    assert abs(sum(record["final"]["batch_mean"]["probs"].values()) - 1) < 1e-3
