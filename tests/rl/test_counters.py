"""Run-long loop counters and the shares the run summary reports from them."""

from __future__ import annotations

import numpy as np
import pytest

from mle_jax.env.evaluation import standard_error
from mle_jax.rl.loop import LoopCounters


def test_instrument_shares_are_of_the_programs_that_parse():
    c = LoopCounters(instrumented_lm=3, instrumented_fallback=1, instrumented_unparsed=4)
    assert c.instrument_shares() == {"lm": 0.75, "fallback": 0.25, "unparsed": 0.5}


def test_instrument_shares_are_none_when_nothing_parsed_or_ran():
    assert LoopCounters(instrumented_unparsed=2).instrument_shares() == {"lm": None, "fallback": None, "unparsed": 1.0}
    assert LoopCounters().instrument_shares() == {"lm": None, "fallback": None, "unparsed": None}


def test_standard_error_matches_the_textbook_formula():
    xs = [1.0, 2.0, 4.0, 7.0]
    assert standard_error(xs) == pytest.approx(np.std(xs, ddof=1) / 2.0)
    assert standard_error(np.array([3.0])) is None and standard_error([]) is None
