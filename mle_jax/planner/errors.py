"""The planner's one error: a plan that cannot be made as asked, in one line."""

from __future__ import annotations

from typing import Any


class PlanError(ValueError):
    """A plan that cannot be made as asked; the message is one line naming the numbers that clash. `fix`: the
    config overrides that the message names, when there are ({"ppo.micro_batch_size": 16})."""

    def __init__(self, message: str, fix: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.fix = dict(fix or {})
