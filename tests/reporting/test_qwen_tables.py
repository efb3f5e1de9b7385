"""docs/qwen.md's improve table from bench lines made by hand: the counts, and Fisher's test as scipy computes it."""

from __future__ import annotations

from scipy import stats

from mle_jax.reporting.results_tables.qwen import render_qwen_improve

PIZZA = "random-acts-of-pizza"


def _line(stage: str, valid: int, n: int, **kw) -> dict:
    outcomes = {"valid": valid, "no code": n - valid}
    return {"stage": stage, "task": PIZZA, "valid_fraction": valid / n, "outcomes": outcomes,
            "mean_score": 0.61 if valid else None, "truncated": 1, "sample_s": 120.0, **kw}  # fmt: skip


def test_the_improve_table_counts_revisions_and_tests_them_against_the_scratch_prompt():
    lines = [
        _line("prompted", 0, 128, samples=128),
        _line("improve", 5, 64, programs=64, parents_mean_score=0.66, better_than_parent=2, copies_of_parent=3,
              valid_copies=1),  # an older line of the task: the newest counts
        _line("improve", 9, 64, programs=64, parents_mean_score=0.66, better_than_parent=4, copies_of_parent=7,
              valid_copies=6),
    ]  # fmt: skip
    text = render_qwen_improve(lines)
    p = stats.fisher_exact([[9, 55], [0, 128]]).pvalue
    assert (
        f"| 9 of 64 | 0.610 | 0.660 | 4 of 64 | 7 (6 valid) | valid 9, no code 55 | +0.141 (Fisher p = {p:.2g}; scratch"
        in text
    )
    assert "scratch 0 of 128) | 1 of 64, 2 min |" in text
    assert render_qwen_improve(lines[:1] + [_line("improve", 0, 64, programs=64, parents_mean_score=0.66,
                                                   better_than_parent=0, copies_of_parent=0, valid_copies=0)]).count(
        "no test: both arms none or all alike") == 1  # fmt: skip
