"""Group-relative advantages of the critic-free objectives (GRPO, Dr. GRPO, RLOO), as one pure function.

A group is the samples of one prompt (`sampler.group_size` of them); each sample's advantage compares its
reward with the other members of its group, so no critic is needed. Groups are given by ids, in any order and
with any values; their statistics are `groups`' (the [B, B] same-id mask: no sort, exact in float32).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from mle_jax.rl import groups

ESTIMATORS = ("grpo", "dr_grpo", "rloo")


def group_advantages(rewards: Array, group_ids: Array, estimator: str = "grpo", eps: float = 1e-6) -> Array:
    """rewards [B] float, group_ids [B] int (any values; members need not be contiguous) -> advantages [B] float32.

    grpo:    (r - mean of its group) / (std of its group + eps), std unbiased (ddof = 1), as verl;
    dr_grpo: r - mean of its group (Liu et al. 2025: no division by the std);
    rloo:    r - mean of the *other* members of its group (Ahmadian et al. 2024).
    A group of one sample gets 0 under every estimator (it has nothing to compare with), and so does every
    member of a group whose rewards are all equal (exactly 0, not rounding noise over eps).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"group advantage estimator must be one of {ESTIMATORS}, got {estimator!r}")
    r = jnp.asarray(rewards, jnp.float32)
    g = jnp.asarray(group_ids)
    if r.ndim != 1 or g.shape != r.shape:
        raise ValueError(f"rewards and group_ids must both be [B], got {r.shape} and {g.shape}")
    same = groups.same_id(g)
    n = groups.id_count(same)  # [B] size of each sample's group
    mean, std = groups.group_mean_std(r, same)
    spread = groups.id_max(r, same) > groups.id_min(r, same)
    centred = r - mean
    if estimator == "grpo":
        adv = centred / (std + eps)
    elif estimator == "dr_grpo":
        adv = centred
    else:  # r - (sum - r) / (n - 1) = n / (n - 1) * (r - mean)
        adv = centred * n / jnp.maximum(n - 1, 1)
    return jnp.where((n > 1) & spread, adv, 0.0).astype(jnp.float32)
