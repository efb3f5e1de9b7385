"""The stream of (task, prompt kind) draws of a run over a mix of tasks (config.tasks, config.task_weights).

Each task's draws are a grain `MapDataset` whose i-th element is (task id, "improve" or "scratch"); the kinds are
stratified (`improve_count`): every block of `BLOCK` consecutive draws of a task holds improve_fraction·BLOCK
improve draws (rounded by a seeded carry, so the share of any prefix is improve_fraction's within 1/BLOCK plus one
draw), at positions shuffled by (seed, task's index, block). Independent coin flips instead leave a B = 4 step's share
anywhere from 0 to 1 and a 40-draw run's within ±0.16 of it (binomial, 95%). `MapDataset.mix` interleaves the tasks in
proportion to their weights. The stream is random access, so its state is one integer, its position: saved with
the loop's checkpoint, a resumed run continues the same stream instead of restarting it.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain
import numpy as np

KINDS = ("scratch", "improve")
_ENDLESS = 1 << 40  # draws per task: more than any run takes
BLOCK = 8  # draws per stratum of kinds


def improve_count(block: int, improve_fraction: float, phase: float) -> int:
    """How many of block `block`'s BLOCK draws are improve draws: the block's share of improve_fraction·BLOCK·(b+1)
    rounded down after a seeded phase in [0, 1), so the counts of blocks 0..b sum to within one of the exact
    share."""
    total = BLOCK * improve_fraction
    return int(np.floor((block + 1) * total + phase) - np.floor(block * total + phase))


def task_stream(task_ids: Sequence[str], weights: Sequence[float], improve_fraction: float, seed: int):
    """The mixed MapDataset of (task id, kind) draws; weights: one per task (any positive scale)."""
    if len(task_ids) != len(weights) or not task_ids:
        raise ValueError(f"{len(task_ids)} tasks and {len(weights)} weights: one weight per task, at least one task")

    def draws(k: int, task_id: str) -> grain.MapDataset:
        phase = float(np.random.default_rng([seed, k]).random())

        def draw(i: int) -> tuple[str, str]:
            block, j = divmod(int(i), BLOCK)
            rank = np.random.default_rng([seed, k, block]).permutation(BLOCK)[j]
            return task_id, "improve" if rank < improve_count(block, improve_fraction, phase) else "scratch"

        return grain.MapDataset.range(_ENDLESS).map(draw)

    parts = [draws(k, t) for k, t in enumerate(task_ids)]
    return parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, [float(w) for w in weights])


class PromptStream:
    """Where a run is in its (task, kind) stream; `take(n)` returns the next n draws.

    `owed[task]`: the improve draws of a task that became scratch prompts because no earlier solution of the task
    was there to show (the run's first prompts are drawn before any program has run); the next scratch draws of the
    task are made improve prompts in their place once there is one (`settle`), so that over a run the share of
    improve prompts is the stream's, prompt.improve_fraction, not less."""

    def __init__(self, task_ids: Sequence[str], weights: Sequence[float], improve_fraction: float, seed: int):
        self.task_ids = tuple(task_ids)
        self._ds = task_stream(self.task_ids, weights, improve_fraction, seed)
        self.position = 0
        self.owed: dict[str, int] = {}

    def settle(self, task_id: str, kind: str, has_parent: bool) -> str:
        """The kind of prompt a draw becomes: "improve" when it is one and `has_parent` (an earlier solution of the
        task to show), or when it is "scratch" while improve draws of the task are owed; else "scratch"."""
        owed = self.owed.get(task_id, 0)
        if kind == "improve" and not has_parent:
            self.owed[task_id] = owed + 1
            return "scratch"
        if kind == "scratch" and owed and has_parent:
            self.owed[task_id] = owed - 1
            return "improve"
        return kind

    def take(self, n: int) -> list[tuple[str, str]]:
        out = [self._ds[i] for i in range(self.position, self.position + n)]
        self.position += n
        return out

    def state_dict(self) -> dict:
        return {"position": self.position, "tasks": list(self.task_ids), "owed": dict(self.owed)}

    def load_state_dict(self, state: dict) -> None:
        if list(state.get("tasks", self.task_ids)) != list(self.task_ids):
            raise ValueError(
                f"the checkpoint's prompt stream is over tasks {state['tasks']}, this run's over {list(self.task_ids)}"
                ": resume with the same config.tasks, or use a new workdir"
            )
        self.position = int(state["position"])
        self.owed = {str(k): int(v) for k, v in state.get("owed", {}).items()}  # a checkpoint from before: none
