"""Warm-start examples on the RL improve prompt: built from verified programs and their captured outputs,
targets differ from (and where possible beat) the source, and the rendered prompts fit the RL budget."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from configs import pizza as pizza_config
from mle_jax.instrument import PROGRESS_PRINTS
from mle_jax.run.settings import from_config
from mle_jax.tasks.prepare import prepare
from mle_jax.tasks.prompts import _encode, parse_response, render_prompt
from mle_jax.warmstart.corpus import VerifiedItem
from mle_jax.warmstart.improve import (
    change_sentence,
    improve_count,
    improve_examples,
    improve_pairs,
    improve_prompt,
    kind_means,
)
from mle_jax.warmstart.programs import full_grid, generate_corpus, solution_kind
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.settings import WarmStartSettings
from mle_jax.warmstart.sft import train_task_tokenizer
from mle_jax.warmstart.stage import sft_examples


def run_output(i: int) -> str:
    """The terminal output of an AST-instrumented pizza corpus program (as captured in verification)."""
    return (
        "imported packages\nloaded data\ndefined model\ntrained model\n"
        f"validation auc: 0.{6123456789012345 + 7919 * i}\ntesting loss:\npredicted test labels\n"
    )


def verified_items(items) -> list[VerifiedItem]:
    return [VerifiedItem(it, 0.55 + (i * 7 % 13) / 100, 1.0, run_output(i)) for i, it in enumerate(items)]


@pytest.fixture(scope="module")
def task(raw_data_dir: Path, tmp_path_factory):
    return prepare(PIZZA, raw_data_dir / PIZZA, tmp_path_factory.mktemp("pizza") / "prepared")


def test_improve_count_gives_the_configured_share():
    assert improve_count(64, 0.5) == 64 and improve_count(60, 0.25) == 20 and improve_count(64, 0.0) == 0
    with pytest.raises(ValueError, match="improve_fraction"):
        improve_count(64, 1.0)


@pytest.mark.parametrize("lower_is_better", [False, True])
def test_pairs_target_another_program_that_scores_better(lower_is_better):
    verified = verified_items(generate_corpus(PIZZA, 12, seed=0))
    pairs = improve_pairs(verified, 36, seed=5, lower_is_better=lower_is_better)
    assert pairs == improve_pairs(verified, 36, seed=5, lower_is_better=lower_is_better)
    assert pairs != improve_pairs(verified, 36, seed=6, lower_is_better=lower_is_better)
    best = (min if lower_is_better else max)(v.score for v in verified)
    for a, b in pairs:
        assert b.item.code != a.item.code
        if a.score != best:
            assert (b.score < a.score) if lower_is_better else (b.score > a.score)
    assert set(Counter(a.item.code for a, _ in pairs).values()) == {3}  # every program a source, evenly
    with pytest.raises(ValueError, match="two different"):
        improve_pairs(verified[:1], 1, seed=0, lower_is_better=False)


def test_change_sentence_names_what_changes():
    grid = full_grid(PIZZA)
    a = grid[0]
    same_family = next(
        b
        for b in grid
        if b.meta["model"] == a.meta["model"] and b.meta["features"] == a.meta["features"] and b.key != a.key
    )
    other = next(b for b in grid if b.meta["model"] != a.meta["model"] and b.meta["features"] != a.meta["features"])
    assert change_sentence(a, same_family).endswith("I change the hyperparameters.")
    assert change_sentence(a, other).endswith("I change the model and the features.")


def test_examples_show_the_source_and_its_output_and_answer_with_another_program(task):
    verified = verified_items(generate_corpus(PIZZA, 10, seed=0))
    examples = improve_examples(task, ["numpy", "pandas"], verified, 20, seed=0)
    assert len(examples) == 20
    by_output = {v.output: v for v in verified}
    for messages, response in examples:
        user = messages[-1]["content"]
        assert user.startswith("You have implemented a previous solution.")
        sources = [v for out, v in by_output.items() if out.strip() in user]
        assert len(sources) == 1  # the captured output of exactly one verified program ...
        a = sources[0]
        assert a.item.code.strip() in user and a.item.plan in user  # ... next to its own plan and code
        parsed = parse_response(response)
        assert parsed.code is not None and parsed.code.strip() != a.item.code.strip()
        b = next(v for v in verified if v.item.code.strip() == parsed.code.strip())  # the target is verified
        assert parsed.plan == f"{change_sentence(a.item, b.item)} {b.item.plan}"
    no_output = VerifiedItem(verified[0].item, 0.6, 1.0, "")
    with pytest.raises(ValueError, match="no captured output"):
        improve_prompt(task, [], no_output)


def test_rendered_improve_prompts_fit_the_cpu_budget(task, tmp_path):
    """The stage's own SFT set and tokenizer for pizza:cpu; every program of the grid as the previous
    solution renders whole (nothing shrunk) within cfg.prompt.max_prompt_tokens."""
    cfg = pizza_config.get_config("cpu")
    packages = ["numpy", "pandas", "scipy", "scikit-learn", "xgboost", "lightgbm"]
    verified = verified_items(generate_corpus(task.spec, int(cfg.warmstart.corpus_size), cfg.seed, packages))
    examples, chats = sft_examples(from_config(cfg).warmstart, task, packages, verified)
    n_improve = improve_count(len(verified), cfg.warmstart.improve_fraction)
    assert len(examples) == len(verified) + n_improve and n_improve > 0
    assert sum(m[-1]["content"].startswith("You have implemented") for m, _ in examples) == n_improve
    tok = train_task_tokenizer(
        [r for _, r in examples], chats, int(cfg.model.vocab_size), tmp_path, cfg.warmstart.tokenizer_max_token_length
    )
    budget = int(cfg.prompt.max_prompt_tokens)
    lengths = []
    for i, it in enumerate(full_grid(PIZZA, packages)):
        messages = improve_prompt(task, packages, VerifiedItem(it, 0.6, 1.0, run_output(i)))
        whole = _encode(messages, tok)
        assert render_prompt(messages, tok, budget) == whole  # fits: render_prompt shrank nothing
        lengths.append(len(whole))
    assert max(lengths) <= budget
    assert all(p in run_output(0) for p in PROGRESS_PRINTS if p != "training loss:")


@pytest.mark.parametrize("lower_is_better", [False, True])
def test_pairs_by_kind_go_to_a_better_kind_where_there_is_one(lower_is_better):
    verified = verified_items(generate_corpus(PIZZA, 24, seed=0))
    kind = lambda it: it.meta["model"]  # noqa: E731
    means = kind_means(verified, kind)
    better = (lambda x, y: y < x) if lower_is_better else (lambda x, y: y > x)
    pairs = improve_pairs(verified, 48, seed=2, lower_is_better=lower_is_better, kind_of=kind)
    moved = 0
    for a, b in pairs:
        up = [c for c in verified if better(a.score, c.score) and better(means[kind(a.item)], means[kind(c.item)])]
        if up:
            assert b in up
            moved += 1
        else:
            assert b.item.code != a.item.code
    assert moved >= len(pairs) // 2  # most sources have a better program of a better kind
    plain = improve_pairs(verified, 48, seed=2, lower_is_better=lower_is_better)
    plain_moved = sum(better(means[kind(a.item)], means[kind(b.item)]) for a, b in plain)
    assert moved > plain_moved  # without kinds, many targets are better programs of a worse kind


def test_the_stage_draws_better_kinds_when_asked(task):
    verified = verified_items(generate_corpus(PIZZA, 16, seed=0))
    plain, _ = sft_examples(WarmStartSettings(), task, ["numpy"], verified)
    by_kind, _ = sft_examples(WarmStartSettings(improve_to_better_kind=True), task, ["numpy"], verified)
    means = kind_means(verified, lambda it: solution_kind(PIZZA, it.code))
    code_kind = {v.item.code.strip(): means[solution_kind(PIZZA, v.item.code)] for v in verified}

    def to_better_kind(examples) -> int:
        n = 0
        for messages, response in examples[len(verified) :]:
            source = next(c for c in code_kind if c in messages[-1]["content"])
            n += code_kind[parse_response(response).code.strip()] > code_kind[source]
        return n

    assert to_better_kind(by_kind) > to_better_kind(plain)
