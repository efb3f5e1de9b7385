"""mle_jax.reporting.statistics against scipy on fixed data."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mle_jax.reporting import statistics as st


@pytest.mark.parametrize(
    "k_a,n_a,k_b,n_b",
    [(3, 16, 9, 16), (0, 64, 5, 64), (12, 12, 10, 12), (7, 20, 7, 20), (1, 3, 30, 40), (50, 128, 70, 128)],
)
def test_fisher_exact_equals_scipy(k_a, n_a, k_b, n_b):
    ref = stats.fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]], alternative="two-sided").pvalue
    assert st.fisher_exact_p(k_a, n_a, k_b, n_b) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    c = st.share_contrast(k_a, n_a, k_b, n_b)
    assert c.test == "fisher" and c.diff == pytest.approx(k_a / n_a - k_b / n_b)
    assert c.beyond_noise == (ref < 0.05)


def test_shares_that_could_not_differ_are_not_tested():
    c = st.share_contrast(0, 64, 0, 64)
    assert c.p is None and c.beyond_noise is None and c.verdict().startswith("not tested")
    with pytest.raises(ValueError, match="0 <= k <= n"):
        st.fisher_exact_p(5, 4, 1, 4)


def test_welch_equals_scipy():
    rng = np.random.default_rng(0)
    for a, b in ((rng.normal(0, 1, 8), rng.normal(0.8, 2, 5)), (rng.normal(0, 1, 64), rng.normal(0.1, 1, 64)),
                 ([-7.63, -2.88], [-4.1, -3.9, -4.4])):  # fmt: skip
        ref = stats.ttest_ind(a, b, equal_var=False)
        got = st.welch(a, b)
        assert got.p == pytest.approx(ref.pvalue, rel=1e-9) and got.diff == pytest.approx(np.mean(a) - np.mean(b))
    assert st.welch([1.0, 1.0], [1.0, 1.0]).p is None  # no spread, equal: not tested
    with pytest.raises(ValueError, match="at least 2"):
        st.welch([1.0], [2.0, 3.0])


def test_welch_from_a_summarys_means_and_ses_equals_scipy():
    """What a summary keeps (mean, SE of the mean, n) gives scipy's Welch test from the same statistics."""
    for m_a, se_a, n_a, m_b, se_b, n_b in ((-4.7, 0.9, 16, -1.4, 1.1, 16), (0.62, 0.01, 64, 0.6, 0.02, 5)):
        ref = stats.ttest_ind_from_stats(m_a, se_a * np.sqrt(n_a), n_a, m_b, se_b * np.sqrt(n_b), n_b, equal_var=False)
        got = st.welch_from_stats(m_a, se_a, n_a, m_b, se_b, n_b)
        assert got.test == "welch" and got.p == pytest.approx(ref.pvalue, rel=1e-9)


@pytest.mark.parametrize("n", [6, 12, 40])
def test_paired_permutation_equals_scipy(n):
    rng = np.random.default_rng(n)
    a = rng.normal(0.3, 1, n)
    b = a - rng.normal(0.4, 1, n)
    ref = stats.permutation_test(
        (a, b), lambda x, y: np.mean(x - y), permutation_type="samples", n_resamples=np.inf if n <= 16 else 20_000,
        alternative="two-sided", random_state=0,
    ).pvalue  # fmt: skip
    got = st.paired_permutation(a, b, n_resamples=20_000, seed=0)
    # exact for few pairs; beyond, two Monte Carlo estimates of different draws: within 4 SE of their difference
    tol = 1e-12 if n <= 16 else 4 * np.sqrt(2 * ref * (1 - ref) / 20_000)
    assert got.p == pytest.approx(ref, abs=tol) and got.test == "paired permutation"
    assert st.paired_permutation(a, a).verdict().startswith("not tested")


def test_bootstrap_interval_covers_the_mean_like_scipys():
    x = np.random.default_rng(3).normal(2.0, 1.0, 200)
    lo, hi = st.bootstrap_ci(x, n=4000, seed=1)
    ref = stats.bootstrap((x,), np.mean, n_resamples=4000, method="percentile", random_state=1).confidence_interval
    assert lo < x.mean() < hi
    assert lo == pytest.approx(ref.low, abs=0.03) and hi == pytest.approx(ref.high, abs=0.03)
