"""groups: each same-id statistic against plain numpy over each sample's id members, in float64."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mle_jax.rl import groups


def members(ids: np.ndarray, i: int) -> np.ndarray:
    return ids == ids[i]


def uneven_ids(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ids of arbitrary values, shuffled, with a singleton among them; values on very different scales per id; and
    each sample's number of values (some 0, as a row with no response tokens)."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.array([-7] * 5 + [3] * 1 + [1000] * 4 + [0] * 3))
    scale = np.where(ids == 1000, 100.0, 0.01)
    x = (rng.normal(size=ids.size) * scale + ids).astype(np.float32)
    counts = rng.integers(0, 4, size=ids.size).astype(np.float32)
    return ids, x, counts


@pytest.mark.parametrize("seed", range(2))
def test_each_statistic_equals_numpy_over_the_members_of_each_id(seed):
    ids, x, counts = uneven_ids(seed)
    same = np.asarray(groups.same_id(ids))
    assert same.shape == (ids.size, ids.size) and np.array_equal(same, same.T) and same.diagonal().all()
    x64 = x.astype(np.float64)
    ref = {
        "count": [members(ids, i).sum() for i in range(ids.size)],
        "sum": [x64[members(ids, i)].sum() for i in range(ids.size)],
        "mean": [x64[members(ids, i)].mean() for i in range(ids.size)],
        "max": [x64[members(ids, i)].max() for i in range(ids.size)],
        "min": [x64[members(ids, i)].min() for i in range(ids.size)],
        "std": [x64[members(ids, i)].std(ddof=1) if members(ids, i).sum() > 1 else 0.0 for i in range(ids.size)],
    }

    @jax.jit
    def stats(x, ids):
        same = groups.same_id(ids)
        mean, std = groups.group_mean_std(x, same)
        return {
            "count": groups.id_count(same),
            "sum": groups.id_sum(x, same),
            "mean": groups.id_mean(x, same),
            "max": groups.id_max(x, same),
            "min": groups.id_min(x, same),
            "std": std,
            "std_mean": mean,
        }

    got = {k: np.asarray(v) for k, v in stats(x, ids).items()}
    for name, want in ref.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.array_equal(got["std_mean"], got["mean"])
    assert got["std"][ids == 3][0] == 0.0  # the singleton: no spread, not NaN


def test_pooled_statistics_are_those_of_every_value_of_the_id():
    # each sample brings counts[b] values; the id's mean and unbiased variance are over all of them together
    rng = np.random.default_rng(5)
    ids, _, counts = uneven_ids(5)
    values = [rng.normal(size=int(c)) * 3 + 1 for c in counts]
    sums = np.array([v.sum() for v in values], np.float32)
    mean = np.asarray(groups.pooled_mean(sums, counts, groups.same_id(ids)))
    sq_dev = np.array([np.square(v - mean[b]).sum() for b, v in enumerate(values)], np.float32)
    var = np.asarray(groups.pooled_var(sq_dev, counts, groups.same_id(ids)))
    for b in range(ids.size):
        pooled = np.concatenate([values[j] for j in np.flatnonzero(members(ids, b))])
        want_mean = pooled.mean() if pooled.size else 0.0
        want_var = pooled.var(ddof=1) if pooled.size > 1 else 0.0
        np.testing.assert_allclose(mean[b], want_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(var[b], want_var, rtol=1e-5, atol=1e-6)


def test_one_id_and_shape_errors():
    assert bool(groups.one_id(np.full(4, 9))) and not bool(groups.one_id(np.array([9, 9, 8, 9])))
    with pytest.raises(ValueError, match=r"ids must be \[B\]"):
        groups.same_id(np.zeros((2, 2), int))
