"""The planner's --table_out files (`python -m mle_jax.plan ... --table_out=F`) as tables."""

from __future__ import annotations

from typing import Any

from mle_jax.reporting.plan_markdown import markdown as plan_markdown
from mle_jax.reporting.plan_markdown import merge as merge_plans
from mle_jax.reporting.plan_markdown import objectives_markdown


def render_plans(*files: dict[str, Any]) -> str:
    """The planner's --table_out files (one per TPU generation, say) as one table (as mle_jax.planner.table writes)."""
    return plan_markdown(merge_plans(list(files)))


def render_objective_plans(*files: dict[str, Any]) -> str:
    """The planner's --table_out files of one config under several learner.algorithms and device counts."""
    return objectives_markdown(merge_plans(list(files)))
