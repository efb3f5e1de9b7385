"""Search at test time (mle_jax/env/search.py) and the field's protocols (mle_jax/env/protocols.py), without a
sandbox: the printed metric, the tree's best node and debug depth, each policy's choices, the protocol tables, and
what evaluate's flags ask for."""

from __future__ import annotations

import numpy as np
import pytest

from mle_jax.env import printed_metric, protocols, search
from mle_jax.reporting.search_report import protocol_markdown, search_tables, tree_line

TAG = "@@mle0123456789ab@@"
SPOOKY = "spooky-author-identification"  # log loss: gold 0.16506, bronze 0.29381, median 0.418785
PIZZA = "random-acts-of-pizza"  # AUC: gold 0.97908, bronze 0.6921, median 0.5995


def test_the_printed_metric_is_the_tagged_testing_loss_value_and_only_that():
    out = f"{TAG} loaded data\n{TAG} testing loss: 0.5\nfold 2\n{TAG} testing loss: 0.4321\n"
    assert printed_metric.tagged_metric(out, TAG) == pytest.approx(0.4321)  # the last one: the final model's
    assert printed_metric.tagged_metric(f"{TAG} testing loss: np.float64(1.5e-2)\n", TAG) == pytest.approx(0.015)
    # an untagged print (the agent's own, escaped the stripping) and another run's tag count for nothing
    assert printed_metric.tagged_metric("testing loss: 0.01\n@@mleffffffffffff@@ testing loss: 0.02\n", TAG) is None
    assert printed_metric.tagged_metric(f"{TAG} testing loss:\n", TAG) is None  # printed without its value
    assert printed_metric.tagged_metric(f"{TAG} testing loss: nan\n{TAG} testing loss: inf", TAG) is None
    assert printed_metric.tagged_metric(f"{TAG} training loss: 0.3\n", TAG) is None
    assert printed_metric.tagged_metric(f"{TAG} testing loss: 0.3\n", None) is None  # never instrumented


def test_without_a_tagged_value_the_programs_own_validation_print_is_the_metric():
    out = f"validation auc: 0.61\n{TAG} testing loss:\nValidationError: x=3\nval_loss = 4e-1\ntraining auc: 0.99\n"
    assert printed_metric.program_metric(out) == pytest.approx(0.4)  # the last validation line
    assert printed_metric.node_metric(out, TAG) == (pytest.approx(0.4), "program")
    assert printed_metric.node_metric(out + f"{TAG} testing loss: 0.7\n", TAG) == (
        0.7,
        "instrumenter",
    )  # the tagged first
    assert printed_metric.program_metric("CV log loss: 0.52 (5 folds)\nvalidation rmsle of bandgap: nan") == 0.52
    assert printed_metric.node_metric("training loss: 0.3\ntesting loss: 0.2\n", TAG) == (None, None)


def _tree(lower: bool, *nodes: tuple[str, int | None, bool, float | None]) -> search.Tree:
    tree = search.Tree(lower)
    for op, parent, buggy, metric in nodes:
        node = tree.add(op, parent)
        tree.finish(node.id, buggy, metric)
    return tree


def test_the_best_node_is_by_printed_metric_in_the_tasks_direction_else_the_last_good_one():
    nodes = [("draft", None, False, 0.5), ("draft", None, False, 0.3), ("draft", None, True, None),
             ("improve", 0, False, 0.3), ("draft", None, False, None)]  # fmt: skip
    assert search.Tree(True).best() is None
    assert _tree(True, *nodes).best().id == 1  # lower is better; the first of equal metrics
    assert _tree(False, *nodes).best().id == 0
    no_metric = [("draft", None, False, None), ("draft", None, True, 0.9), ("draft", None, False, None)]
    assert _tree(False, *no_metric).best().id == 2  # none printed one: the last good node (a buggy one has no metric)
    assert _tree(False, ("draft", None, True, None)).best() is None


def test_debug_depth_counts_the_chain_of_debug_steps_as_aide_does():
    tree = _tree(False, ("draft", None, True, None), ("debug", 0, True, None), ("debug", 1, True, None),
                 ("improve", 2, True, None), ("debug", 3, True, None))  # fmt: skip
    assert [tree.debug_depth(i) for i in range(5)] == [0, 1, 2, 0, 1]
    assert [tree.is_leaf(i) for i in range(5)] == [False, False, False, False, True]
    with pytest.raises(ValueError, match="needs parent"):
        tree.add("improve", None)
    with pytest.raises(ValueError, match="unknown operator"):
        tree.add("mutate", 0)


def test_aide_drafts_first_then_debugs_a_buggy_leaf_or_improves_the_best():
    rng = np.random.default_rng(0)
    aide = search.Aide()
    assert (aide.num_drafts, aide.debug_prob, aide.max_debug_depth) == (5, 0.5, 3)  # AIDE's published defaults
    tree = search.Tree(False)
    for _ in range(4):
        tree.add("draft", None)
    assert aide.next_step(tree, rng) == search.Step("draft")  # drafts in flight count: 5 at once
    tree.add("draft", None)
    assert aide.next_step(tree, rng) is None  # the choice waits for the results
    for i, (buggy, metric) in enumerate([(True, None), (False, 0.6), (False, 0.7), (True, None), (False, None)]):
        tree.finish(i, buggy, metric)
    always_debug = search.Aide(debug_prob=1.0)
    picks = {always_debug.next_step(tree, np.random.default_rng(s)).parent for s in range(20)}
    assert picks == {0, 3} and all(
        always_debug.next_step(tree, np.random.default_rng(s)).operator == "debug" for s in range(5)
    )
    assert search.Aide(debug_prob=0.0).next_step(tree, rng) == search.Step("improve", 2)  # best printed metric
    # a buggy leaf past max_debug_depth is not debugged: then AIDE improves the best node
    deep = _tree(False, ("draft", None, True, None), ("debug", 0, True, None), ("debug", 1, True, None),
                 ("draft", None, False, 0.2))  # fmt: skip
    assert search.Aide(num_drafts=2, debug_prob=1.0, max_debug_depth=1).next_step(deep, rng) == search.Step(
        "improve", 3
    )
    assert search.Aide(num_drafts=2, debug_prob=1.0, max_debug_depth=2).next_step(deep, rng) == search.Step("debug", 2)
    all_buggy = _tree(False, ("draft", None, True, None))
    assert search.Aide(num_drafts=1, debug_prob=0.0).next_step(all_buggy, rng) == search.Step("draft")


def test_greedy_always_improves_the_best_and_independent_always_drafts():
    tree = _tree(True, ("draft", None, True, None), ("draft", None, False, 0.4), ("draft", None, False, 0.35))
    greedy = search.Greedy(num_drafts=3)
    assert all(greedy.next_step(tree, np.random.default_rng(s)) == search.Step("improve", 2) for s in range(10))
    assert greedy.next_step(_tree(True, ("draft", None, True, None)), None) == search.Step("draft")  # type: ignore[arg-type]
    assert search.Greedy(num_drafts=4).next_step(tree, None) == search.Step("draft")  # type: ignore[arg-type]
    assert search.Independent().next_step(tree, None) == search.Step("draft")  # type: ignore[arg-type]


def test_make_policy_names_its_policies_and_rejects_bad_settings_in_one_line():
    assert search.make_policy("aide", 2, 0.25, 1) == search.Aide(2, 0.25, 1)
    assert isinstance(search.make_policy("independent"), search.Independent)
    assert search.policy_settings(search.make_policy("greedy")) == {"name": "greedy", "num_drafts": 5}
    for bad, match in ((("mcts",), "unknown search policy 'mcts'"), (("aide", 0), "num_drafts"),
                       (("aide", 5, 1.5), "debug_prob"), (("aide", 5, 0.5, -1), "max_debug_depth")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            search.make_policy(*bad)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        search.new_searches(search.Aide(), 0, [0], [PIZZA], {PIZZA: False})


def _search(task: str, seed: int, scores: list[float | None], submitted: int | None) -> dict:
    """A search.Search.record() of drafts with these grader scores (None: invalid), `submitted` its choice."""
    from mle_jax.tasks.medals import medal

    nodes = [{"id": i, "parent": None, "operator": "draft", "buggy": s is None, "metric": s, "valid": s is not None,
              "score": s, "medal": None if s is None else medal(task, s)} for i, s in enumerate(scores)]  # fmt: skip
    sub = nodes[submitted] if submitted is not None else None
    return {
        "task": task, "seed": seed, "policy": "aide", "budget": len(scores), "wall_s": 1.0,
        "programs_run": len(scores), "nodes": nodes,
        "submitted": {"node": submitted, "metric": sub and sub["metric"], "valid": bool(sub and sub["valid"]),
                      "score": sub and sub["score"], "medal": sub and sub["medal"]},
    }  # fmt: skip


def test_the_summary_over_seeds_counts_the_submissions_with_their_ses():
    runs = [_search(SPOOKY, 0, [0.5, 0.2], 1), _search(SPOOKY, 1, [None, 0.45], 1), _search(SPOOKY, 2, [None], None)]
    s = protocols.search_summary(runs, lower_is_better=True)
    assert s["seeds"] == 3 and s["valid_rate"] == pytest.approx(2 / 3)
    assert s["valid_rate_se"] == pytest.approx(np.std([1, 1, 0], ddof=1) / np.sqrt(3))
    assert s["mean_score"] == pytest.approx(0.325) and s["best_score"] == 0.2
    assert s["any_medal"] == pytest.approx(1 / 3)  # 0.2 is silver; 0.45 is below the median (0.418785)
    assert s["levels"]["silver"] == pytest.approx(1 / 3) and s["levels"]["invalid"] == pytest.approx(1 / 3)
    assert s["levels"]["none"] == pytest.approx(1 / 3)
    assert s["node_valid_fraction"] == pytest.approx(3 / 5) and s["oracle_mean_score"] == pytest.approx(0.325)
    assert s["draft_good"] == pytest.approx(3 / 5) and s["debug_good"] is None and s["copies_parent"] is None


def test_operator_outcomes_say_whether_debugs_fixed_and_improvements_improved():
    run = _search(SPOOKY, 0, [None, 0.5, 0.45, None, 0.6], None)
    for i, (op, parent, code) in enumerate([("draft", None, "a"), ("debug", 0, "b"), ("improve", 1, "c"),
                                            ("debug", 0, "a"), ("improve", 2, "e")]):  # fmt: skip
        run["nodes"][i].update(operator=op, parent=parent, code=code)
    out = protocols.operator_outcomes([run], lower_is_better=True)
    assert out["draft_good"] == 0.0 and out["debug_good"] == 0.5 and out["improve_good"] == 1.0
    assert out["improve_better_metric"] == 0.5 and out["improve_better_score"] == 0.5  # 0.45 < 0.5; 0.6 > 0.45
    assert out["copies_parent"] == 0.25  # node 3 is node 0's program again


def test_the_mlebench_table_has_medal_shares_and_the_lite_aggregate_over_seeds():
    per_task = {
        # gold, none, above the median (bronze is 0.29381); bronze, gold, invalid
        SPOOKY: [_search(SPOOKY, k, [x], 0) for k, x in enumerate([0.15, 0.5, 0.3])],
        PIZZA: [_search(PIZZA, k, [x], 0 if x else None) for k, x in enumerate([0.7, 0.98, None])],
    }  # fmt: skip
    t = protocols.mlebench_table(per_task, [0, 1, 2])
    spooky = t["tasks"][0]
    assert spooky["lite"] and spooky["levels_by_seed"] == ["gold", "none", "above_median"]
    assert spooky["any_medal"] == pytest.approx(1 / 3) and spooky["shares"]["gold"] == pytest.approx(1 / 3)
    assert t["tasks"][1]["shares"]["invalid"] == pytest.approx(1 / 3) and t["tasks"][1]["valid_rate"] == pytest.approx(
        2 / 3
    )
    # per seed, the share of the Lite tasks with a medal: seed 0 both, seed 1 pizza only, seed 2 none
    assert t["lite"]["per_seed"] == [1.0, 0.5, 0.0] and t["lite"]["any_medal"] == pytest.approx(0.5)
    assert t["lite"]["any_medal_se"] == pytest.approx(0.5 / np.sqrt(3))
    assert t["all"]["tasks"] == [SPOOKY, PIZZA]
    text = protocol_markdown({**t, "search": {"name": "aide", "budget": 1, "seeds": [0, 1, 2], "model": "tiny"}})
    assert "not the leaderboard's 24-hour setting" in text and "| lite (2 tasks) |" in text


def test_the_ml_agent_table_has_average_and_best_in_the_tasks_direction_beside_theirs():
    per_task = {SPOOKY: [_search(SPOOKY, k, [x], 0 if x else None) for k, x in enumerate([0.5, 0.4, None, 0.6])]}
    t = protocols.ml_agent_table(per_task, {SPOOKY: True}, trained_on=[PIZZA])
    (row,) = t["rows"]
    assert row["split"] == "held-out" and row["valid_runs"] == 3 and row["runs"] == 4
    assert row["average"] == pytest.approx(0.5) and row["best"] == 0.4  # log loss: the lowest
    assert row["ml_agent"]["average"] == 0.4415 and row["ml_agent"]["best"] == 0.4078
    assert row["ml_agent"]["split"] == "held-out"
    pizza = protocols.ml_agent_table({PIZZA: [_search(PIZZA, 0, [0.6, 0.7], 1)]}, {PIZZA: False}, [PIZZA])["rows"][0]
    assert pizza["split"] == "held-in" and pizza["best"] == 0.7 and "ml_agent" not in pizza  # not one of theirs
    text = protocol_markdown({**t, "search": {"name": "aide", "budget": 1, "seeds": list(range(8))}})
    assert "0.4415 / 0.4078 (held-out)" in text and "another model and budget" in text


def test_the_search_tables_draw_each_seeds_tree_and_its_medal():
    runs = [_search(PIZZA, 0, [None, 0.7], 1), _search(PIZZA, 1, [None], None)]
    runs[0]["nodes"][1].update(operator="debug", parent=0)
    evaluation = {
        "task": PIZZA,
        "search": {"name": "aide", "num_drafts": 5, "budget": 2, "seeds": [0, 1]},
        "tasks": {PIZZA: {"summary": protocols.search_summary(runs, False), "searches": runs}},
    }
    assert tree_line(runs[0]["nodes"]) == "xd b^0"
    text = search_tables(evaluation)
    assert "search `aide` (num_drafts 5), budget 2 programs per task and seed, 2 seed(s)" in text
    assert f"| {PIZZA} | 0 | xd b^0 | 1 | 0.7 | 0.7 | bronze |" in text
    assert f"| {PIZZA} | 1 | xd | — | — | — | invalid |" in text


def test_the_readme_contrasts_sign_the_difference_by_the_tasks_direction_and_test_it_over_seeds():
    from scipy import stats

    from mle_jax.reporting.results_tables.search import render_search_contrasts, render_search_lite

    def table(name: str, scores: list[float | None]) -> dict:
        runs = [_search(SPOOKY, k, [x], None if x is None else 0) for k, x in enumerate(scores)]
        t = protocols.mlebench_table({SPOOKY: runs}, list(range(len(scores))))
        search_cfg = {"name": name, "budget": 1, "seeds": list(range(len(scores))), "policy_checkpoint": "latest"}
        return {**t, "search": search_cfg, "summaries": {SPOOKY: protocols.search_summary(runs, True)}}

    independent, aide = table("independent", [0.45, 0.46, 0.47]), table("aide", [0.15, 0.16, None])
    text = render_search_contrasts(independent, aide)
    # lower log loss is better: + 0.305; Welch over the valid seeds (2 and 3) as scipy computes it
    welch = stats.ttest_ind([0.15, 0.16], [0.45, 0.46, 0.47], equal_var=False).pvalue
    assert (
        f"| {SPOOKY} | after RL | `aide` − `independent` | 3 / 3 | +0.305 (Welch p = {welch:.2g}, beyond noise) |"
        in text
    )
    # valid 2 of 3 against 3 of 3, a medal 2 of 3 against 0 of 3 (log loss 0.15 and 0.16 earn one): Fisher
    valid, medal = stats.fisher_exact([[2, 1], [3, 0]]).pvalue, stats.fisher_exact([[2, 1], [0, 3]]).pvalue
    assert f"| −0.333 (Fisher p = {valid:.2g}, within noise) | +0.667 (Fisher p = {medal:.2g}, within noise) |" in text
    assert "| after RL | `aide` | 0.67 ± 0.33 | 0.67 ± 0.33 |" in render_search_lite(independent, aide)
    # the prompted model's searches (a run without a warm start, evaluate.model_label) are labelled as such
    prompted = {"model": "qwen2.5-coder-0.5b-instruct, prompted (no warm start) policy of run r"}
    before = [{**t, "search": {**t["search"], "policy_checkpoint": "initial", **prompted}} for t in (independent, aide)]
    assert f"| {SPOOKY} | prompted | `aide` − `independent` | 3 / 3 |" in render_search_contrasts(*before)
