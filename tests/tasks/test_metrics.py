"""Each metric against its outside reference (sklearn / scipy) on random data."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr
from sklearn.metrics import (
    accuracy_score,
    cohen_kappa_score,
    log_loss,
    roc_auc_score,
    root_mean_squared_log_error,
)

from mle_jax.tasks.graders.accuracy import accuracy
from mle_jax.tasks.graders.auc import roc_auc
from mle_jax.tasks.graders.correlation import pearson_r
from mle_jax.tasks.graders.frames import InvalidSubmission
from mle_jax.tasks.graders.jaccard import mean_word_jaccard, word_jaccard
from mle_jax.tasks.graders.kappa import quadratic_weighted_kappa
from mle_jax.tasks.graders.log_loss import multiclass_log_loss
from mle_jax.tasks.graders.rmsle import rmsle


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 500)
    score = np.round(rng.random(500), 1)  # many ties
    assert roc_auc(y, score) == pytest.approx(roc_auc_score(y, score), abs=1e-12)
    labels = np.where(y == 1, 7, 3)  # the larger label is the positive class
    assert roc_auc(labels, score) == pytest.approx(roc_auc_score(labels, score), abs=1e-12)


def test_auc_needs_two_classes():
    with pytest.raises(InvalidSubmission, match="2"):
        roc_auc(np.ones(5), np.arange(5))


@pytest.mark.parametrize("seed", range(5))
def test_qwk_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 7, 300)
    b = np.clip(a + rng.integers(-2, 3, 300), 1, 6)
    expected = cohen_kappa_score(b, a, weights="quadratic")
    assert quadratic_weighted_kappa(b, a) == pytest.approx(expected, abs=1e-12)
    c = rng.integers(0, 9, 300).astype(float)  # labels missing from one side, floats
    expected = cohen_kappa_score(c, a, weights="quadratic")
    assert quadratic_weighted_kappa(c, a) == pytest.approx(expected, abs=1e-12)


def test_qwk_constant_raters_is_undefined():
    assert np.isnan(quadratic_weighted_kappa(np.ones(4), np.ones(4)))


def test_word_jaccard_as_the_competition_defines_it():
    assert word_jaccard("Good Day", "good day") == 1.0
    assert word_jaccard("a b c", "b c d") == pytest.approx(2 / 4)
    assert word_jaccard("", "x") == 0.0
    assert word_jaccard("", "") == 1.0
    rng = np.random.default_rng(0)
    words = np.array(["sun", "fun", "Run", "gun", "bun", "nun"])
    preds = [" ".join(rng.choice(words, rng.integers(1, 5))) for _ in range(50)]
    truths = [" ".join(rng.choice(words, rng.integers(1, 5))) for _ in range(50)]

    def reference(a, b):
        sa, sb = set(a.lower().split()), set(b.lower().split())
        return len(sa & sb) / len(sa | sb)

    expected = np.mean([reference(a, b) for a, b in zip(preds, truths, strict=True)])
    assert mean_word_jaccard(preds, truths) == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(3))
def test_accuracy_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y, p = rng.integers(1, 8, 400), rng.integers(1, 8, 400)
    assert accuracy(y, p) == pytest.approx(accuracy_score(y, p))


@pytest.mark.parametrize("seed", range(3))
def test_pearson_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    x = rng.random(300)
    y = x + rng.normal(0, 0.5, 300)
    assert pearson_r(x, y) == pytest.approx(pearsonr(x, y)[0], abs=1e-12)
    assert np.isnan(pearson_r(x, np.zeros(300)))


@pytest.mark.parametrize("seed", range(3))
def test_log_loss_matches_sklearn_including_clipping(seed):
    rng = np.random.default_rng(seed)
    n, k = 200, 5
    y = rng.integers(0, k, n)
    onehot = np.eye(k)[y]
    p = rng.dirichlet(np.ones(k), n)
    p[:10] = np.eye(k)[(y[:10] + 1) % k]  # confident and wrong: clipping decides the value
    p[10:20] = onehot[10:20]  # confident and right
    ours = multiclass_log_loss(onehot, p)
    assert ours == pytest.approx(log_loss(onehot, p), rel=1e-12)
    assert np.isfinite(ours)


@pytest.mark.parametrize("seed", range(3))
def test_rmsle_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y, p = rng.random(300) * 5, rng.random(300) * 5 - 0.5
    assert rmsle(y, p) == pytest.approx(root_mean_squared_log_error(y, p), rel=1e-12)
    with pytest.raises(InvalidSubmission):
        rmsle(y, np.full(300, -1.0))
