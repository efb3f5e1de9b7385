"""RolloutBatch packing and validation."""

from __future__ import annotations

import numpy as np
import pytest

from mle_jax.rl.batch import RolloutBatch


def make(pad_to=None):
    return RolloutBatch.from_sequences(
        prompt_ids=[[5, 6, 7], [8]],
        response_ids=[[1, 2], [3, 4, 9]],
        logprobs=[[-0.5, -0.25], [-1.0, -2.0, -0.1]],
        rewards=[1.0, -10.0],
        durations_s=[3.0, 0.5],
        versions=[2, 3],
        pad_to=pad_to,
    )


def test_from_sequences_layout():
    b = make(pad_to=6)
    np.testing.assert_array_equal(b.tokens, [[5, 6, 7, 1, 2, 0], [8, 3, 4, 9, 0, 0]])
    np.testing.assert_array_equal(b.attention_mask, [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(b.response_mask, [[0, 0, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0]])
    np.testing.assert_allclose(b.behaviour_logprobs[0], [0, 0, 0, -0.5, -0.25, 0])
    assert b.tokens.dtype == np.int32 and b.rewards.dtype == np.float32 and b.versions.dtype == np.int32
    assert (b.batch_size, b.seq_len) == (2, 6)
    assert make().seq_len == 5


def test_pad_select_concat():
    b = make()
    p = b.pad_to(8)
    assert p.seq_len == 8 and p.tokens[:, 5:].sum() == 0
    np.testing.assert_array_equal(p.tokens[:, :5], b.tokens)
    s = b.select([1])
    assert s.batch_size == 1 and s.rewards[0] == -10.0
    c = RolloutBatch.concat([b, p])
    assert c.batch_size == 4 and c.seq_len == 8
    with pytest.raises(ValueError, match="pad T"):
        p.pad_to(4)


def test_validation_errors():
    with pytest.raises(ValueError, match="pad_to"):
        make(pad_to=4)
    with pytest.raises(ValueError, match="logprobs for"):
        RolloutBatch.from_sequences([[1]], [[2, 3]], [[-1.0]], [0.0], [1.0], [0])
    with pytest.raises(ValueError, match="empty prompt"):
        RolloutBatch.from_sequences([[]], [[2]], [[-1.0]], [0.0], [1.0], [0])
    with pytest.raises(ValueError, match="rewards has"):
        RolloutBatch.from_sequences([[1]], [[2]], [[-1.0]], [0.0, 1.0], [1.0], [0])
    good = make(pad_to=6).as_dict()
    bad = dict(good, rewards=np.zeros(3))
    with pytest.raises(ValueError, match="rewards must be"):
        RolloutBatch(**bad)
    bad = dict(good, response_mask=np.array([[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="position 0"):
        RolloutBatch(**bad)
    lp = good["behaviour_logprobs"].copy()
    lp[0, 0] = -1.0
    with pytest.raises(ValueError, match="outside the response"):
        RolloutBatch(**dict(good, behaviour_logprobs=lp))
    lp = good["behaviour_logprobs"].copy()
    lp[0, 3] = 0.5
    with pytest.raises(ValueError, match="<= 0"):
        RolloutBatch(**dict(good, behaviour_logprobs=lp))
    with pytest.raises(ValueError, match="durations_s"):
        RolloutBatch(**dict(good, durations_s=np.array([-1.0, 2.0])))
    with pytest.raises(ValueError, match="right-padded"):
        RolloutBatch(**dict(good, attention_mask=np.array([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])))


def test_group_ids_default_to_one_group_per_sample_and_travel_with_the_rows():
    b = make(pad_to=6)
    assert b.group_ids.dtype == np.int32
    np.testing.assert_array_equal(b.group_ids, [0, 1])  # no groups given: every sample its own
    g = RolloutBatch.from_sequences(
        [[5], [6], [7]], [[1], [2], [3]], [[-0.1], [-0.2], [-0.3]], [1.0, 0.0, 2.0], [1.0, 2.0, 3.0], [0, 0, 1],
        group_ids=[40, 7, 40],
    )  # fmt: skip
    assert g.group_ids.dtype == np.int32
    np.testing.assert_array_equal(g.group_ids, [40, 7, 40])
    np.testing.assert_array_equal(g.pad_to(9).group_ids, [40, 7, 40])
    np.testing.assert_array_equal(g.select([2, 0]).group_ids, [40, 40])
    np.testing.assert_array_equal(RolloutBatch.concat([g, g.select([1])]).group_ids, [40, 7, 40, 7])
    with pytest.raises(ValueError, match="group_ids has 1 entries"):
        RolloutBatch.from_sequences([[1], [2]], [[2], [3]], [[-1.0], [-1.0]], [0.0, 0.0], [1.0, 1.0], [0, 0],
                                    group_ids=[0])  # fmt: skip
    with pytest.raises(ValueError, match=r"group_ids must be \[B\]"):
        RolloutBatch(**dict(b.as_dict(), group_ids=np.zeros((2, 1))))


def test_task_ids_default_to_one_task_and_travel_with_the_rows():
    b = make(pad_to=6)
    assert b.task_ids.dtype == np.int32
    np.testing.assert_array_equal(b.task_ids, [0, 0])  # no tasks given: one task
    ids = RolloutBatch.task_indices(["leaf", "pizza", "leaf"])
    assert ids == [0, 1, 0]  # first-appearance order
    g = RolloutBatch.from_sequences(
        [[5], [6], [7]], [[1], [2], [3]], [[-0.1], [-0.2], [-0.3]], [1.0, 0.0, 2.0], [1.0, 2.0, 3.0], [0, 0, 1],
        task_ids=ids,
    )  # fmt: skip
    assert g.task_ids.dtype == np.int32
    np.testing.assert_array_equal(g.pad_to(9).task_ids, [0, 1, 0])
    np.testing.assert_array_equal(g.select([1, 2]).task_ids, [1, 0])
    np.testing.assert_array_equal(RolloutBatch.concat([g, g.select([1])]).task_ids, [0, 1, 0, 1])
    np.testing.assert_array_equal(g.as_dict()["task_ids"], [0, 1, 0])
    np.testing.assert_array_equal(RolloutBatch.random(4, 3, 2, vocab=20).task_ids, [0, 0, 0, 0])
    with pytest.raises(ValueError, match="task_ids has 2 entries"):
        RolloutBatch.from_sequences([[1]] * 3, [[2]] * 3, [[-1.0]] * 3, [0.0] * 3, [1.0] * 3, [0] * 3, task_ids=[0, 1])
    with pytest.raises(ValueError, match=r"task_ids must be \[B\]"):
        RolloutBatch(**dict(b.as_dict(), task_ids=np.zeros(3)))


def test_random_batch_is_a_valid_batch_of_whole_groups():
    b = RolloutBatch.random(8, 5, 3, vocab=50, group=4)
    assert (b.batch_size, b.seq_len) == (8, 8) and b.response_mask.sum() == 8 * 3
    assert b.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and (b.behaviour_logprobs[b.response_mask == 1] < 0).all()
    assert np.array_equal(RolloutBatch.random(8, 5, 3, vocab=50).tokens, b.tokens)  # the seed, not the groups, draws
