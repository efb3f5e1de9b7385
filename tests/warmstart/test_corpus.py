"""The warm-start corpus generator: deterministic, diverse, well-formed programs."""

from __future__ import annotations

import ast
from collections import Counter

import pytest

from mle_jax.tasks.registry import all_specs
from mle_jax.warmstart.corpus import CorpusItem, public_dir_in_sandbox, verify_corpus
from mle_jax.warmstart.programs import full_grid, generate_corpus, registered_tasks, solution_kind
from mle_jax.warmstart.programs.insults import INSULTS
from mle_jax.warmstart.programs.leaf import LEAF
from mle_jax.warmstart.programs.nomad2018 import NOMAD
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.programs.spooky import SPOOKY
from mle_jax.warmstart.programs.tweet import TWEET


def test_same_seed_same_corpus_other_seed_other_order():
    a = generate_corpus(PIZZA, 40, seed=3)
    b = generate_corpus(PIZZA, 40, seed=3)
    c = generate_corpus(PIZZA, 40, seed=4)
    assert [x.code for x in a] == [x.code for x in b] and [x.plan for x in a] == [x.plan for x in b]
    assert [x.key for x in a] != [x.key for x in c]


def test_corpus_is_diverse_and_balanced_over_families():
    items = generate_corpus(PIZZA, 70, seed=0, packages=["xgboost", "lightgbm"])
    assert len({it.key for it in items}) == 70
    assert len({it.code for it in items}) == 70
    families = Counter(it.meta["model"] for it in items)
    assert set(families) == {
        "logreg",
        "naive_bayes",
        "linear_svm",
        "random_forest",
        "extra_trees",
        "gradient_boosting",
        "hist_gradient_boosting",
        "xgboost",
        "lightgbm",
    }
    assert max(families.values()) - min(families.values()) <= 1  # round-robin over families
    assert len({it.meta["features"] for it in items}) == 6


def test_optional_packages_gate_their_families():
    plain = {it.meta["model"] for it in full_grid(PIZZA)}
    assert "xgboost" not in plain and "lightgbm" not in plain
    assert all("xgboost" not in it.code and "lightgbm" not in it.code for it in full_grid(PIZZA))


@pytest.mark.parametrize("packages", [None, ["xgboost", "lightgbm"]])
def test_every_program_parses_and_follows_the_task_contract(packages):
    for it in full_grid(PIZZA, packages):
        tree = ast.parse(it.code)
        assert public_dir_in_sandbox(PIZZA) + "train.json" in it.code
        assert '"submission.csv"' in it.code and '"request_id"' in it.code
        assert '"requester_received_pizza"' in it.code
        # never the retrieval-time leaks, which the public test.json lacks
        assert "_at_retrieval" not in it.code and "requester_user_flair" not in it.code
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert {"features", "model", "X", "X_test", "pred"} <= names
        assert 3 <= it.plan.count(". ") + 1 <= 5, it.plan  # a 3-5 sentence plan
        resp = it.response()
        assert resp.count("```python\n") == 1 and resp.endswith("```")


def test_plan_names_the_choice_the_code_makes():
    for it in generate_corpus(PIZZA, 30, seed=1):
        hp = it.meta["hparams"]
        for k in ("n_estimators", "max_features", "max_iter", "C", "alpha"):
            if k in hp:
                assert str(hp[k]) in it.plan and str(hp[k]) in it.code


def test_bad_requests_fail_clearly():
    with pytest.raises(KeyError, match="no warm-start corpus generator"):
        generate_corpus("no-such-task", 4)
    with pytest.raises(ValueError, match="distinct programs"):
        generate_corpus(PIZZA, 10**6)


def test_every_program_module_is_found_by_name():
    assert registered_tasks() == sorted([PIZZA, SPOOKY, INSULTS, LEAF, NOMAD, TWEET])


def test_every_task_with_data_has_a_corpus():
    assert set(registered_tasks()) == {s.id for s in all_specs() if s.has_data_here}


# task -> (files the programs read, strings every program writes for its submission, model families without and
# with the optional xgboost/lightgbm, least grid size without them)
CONTRACTS = {
    INSULTS: (["train.csv", "test.csv"], ['"Insult"', '"Comment"', '"Date"'], (5, 7), 200),
    LEAF: (["train.csv", "test.csv"], ['sub.insert(0, "id"', "columns=model.classes_"], (8, 9), 130),
    NOMAD: (["train.csv", "test.csv"], ['"id"', '"formation_energy_ev_natom"', '"bandgap_energy_ev"'], (7, 9), 140),
    TWEET: (["train.csv", "test.csv"], ['"textID"', '"selected_text"'], (7, 8), 100),
}


@pytest.mark.parametrize("task_id", sorted(CONTRACTS))
@pytest.mark.parametrize("packages", [None, ["xgboost", "lightgbm"]])
def test_new_grids_are_well_formed_and_diverse(task_id, packages):
    files, writes, n_families, least = CONTRACTS[task_id]
    grid = full_grid(task_id, packages)
    assert len({it.key for it in grid}) == len({it.code for it in grid}) == len(grid)
    families = Counter(it.meta["model"] for it in grid)
    assert len(families) == n_families[1 if packages else 0]
    if packages is None:
        assert len(grid) >= least
        assert all("xgboost" not in it.code and "lightgbm" not in it.code for it in grid)
    for it in grid:
        ast.parse(it.code)
        assert it.meta["task"] == task_id
        for name in files:
            assert f'"{public_dir_in_sandbox(task_id)}{name}"' in it.code
        assert '.to_csv("submission.csv", index=False)' in it.code and all(w in it.code for w in writes)
        assert it.code.count("train_test_split(") == 1  # every program validates on a hold-out of train
        assert 3 <= it.plan.count(". ") + 1 <= 5, it.plan
        resp = it.response()
        assert resp.count("```python\n") == 1 and resp.endswith("```")
    picked = generate_corpus(task_id, len(families), seed=0, packages=packages)
    assert {it.meta["model"] for it in picked} == set(families)  # n items cover every family first


def test_plans_name_the_hyperparameters_the_code_uses():
    for task_id in CONTRACTS:
        for it in generate_corpus(task_id, 40, seed=2, packages=["xgboost", "lightgbm"]):
            for k, v in it.meta["hparams"].items():
                if k in ("C", "alpha", "n_estimators", "threshold", "n_neighbors", "max_iter", "smooth"):
                    assert str(v) in it.plan and str(v) in it.code, (task_id, k, v)


def test_verify_corpus_keeps_only_valid_programs_in_order():
    items = generate_corpus(PIZZA, 6, seed=0)

    class G:
        def __init__(self, valid, score):
            self.valid, self.score, self.reason = valid, score, ""

    scores = {it.code: (i % 3 != 1, 0.5 + i / 100) for i, it in enumerate(items)}
    out = verify_corpus(
        items, PIZZA, lambda code: (G(*scores[code]), 1.0, f"out {scores[code][1]}"), workers=2, progress=False
    )
    assert [v.item for v in out] == [it for i, it in enumerate(items) if i % 3 != 1]
    assert [v.score for v in out] == [0.5 + i / 100 for i in range(6) if i % 3 != 1]
    assert [v.output for v in out] == [f"out {0.5 + i / 100}" for i in range(6) if i % 3 != 1]
    broken = CorpusItem("plan.", "def f(:\n", {"model": "x", "features": "y", "hparams": {}})
    with pytest.raises(SyntaxError, match="does not parse"):
        verify_corpus([broken], PIZZA, lambda code: (G(True, 1.0), 1.0, ""), progress=False)


def test_spooky_grid_is_well_formed_and_diverse():
    grid = full_grid(SPOOKY)
    assert len({it.key for it in grid}) == len(grid) >= 200
    for it in grid:
        ast.parse(it.code)
        assert public_dir_in_sandbox(SPOOKY) + "train.csv" in it.code and '"submission.csv"' in it.code
        assert "predict_proba(X_test)" in it.code and 'sub.insert(0, "id"' in it.code
    items = generate_corpus(SPOOKY, 12, seed=0)
    assert len({it.meta["model"] for it in items}) == 4


def test_solution_kind_names_the_model_family_of_every_grid_program():
    for it in full_grid(PIZZA, ["xgboost", "lightgbm"]):
        assert solution_kind(PIZZA, it.code) == it.meta["model"]
    # spooky's kinds are the family and the text representation (words + characters is the slow, good one)
    for it in full_grid(SPOOKY):
        assert solution_kind(SPOOKY, it.code) == f"{it.meta['model']} {it.meta['features']}"
    assert len({solution_kind(SPOOKY, it.code) for it in full_grid(SPOOKY)}) == 12
    assert solution_kind(PIZZA, None) == "no code"
    assert solution_kind(PIZZA, "import pandas as pd\nprint(1)\n") == "other"
