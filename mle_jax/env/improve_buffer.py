"""The self-improvement buffer: earlier solutions, with their terminal output, to be improved (paper §3.3).

Algorithm 1 keeps D_prev, "self-improve prompt given a and s'": every solution that ran is a
candidate. We keep the most recent `capacity` solutions that ran to completion of at least one
stage (a progress print or a valid submission); a program that printed nothing gives the model
nothing to improve on. Sampling is uniform. The buffer is plain data so it goes into checkpoints.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class PreviousSolution:
    plan: str
    code: str
    output: str  # terminal output of the instrumented run (progress prints included), truncated
    reward: float
    valid: bool
    score: float | None
    version: int
    task: str = ""  # the id of its task ("": a run of one task, or a checkpoint from before mixes)


class ImproveBuffer:
    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"improve buffer capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._items: deque[PreviousSolution] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: PreviousSolution, n_prints: int) -> bool:
        """Adds a solution that got somewhere (valid, or at least one progress print). Returns if kept."""
        if not item.code.strip() or not (item.valid or n_prints > 0):
            return False
        self._items.append(item)
        return True

    def sample(self, rng: np.random.Generator, task: str | None = None) -> PreviousSolution | None:
        """A uniformly drawn solution; with `task`, of that task only (None when it has none). A solution saved
        without a task ("") counts as any task's: a run of one task."""
        items = self._items if task is None else [x for x in self._items if x.task in (task, "")]
        if not items:
            return None
        return items[int(rng.integers(len(items)))]

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "items": [asdict(x) for x in self._items]}

    @classmethod
    def from_state_dict(cls, state: dict) -> ImproveBuffer:
        buf = cls(int(state["capacity"]))
        for x in state["items"]:
            buf._items.append(PreviousSolution(**x))
        return buf
