"""One home for the statistics of every contrast the experiments report: exact tests for shares, Welch's test and a
bootstrap for means, a paired permutation test for arms that answer the same start prompts, and the one rule for
"beyond noise".

The rule: a contrast shows beyond noise when its two-sided p-value is below `ALPHA` (0.05) under the test that fits
its data, named beside it; "not tested" when the arms could not differ (`identical`). Where arms are separate RL
runs, the unit is the seed (one number per run), never the samples of a run.

Each function is pure (numbers in, numbers out); scipy is only the tests' reference (tests/reporting).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import special

ALPHA = 0.05  # two-sided: a contrast is beyond noise when p < ALPHA


@dataclasses.dataclass(frozen=True)
class Contrast:
    """a − b of one figure: the difference, its test, the test's p-value, n of each arm, and the verdict."""

    diff: float
    test: str  # "fisher" | "welch" | "paired permutation" | "not tested"
    p: float | None
    n_a: int
    n_b: int

    @property
    def beyond_noise(self) -> bool | None:
        """p < ALPHA; None when not tested."""
        return None if self.p is None else self.p < ALPHA

    def verdict(self) -> str:
        if self.p is None:
            return "not tested (the arms could not differ)"
        return f"{'beyond noise' if self.beyond_noise else 'within noise'} ({self.test}, p = {self.p:.3g})"


def _log_binom(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact_p(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test for k_a of n_a against k_b of n_b: the probability, under the
    hypergeometric law of the 2x2 table with these margins, of every table no more likely than the observed one
    (relative tolerance 1e-7, as R and scipy)."""
    if not (0 <= k_a <= n_a and 0 <= k_b <= n_b):
        raise ValueError(f"shares must be 0 <= k <= n: {k_a}/{n_a}, {k_b}/{n_b}")
    k, n = k_a + k_b, n_a + n_b
    lo, hi = max(0, k - n_b), min(k, n_a)
    log_total = _log_binom(n, k)
    pmf = np.array([math.exp(_log_binom(n_a, x) + _log_binom(n_b, k - x) - log_total) for x in range(lo, hi + 1)])
    observed = pmf[k_a - lo]
    return float(min(1.0, pmf[pmf <= observed * (1 + 1e-7)].sum()))


def share_contrast(k_a: int, n_a: int, k_b: int, n_b: int) -> Contrast:
    """The share k_a/n_a − k_b/n_b with Fisher's exact test ("not tested" when both arms are all or none alike)."""
    diff = k_a / n_a - k_b / n_b
    if (k_a in (0, n_a)) and (k_b in (0, n_b)) and k_a / n_a == k_b / n_b:
        return Contrast(diff, "not tested", None, n_a, n_b)
    return Contrast(diff, "fisher", fisher_exact_p(k_a, n_a, k_b, n_b), n_a, n_b)


def _t_sf2(t: float, df: float) -> float:
    """Two-sided tail of Student's t with df degrees of freedom: P(|T| >= |t|) = I_{df/(df+t²)}(df/2, 1/2)."""
    return float(special.betainc(df / 2.0, 0.5, df / (df + t * t)))


def welch(a: Sequence[float], b: Sequence[float]) -> Contrast:
    """mean(a) − mean(b) with Welch's unequal-variance t-test (two-sided). a: [n_a], b: [n_b], each n >= 2; arms
    with no spread at all are "not tested" when their means are equal, else p = 0."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.size < 2 or y.size < 2:
        raise ValueError(f"Welch's test needs at least 2 values per arm, got {x.size} and {y.size}")
    se_a, se_b = math.sqrt(x.var(ddof=1) / x.size), math.sqrt(y.var(ddof=1) / y.size)
    return welch_from_stats(float(x.mean()), se_a, x.size, float(y.mean()), se_b, y.size)


def welch_from_stats(mean_a: float, se_a: float, n_a: int, mean_b: float, se_b: float, n_b: int) -> Contrast:
    """mean_a − mean_b with Welch's test from each arm's mean, the standard error of that mean and its n (>= 2): what
    a summary keeps of its samples. Both SEs 0: "not tested" when the means are equal, else p = 0."""
    if n_a < 2 or n_b < 2:
        raise ValueError(f"Welch's test needs at least 2 values per arm, got {n_a} and {n_b}")
    diff = float(mean_a - mean_b)
    va, vb = se_a**2, se_b**2
    se2 = va + vb
    if se2 == 0:
        return Contrast(diff, "not tested" if diff == 0 else "welch", None if diff == 0 else 0.0, n_a, n_b)
    df = se2**2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    return Contrast(diff, "welch", _t_sf2(diff / math.sqrt(se2), df), n_a, n_b)


def paired_permutation(a: Sequence[float], b: Sequence[float], n_resamples: int = 20_000, seed: int = 0) -> Contrast:
    """mean(a − b) over pairs (the same start prompt answered by both arms) with the sign-flip permutation test of
    the mean difference (two-sided): exact over all 2^n sign patterns for n <= 16 pairs, else `n_resamples` random
    ones (the observed pattern counted, as scipy's). a, b: [n]. All differences zero: "not tested"."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if d.ndim != 1 or d.size != np.asarray(b).size or d.size == 0:
        raise ValueError("paired arms need the same number (> 0) of values")
    n, observed = d.size, abs(d.mean())
    if not d.any():
        return Contrast(0.0, "not tested", None, n, n)
    if n <= 16:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
        means = np.abs((signs * d).mean(axis=1))
        p = float(np.mean(means >= observed * (1 - 1e-12)))
    else:
        rng = np.random.default_rng(seed)
        signs = rng.choice((-1.0, 1.0), size=(n_resamples, n))
        means = np.abs((signs * d).mean(axis=1))
        p = float((np.sum(means >= observed * (1 - 1e-12)) + 1) / (n_resamples + 1))
    return Contrast(float(d.mean()), "paired permutation", p, n, n)


def bootstrap_ci(
    x: Sequence[float],
    stat: Callable[[np.ndarray], float] = np.mean,
    level: float = 0.95,
    n: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of stat(x) at `level` from n resamples. x: [m], m >= 1."""
    v = np.asarray(x, np.float64)
    if v.size == 0:
        raise ValueError("a bootstrap needs at least one value")
    rng = np.random.default_rng(seed)
    draws = np.array([stat(v[rng.integers(0, v.size, v.size)]) for _ in range(n)])
    tail = (1 - level) / 2
    return float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))
