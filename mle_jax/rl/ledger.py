"""The per-sample ledger of a run: what became of every sample the loop drew, in <workdir>/ledger.jsonl.

The RL loop appends one JSON line per event, flushed at once (a SIGKILL loses at most a torn last line):

  {"event": "drawn", "uids": [...]}                      samples just sampled (first turns and later turns)
  {"event": "trained", "step": s, "uids": [...]}         the samples update `s` trained on
  {"event": "discarded", "reason": r, "uids": [...]}     never trained, and why: "infra_failure" (the executor
                                                          failed twice), "dropped_with_group", "resampled_stale",
                                                          "run_ended" (in flight when the loop stopped)
  {"event": "resumed", "step": k, "next_uid": u}         a new process resumed from checkpoint k

uids restart at the checkpoint's `next_uid` after a resume, so a uid names a sample only within one process's
stretch of the run. `tally` replays the events: at a "resumed" event every sample of the dead process still pending
(drawn, neither trained nor discarded) and every sample an update after step k trained (its update was lost with the
process) is counted `redrawn`: discarded with the reason "the learner was killed", its prompt drawn again.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

LEDGER = "ledger.jsonl"
REASONS = ("infra_failure", "dropped_with_group", "resampled_stale", "run_ended")


class Ledger:
    """Appends ledger events to `path` (opened per event: the run's workdir may be full or replaced meanwhile)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        # a process killed mid-write left a torn last line: end it, or the next event would be glued to it and lost
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
            if torn:
                with open(self.path, "a") as f:
                    f.write("\n")

    def write(self, event: str, uids: Sequence[int] = (), **fields: Any) -> None:
        """One event line; events about no samples (empty uids, other than "resumed") are not written."""
        if event != "resumed" and not uids:
            return
        row = {"event": event, **fields}
        if event != "resumed":
            row["uids"] = [int(u) for u in uids]
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()

    def drawn(self, uids: Iterable[int]) -> None:
        self.write("drawn", list(uids))

    def trained(self, step: int, uids: Iterable[int]) -> None:
        self.write("trained", list(uids), step=int(step))

    def discarded(self, reason: str, uids: Iterable[int]) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown discard reason {reason!r}; one of {REASONS}")
        self.write("discarded", list(uids), reason=reason)

    def resumed(self, step: int, next_uid: int) -> None:
        self.write("resumed", step=int(step), next_uid=int(next_uid))


def read_ledger(path: str | Path) -> list[dict]:
    """The events of a ledger.jsonl; a torn line (a process killed mid-write) is skipped."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "event" in row:
            out.append(row)
    return out


def tally(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts what became of every drawn sample.

    events: ledger rows in file order. Returns {"sampled", "trained", "redrawn", "discarded" (total),
    "discarded_by_reason" {reason: n}, "lost", "trained_twice", "pending", "trained_steps" [sorted surviving
    update steps]}: every sampled sample is trained, discarded or redrawn, else lost (drawn, never accounted
    for: "pending" of them were drawn in the last process and are unaccounted for at the ledger's end);
    trained_twice counts the samples that entered two surviving updates. All ints but trained_steps (list[int]).
    """
    pending: set[int] = set()  # drawn in this stretch, not yet accounted for
    trained_at: dict[int, list[int]] = {}  # uid -> surviving update steps that trained it (this stretch)
    sampled = trained_final = redrawn = lost_unknown = 0
    discarded: dict[str, int] = {r: 0 for r in REASONS}
    twice = 0
    steps_of: dict[int, list[int]] = {}  # update step -> uids (this stretch), to void steps a resume rolls back
    kept_steps: set[int] = set()
    for ev in events:
        kind = ev["event"]
        uids = [int(u) for u in ev.get("uids", ())]
        if kind == "drawn":
            sampled += len(uids)
            pending.update(uids)
        elif kind == "trained":
            step = int(ev["step"])
            for u in uids:
                if u in pending:
                    pending.discard(u)
                elif u not in trained_at:
                    lost_unknown += 1  # trained but never drawn: a ledger that lost its "drawn" line
                trained_at.setdefault(u, []).append(step)
            steps_of.setdefault(step, []).extend(uids)
        elif kind == "discarded":
            reason = str(ev["reason"])
            for u in uids:
                if u in pending:
                    pending.discard(u)
                    discarded[reason] = discarded.get(reason, 0) + 1
        elif kind == "resumed":
            k = int(ev["step"])
            # updates past the checkpoint died with the process: their samples are redrawn, not trained
            for step in [s for s in steps_of if s > k]:
                for u in steps_of.pop(step):
                    if u in trained_at:
                        trained_at[u] = [s for s in trained_at[u] if s != step]
                        if not trained_at[u]:
                            del trained_at[u]
                            redrawn += 1
            redrawn += len(pending)
            pending = set()
            # the surviving stretch is closed: its trained samples are final, its uids may be drawn again
            for steps in trained_at.values():
                trained_final += 1
                twice += len(steps) > 1
            kept_steps.update(steps_of)
            trained_at, steps_of = {}, {}
    for steps in trained_at.values():
        trained_final += 1
        twice += len(steps) > 1
    kept_steps.update(steps_of)
    return {
        "sampled": sampled,
        "trained": trained_final,
        "redrawn": redrawn,
        "discarded": sum(discarded.values()),
        "discarded_by_reason": discarded,
        "lost": lost_unknown + len(pending),
        "pending": len(pending),
        "trained_twice": twice,
        "trained_steps": sorted(kept_steps),
    }
