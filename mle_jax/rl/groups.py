"""Statistics of the samples that share an id (a task, or a prompt's group), as pure jnp functions.

Per-task whitening and duration weights (`ppo`) and the group-relative advantages (`advantages`) all take a
statistic over each sample's id: its count, sum, mean, unbiased spread, max and min (verl keeps these in one helper,
`group_mean_std`). Ids come in any order and with any values. Everything goes through the [B, B] same-id mask:
B² elementwise operations (B is the update batch, 128 in the paper's config), so shapes are static under jit
whatever the number of ids, there is no sort and no segment bookkeeping, and each sum is exact float32 adds, not a
matmul (which may run in TF32 on a GPU). Every function returns one value per sample ([B]), the statistic of that
sample's id, so it lines up with the batch without a gather.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


def same_id(ids: Array) -> Array:
    """[B] ids (any values) -> [B, B] bool: [i, j] is True where samples i and j share an id (i included)."""
    ids = jnp.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be [B], got shape {ids.shape}")
    return ids[:, None] == ids[None, :]


def one_id(ids: Array) -> Array:
    """[B] ids -> [] bool: every sample has the same id (each statistic is the whole batch's)."""
    ids = jnp.asarray(ids)
    return jnp.all(ids == ids[0])


def id_sum(x: Array, same: Array) -> Array:
    """[B] per-sample values, [B, B] same_id -> [B]: the sum of x over each sample's id."""
    return jnp.sum(jnp.where(same, x[None, :], 0.0), axis=1)


def id_count(same: Array) -> Array:
    """[B, B] same_id -> [B] float32: the number of samples with each sample's id (at least 1: itself)."""
    return jnp.sum(same, axis=1).astype(jnp.float32)


def id_mean(x: Array, same: Array) -> Array:
    """[B] values, [B, B] same_id -> [B]: the mean of x over each sample's id."""
    return id_sum(x, same) / id_count(same)


def id_max(x: Array, same: Array) -> Array:
    """[B] values, [B, B] same_id -> [B]: the largest x of each sample's id."""
    return jnp.max(jnp.where(same, x[None, :], -jnp.inf), axis=1)


def id_min(x: Array, same: Array) -> Array:
    """[B] values, [B, B] same_id -> [B]: the smallest x of each sample's id."""
    return jnp.min(jnp.where(same, x[None, :], jnp.inf), axis=1)


def group_mean_std(x: Array, same: Array) -> tuple[Array, Array]:
    """[B] values, [B, B] same_id -> ([B] mean, [B] std) of each sample's id; std unbiased (ddof 1), as verl's
    `group_mean_std`, and 0 for an id of one sample."""
    mean = id_mean(x, same)
    var = id_sum(jnp.square(x - mean), same) / jnp.maximum(id_count(same) - 1, 1)
    return mean, jnp.sqrt(var)


def pooled_mean(sums: Array, counts: Array, same: Array) -> Array:
    """[B] sums of each sample's values, [B] how many values each sample has, [B, B] same_id -> [B]: the mean over
    all values of each sample's id (e.g. a task's masked tokens: sums and counts of each row's tokens); 0 for an id
    with no values."""
    return id_sum(sums, same) / jnp.maximum(id_sum(counts, same), 1)


def pooled_var(sq_dev_sums: Array, counts: Array, same: Array) -> Array:
    """[B] sums of each sample's squared deviations from its id's `pooled_mean`, [B] counts, [B, B] same_id -> [B]:
    the unbiased variance over all values of each sample's id; 0 for an id with fewer than two values."""
    return id_sum(sq_dev_sums, same) / jnp.maximum(id_sum(counts, same) - 1, 1)
