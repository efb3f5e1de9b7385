"""Fault injection into corpus programs: each kind changes what it says it changes, the program still parses,
the same seed gives the same fault, and the names the "api" fault writes exist in no scikit-learn module."""

from __future__ import annotations

import ast
import difflib
import importlib
import random
import re
from collections import Counter

import pytest

from mle_jax.warmstart.faults import (
    FAULT_KINDS,
    OLD_MODULES,
    WRONG_METHODS,
    WRONG_NAMES,
    inject,
    misspell,
    plan_faults,
)
from mle_jax.warmstart.programs import full_grid, generate_corpus, registered_tasks
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.programs.spooky import SPOOKY
from mle_jax.warmstart.programs.tweet import TWEET


def changed_lines(a: str, b: str) -> tuple[list[str], list[str]]:
    """(lines only in a, lines only in b)."""
    diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0))
    body = [x for x in diff if not x.startswith(("---", "+++", "@@"))]
    return [x[1:] for x in body if x[0] == "-"], [x[1:] for x in body if x[0] == "+"]


def string_constants(code: str) -> Counter:
    return Counter(
        n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


def imported_names(code: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            out |= {a.asname or a.name.split(".")[0] for a in node.names}
    return out


@pytest.fixture(scope="module")
def programs():
    """Two programs of every task's grid (different families), the optional packages included."""
    out = []
    for task_id in registered_tasks():
        out += generate_corpus(task_id, 2, seed=1, packages=["xgboost", "lightgbm"])
    return out


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_kind_applies_to_every_grid_and_changes_what_it_says(programs, kind):
    for item in programs:
        for seed in range(4):
            fault = inject(item.code, kind, seed)
            assert fault is not None, (kind, item.meta)
            assert fault.kind == kind and fault.code != item.code
            ast.parse(fault.code)  # a runtime fault, never a syntax error
            assert fault == inject(item.code, kind, seed)  # deterministic
            gone, added = changed_lines(item.code, fault.code)
            if kind == "column":  # one string constant renamed, every other character the same
                before, after = string_constants(item.code), string_constants(fault.code)
                assert sum((before - after).values()) == 1 and sum((after - before).values()) == 1
                old, new = next(iter(before - after)), next(iter(after - before))
                line, quoted = gone[0], f'"{old}"'
                at = [i for i in range(len(line)) if line.startswith(quoted, i)]
                assert len(gone) == len(added) == 1
                assert added[0] in {line[:i] + f'"{new}"' + line[i + len(quoted) :] for i in at}  # one occurrence
                assert abs(len(new) - len(old)) <= 1  # a misspelling: a letter swapped, dropped, doubled or recased
            elif kind == "import":  # one imported name gone, still used
                missing = imported_names(item.code) - imported_names(fault.code)
                assert len(missing) == 1 and len(added) <= 1  # the line gone, or the statement without the name
                name = missing.pop()
                used = {n.id for n in ast.walk(ast.parse(fault.code)) if isinstance(n, ast.Name)}
                assert name in used
            elif kind == "path":  # the one data path changed, to a path that is not the public folder's file
                assert len(gone) == len(added) == 1
                assert "/prepared/public/" in gone[0] and "/workdir/" in gone[0]
                assert gone[0] != added[0] and "pd.read_" in added[0]
            elif kind == "api":  # a wrong scikit-learn name, at the import and at every use when it is imported
                wrong = set(WRONG_NAMES.values()) | set(WRONG_METHODS.values()) | set(OLD_MODULES.values())
                words = re.compile(r"\b(" + "|".join(re.escape(w) for w in wrong) + r")\b")
                assert any(words.search(line) for line in added) and not any(words.search(line) for line in gone)
            else:  # shape: the whole matrix fitted against the split's labels, or predictions of validation rows
                assert len(gone) == len(added) >= 1
                assert any(".fit(X, " in line for line in added) or any(
                    "X_va" in line or "va[" in line for line in added
                ), added


def test_seeds_spread_over_sites():
    item = next(it for it in full_grid(PIZZA) if it.meta["features"] == "tfidf+num+len")
    for kind in FAULT_KINDS:
        variants = {inject(item.code, kind, seed).code for seed in range(30)}
        assert len(variants) >= 2, kind


def test_shape_faults_cover_both_forms():
    item = generate_corpus(SPOOKY, 1, seed=0)[0]
    whats = {inject(item.code, "shape", seed).what for seed in range(20)}
    assert any(w.startswith("fit(X_tr") for w in whats) and any(w.startswith("predictions of X_test") for w in whats)
    tweet = generate_corpus(TWEET, 1, seed=0)[0]  # no fit(X_tr, y_tr): its test predictions on validation rows
    assert inject(tweet.code, "shape", 0).what == "predictions of test -> va"


def test_an_unknown_kind_is_refused_and_a_program_without_a_site_gets_none():
    with pytest.raises(ValueError, match="fault kind must be one of"):
        inject("x = 1\n", "typo", 0)
    for kind in FAULT_KINDS:
        assert inject("print(1)\n", kind, 0) is None


def test_misspell_changes_the_word():
    rng = random.Random(0)
    for word in ("author", "id", "Insult", "text", "request_id", "a"):
        spelt = {misspell(word, rng) for _ in range(20)}
        assert word not in spelt and spelt


def test_wrong_names_exist_in_no_scikit_learn_module():
    """The "api" fault's names fail in the sandbox's scikit-learn (the same version as this venv's)."""
    modules = [
        "sklearn",
        "sklearn.calibration",
        "sklearn.discriminant_analysis",
        "sklearn.ensemble",
        "sklearn.feature_extraction",
        "sklearn.feature_extraction.text",
        "sklearn.linear_model",
        "sklearn.metrics",
        "sklearn.model_selection",
        "sklearn.naive_bayes",
        "sklearn.neighbors",
        "sklearn.neural_network",
        "sklearn.pipeline",
        "sklearn.preprocessing",
        "sklearn.svm",
    ]
    loaded = [importlib.import_module(m) for m in modules]
    for real, wrong in WRONG_NAMES.items():
        assert any(hasattr(m, real) for m in loaded), real  # the real name is a scikit-learn one
        assert not any(hasattr(m, wrong) for m in loaded), wrong
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    for real, wrong in WRONG_METHODS.items():
        owners = [o for o in (LogisticRegression, TfidfVectorizer) if hasattr(o, real)]
        assert owners and not any(hasattr(o, wrong) for o in (LogisticRegression, TfidfVectorizer))
    for old in OLD_MODULES.values():
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_plan_faults_goes_round_programs_and_kinds():
    items = generate_corpus(PIZZA, 10, seed=0)
    planned = plan_faults(items, 25, seed=3)
    assert planned == plan_faults(items, 25, seed=3) and planned != plan_faults(items, 25, seed=4)
    assert len(planned) == 25 and len({f.code for _, f in planned}) == 25  # distinct faulty programs
    assert set(Counter(it.code for it, _ in planned).values()) <= {2, 3}  # every program a source, evenly
    assert set(Counter(f.kind for _, f in planned)) == set(FAULT_KINDS)
    once = plan_faults(items, 10, seed=3)  # one round: each program once, the kinds in turn
    assert sorted(it.code for it, _ in once) == sorted(it.code for it in items)
    assert Counter(f.kind for _, f in once) == Counter(dict.fromkeys(FAULT_KINDS, 2))
    assert all(f.code != it.code for it, f in planned)
    assert plan_faults(items, 0, seed=0) == [] and plan_faults([], 5, seed=0) == []
