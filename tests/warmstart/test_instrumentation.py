"""Warm-start examples that teach the frozen model the instrumentation task (C.3): every target is the
program plus inserted progress prints only (what verification accepts), and held-out programs are unseen."""

from __future__ import annotations

import random

from mle_jax.instrument.verify import verify
from mle_jax.tasks.progress import PROGRESS_PRINTS
from mle_jax.tasks.prompts import parse_response
from mle_jax.warmstart.instrumentation import instrument_examples, redraw_values, split_programs
from mle_jax.warmstart.programs import full_grid, generate_corpus
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.programs.spooky import SPOOKY


def test_every_target_is_the_program_with_prints_inserted_and_nothing_else():
    for task in (PIZZA, SPOOKY):
        programs = [it.code for it in full_grid(task)][::7]
        for (messages, target), code in zip(instrument_examples(programs), programs, strict=True):
            assert code.strip() in messages[-1]["content"]  # the C.3 prompt shows the program
            parsed = parse_response(target)
            verdict = verify(code, parsed.code)
            assert verdict.ok and verdict.n_inserted >= 4, verdict
            assert sum(p in parsed.code for p in PROGRESS_PRINTS) >= 4


def test_training_programs_start_with_the_corpus_and_the_held_out_ones_are_unseen():
    corpus = generate_corpus(PIZZA, 16, seed=0)
    train, held_out = split_programs(PIZZA, [], 40, seed=3, first=corpus)
    assert len(train) == 40 and train[:16] == [it.code for it in corpus]
    assert len(set(train)) == 40 and not set(train) & set(held_out)
    assert len(train) + len(held_out) == len(full_grid(PIZZA))
    again, _ = split_programs(PIZZA, [], 40, seed=3, first=corpus)
    assert again == train  # deterministic
    none, all_but_corpus = split_programs(PIZZA, [], 0, seed=3, first=corpus)
    assert none == [] and len(all_but_corpus) == len(full_grid(PIZZA)) - 16


def test_redrawn_variants_are_new_texts_of_the_same_programs_instrumented_the_same_way():
    programs = [it.code for it in full_grid(PIZZA)][::11][:6]
    examples = instrument_examples(programs, redrawn=12, seed=5)
    assert len(examples) == 6 + 12
    rng = random.Random(5)
    texts = [redraw_values(programs[i % 6], rng) for i in range(12)]
    assert sum(t not in programs for t in texts) >= 10  # values the grid never had: only copying gets them right
    for (messages, target), text in zip(examples[6:], texts, strict=True):
        assert text.strip() in messages[-1]["content"]
        assert verify(text, parse_response(target).code).ok
