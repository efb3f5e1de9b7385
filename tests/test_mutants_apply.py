"""tests/mutants.py stays applicable: each mutation's text occurs exactly once in the code it mutates (a mutant
whose text the code no longer has would stop `python -m tests.mutants` before any mutant ran)."""

from __future__ import annotations

import pytest

from tests.mutants import MUTANTS, REPO


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutation_applies_once(mutant):
    source = (REPO / mutant.path).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.name}: {mutant.old!r} occurs {source.count(mutant.old)} times"
    assert mutant.new not in source
