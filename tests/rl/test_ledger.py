"""The per-sample ledger (rl/ledger.py): every drawn sample is trained, discarded with a reason, or redrawn after a
resume; the tally of a run killed mid-step and resumed counts each exactly once."""

from __future__ import annotations

import pytest

from mle_jax.rl.ledger import Ledger, read_ledger, tally


def test_a_clean_run_trains_or_discards_every_sample(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.drawn(range(6))
    ledger.discarded("infra_failure", [0])
    ledger.discarded("dropped_with_group", [1])
    ledger.trained(1, [2, 3])
    ledger.trained(2, [4])
    ledger.discarded("run_ended", [4, 5])  # 4 already trained: not discarded again
    t = tally(read_ledger(tmp_path / "ledger.jsonl"))
    assert t["sampled"] == 6 and t["trained"] == 3 and t["discarded"] == 3 and t["lost"] == 0
    assert t["discarded_by_reason"]["infra_failure"] == 1 and t["discarded_by_reason"]["run_ended"] == 1
    assert t["trained_twice"] == 0 and t["trained_steps"] == [1, 2]


def test_a_kill_after_an_unsaved_update_redraws_its_samples_and_reuses_their_uids(tmp_path):
    """Checkpoint 1 holds next_uid 4. The killed process trained step 2 (never saved) on samples 2 and 4 and had 5
    in flight; the resumed process draws uids 4.. again (new samples) and trains step 2 anew."""
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.drawn(range(4))
    ledger.trained(1, [0, 1])
    ledger.drawn([4, 5])
    ledger.trained(2, [2, 4])
    with open(path, "a") as f:
        f.write('{"event": "drawn", "ui')  # the kill tore the last line
    ledger = Ledger(path)  # the resumed process's
    ledger.resumed(1, next_uid=4)
    ledger.drawn([4, 5, 6, 7])
    ledger.trained(2, [4, 5])
    ledger.discarded("run_ended", [6, 7])
    t = tally(read_ledger(path))
    # 0, 1 trained at step 1; 2, 3 (in flight at the checkpoint), 4, 5 redrawn; then 4..7 new: 4, 5 trained
    assert t["sampled"] == 10 and t["trained"] == 4 and t["redrawn"] == 4 and t["discarded"] == 2
    assert t["lost"] == 0 and t["trained_twice"] == 0 and t["trained_steps"] == [1, 2]


def test_lost_and_twice_are_counted():
    events = [
        {"event": "drawn", "uids": [0, 1, 2]},
        {"event": "trained", "step": 1, "uids": [0]},
        {"event": "trained", "step": 2, "uids": [0, 1]},
    ]
    t = tally(events)
    assert t["lost"] == 1 and t["pending"] == 1 and t["trained_twice"] == 1 and t["trained"] == 2


def test_an_unknown_reason_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown discard reason"):
        Ledger(tmp_path / "l.jsonl").discarded("because", [1])
