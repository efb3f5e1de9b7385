"""The paper's duration weights (§3.1): each sample's policy gradient weighted by its program's run time over the
batch's mean run time.

In asynchronous RL the programs that finish first fill a batch, so fast programs dominate the gradient; weighting
sample i by Δt_i / mean Δt undoes that bias (docs/results.md measures it). Every objective applies them to its
per-sample advantages (rl/update.py); `ppo.duration_weights` chooses the mode.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jax import Array

from mle_jax.rl import groups

DURATION_MODES = ("off", "batch_mean", "clipped", "log")


def duration_weights(
    durations_s: Array,
    mode: str = "batch_mean",
    max_weight: float | None = None,
    min_duration_s: float = 0.0,
    task_ids: Array | None = None,
) -> Array:
    """[B] run times (and [B] task ids) -> [B] weights with mean 1 within each task (paper §3.1: Δt_i / mean Δt).

    Each Δt is first floored at `min_duration_s`: a response with no code never runs (Δt = 0) and would
    get weight 0, so the policy would never be pushed away from it (1 s ~ a sandbox start plus an import).
    off: ones. batch_mean: Δt_i / mean(Δt). clipped: batch_mean capped at `max_weight`, then rescaled
    to mean 1. log: log(1 + Δt_i) / mean(log(1 + Δt)) (tempers very long runs).
    Every mean is over the samples of the same task in the batch (`task_means`): a 10 s program is slow for one
    task and fast for another. task_ids None (or all equal): the whole batch is one task.
    When all durations of a task are equal (or all zero) every mode gives exactly ones for that task, so PPO is
    unchanged.
    """
    if mode not in DURATION_MODES:
        raise ValueError(f"duration weight mode must be one of {DURATION_MODES}, got {mode!r}")
    d = jnp.asarray(durations_s, jnp.float32)
    if d.ndim != 1:
        raise ValueError(f"durations_s must be [B], got shape {d.shape}")
    if task_ids is not None and jnp.shape(task_ids) != d.shape:
        raise ValueError(f"task_ids must be [B] = {d.shape}, got shape {jnp.shape(task_ids)}")
    if mode == "off":
        return jnp.ones_like(d)
    if mode == "clipped" and (max_weight is None or max_weight < 1.0):
        raise ValueError(f"mode 'clipped' needs max_weight >= 1, got {max_weight}")
    d = jnp.maximum(d, max(float(min_duration_s), 0.0))
    if mode == "log":
        d = jnp.log1p(d)
    cap = max_weight if mode == "clipped" else None
    whole = _mean_one(d, jnp.mean, cap, jnp.max(d), jnp.min(d))
    if task_ids is None:
        return whole
    same = groups.same_id(task_ids)
    per_task = _mean_one(d, lambda x: groups.id_mean(x, same), cap, groups.id_max(d, same), groups.id_min(d, same))
    # one task: the whole batch's program, selected whole (XLA rewrites its division by a scalar; the same
    # division by a per-sample mean rounds differently, and single-task PPO must not move)
    return jnp.where(groups.one_id(task_ids), whole, per_task)


def _mean_one(d: Array, mean: Callable[[Array], Array], cap: float | None, hi: Array, lo: Array) -> Array:
    """[B] durations -> [B] d / mean(d) (capped at `cap` and rescaled by mean again when cap is set); exactly ones
    where hi == lo or hi <= 0 (the samples' durations carry no information). mean: [B] -> [] or [B]."""
    w = d / jnp.maximum(mean(d), 1e-12)
    if cap is not None:
        w = jnp.minimum(w, cap)
        w = w / mean(w)
    # Exact ones when durations carry no information (mean-division rounding would perturb plain PPO).
    return jnp.where((hi == lo) | (hi <= 0.0), jnp.ones_like(d), w)
