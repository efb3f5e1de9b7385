"""Corpus programs run in the real bwrap sandbox on the real pizza data and grade valid."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mle_jax.executor.result import Limits
from mle_jax.executor.runtime import sandbox_packages
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.tasks.prepare import prepare
from mle_jax.warmstart.corpus import public_dir_in_sandbox, sandbox_run_fn, verify_corpus
from mle_jax.warmstart.programs import full_grid, generate_corpus
from mle_jax.warmstart.programs.insults import INSULTS
from mle_jax.warmstart.programs.leaf import LEAF
from mle_jax.warmstart.programs.nomad2018 import NOMAD
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.programs.spooky import SPOOKY
from mle_jax.warmstart.programs.tweet import TWEET
from mle_jax.warmstart.settings import WarmStartSettings
from mle_jax.warmstart.stage import corpus_failure_message, verified_reasons, verify_cached

LIMITS = Limits(timeout_s=120.0, memory_mb=3072, cpus=1, max_procs=64, max_file_mb=256)


@pytest.fixture(scope="module")
def pizza(raw_data_dir: Path, tmp_path_factory):
    return prepare(PIZZA, raw_data_dir / PIZZA, tmp_path_factory.mktemp("pizza") / "prepared")


@pytest.mark.integration
def test_corpus_sample_runs_and_grades_in_bwrap(pizza, tmp_path):
    packages = sandbox_packages()
    # one program of each of three families, including one with text features and one that needs xgboost
    # when the sandbox has it: the grid follows the sandbox's packages
    items = generate_corpus(pizza.spec, 40, seed=0, packages=packages)
    picked = {}
    for it in items:
        fam = it.meta["model"]
        if fam in ("logreg", "naive_bayes", "xgboost" if "xgboost" in packages else "hist_gradient_boosting"):
            picked.setdefault(fam, it)
    assert len(picked) == 3
    sandbox = make_sandbox(ExecutorSettings(backend="bwrap"))
    run_fn = sandbox_run_fn(sandbox, pizza, LIMITS)
    verified = verify_corpus(list(picked.values()), pizza, run_fn, workers=2, progress=False)
    assert len(verified) == 3, "a corpus program failed to run or grade in the sandbox"
    for v in verified:
        assert 0.55 < v.score < 0.85, (v.item.meta, v.score)  # pizza AUCs of simple models
        assert v.duration_s > 0
        # the program ran instrumented, as in RL: its output is what an improve prompt about it shows
        lines = v.output.splitlines()
        assert lines[:4] == ["imported packages", "loaded data", "defined model", "trained model"], v.output
        assert lines[-1] == "predicted test labels" and "validation auc: 0." in v.output

    # a program that writes no submission is invalid, and the cache records runs so none repeats
    broken = type(items[0])(
        "plan.",
        items[0].code.replace('to_csv("submission.csv"', 'to_csv("other.csv"'),
        dict(items[0].meta, model="broken"),
    )
    calls = []

    def counting(code):
        calls.append(code)
        return run_fn(code)

    cache = tmp_path / "verified.jsonl"
    first = verify_cached([broken, items[0]], pizza, counting, cache, workers=2, progress=False)
    assert [v.item for v in first] == [items[0]] and len(calls) == 2
    again = verify_cached([broken, items[0]], pizza, counting, cache, workers=2, progress=False)
    assert [v.score for v in again] == [v.score for v in first] and len(calls) == 2
    assert [v.output for v in again] == [v.output for v in first] and "validation auc" in first[0].output


@pytest.mark.integration
def test_a_spooky_program_runs_and_grades_in_bwrap(raw_data_dir: Path, tmp_path):
    task = prepare(SPOOKY, raw_data_dir / SPOOKY, tmp_path / "spooky" / "prepared")
    item = next(
        it
        for it in generate_corpus(task.spec, 300, seed=0)
        if it.meta["model"] == "naive_bayes" and it.meta["features"] == "word"
    )
    run_fn = sandbox_run_fn(make_sandbox(ExecutorSettings(backend="bwrap")), task, LIMITS)
    verified = verify_corpus([item], task, run_fn, progress=False)
    assert len(verified) == 1
    assert 0.2 < verified[0].score < 1.0  # multi-class log loss of naive Bayes on words (uniform: 1.10)


def test_grid_gates_on_the_sandbox_packages():
    with_boost = {it.meta["model"] for it in full_grid(PIZZA, ["xgboost", "lightgbm"])}
    assert {"xgboost", "lightgbm"} <= with_boost


# task -> (families of the programs run in CI, one each: a fast and a learned one; score range of those)
SAMPLES = {
    INSULTS: (("naive_bayes", "logreg"), (0.70, 0.95)),  # AUC
    LEAF: (("logreg", "lda"), (0.01, 6.0)),  # log loss over 99 species (uniform: 4.6)
    NOMAD: (("ridge", "hist_gradient_boosting"), (0.03, 0.12)),  # mean RMSLE (predicting the mean: ~0.17)
    TWEET: (("whole_text", "span_lexicon"), (0.55, 0.75)),  # Jaccard (whole tweet: 0.59)
}


@pytest.mark.integration
@pytest.mark.parametrize("task_id", sorted(SAMPLES))
def test_a_sample_of_each_new_grid_runs_and_grades_in_bwrap(task_id, raw_data_dir: Path, tmp_path):
    """Two programs of each new grid on the real data (the whole grids are verified by hand with
    bench/corpus_grid.py: mle_jax/warmstart/README.md)."""
    families, (low, high) = SAMPLES[task_id]
    task = prepare(task_id, raw_data_dir / task_id, tmp_path / "prepared")
    grid = generate_corpus(task.spec, len(full_grid(task_id)), seed=0)
    items = [next(it for it in grid if it.meta["model"] == fam) for fam in families]
    run_fn = sandbox_run_fn(make_sandbox(ExecutorSettings(backend="bwrap")), task, LIMITS)
    verified = verify_corpus(items, task, run_fn, workers=2, progress=False)
    assert [v.item for v in verified] == items, "a corpus program failed to run or grade in the sandbox"
    for v in verified:
        assert low < v.score < high, (v.item.meta, v.score)
        assert "validation" in v.output and v.output.splitlines()[-1] == "predicted test labels", v.output


@pytest.mark.integration
def test_insults_lightgbm_on_word_counts_runs_in_bwrap(raw_data_dir: Path, tmp_path):
    """LightGBM refuses integer sparse matrices: the insults grid's count vectorizers must give floats."""
    task = prepare(INSULTS, raw_data_dir / INSULTS, tmp_path / "prepared")
    [item] = [
        it
        for it in full_grid(INSULTS, ["lightgbm"])
        if it.meta["model"] == "lightgbm"
        and it.meta["features"] == "word"
        and it.meta["hparams"]
        == dict(
            n_estimators=200, num_leaves=15, vec_kind="CountVectorizer", vec_ngram_range=(1, 1), vec_max_features=2000
        )
    ]
    run_fn = sandbox_run_fn(make_sandbox(ExecutorSettings(backend="bwrap")), task, LIMITS)
    [verified] = verify_corpus([item], task, run_fn, workers=1, progress=False)
    assert 0.70 < verified.score < 0.95, verified.score


@pytest.mark.integration
def test_a_corpus_run_that_times_out_is_reported_as_such_and_run_again(pizza, tmp_path):
    """A verification timeout is the machine's doing: the cache keeps why, the message names the settings to
    change, and the next attempt (with a longer timeout) runs that program again instead of reusing the failure."""
    item = generate_corpus(pizza.spec, 8, seed=0, packages=sandbox_packages())[0]
    slow = type(item)("plan.", "import time\ntime.sleep(4)\n" + item.code, dict(item.meta))
    sandbox = make_sandbox(ExecutorSettings(backend="bwrap"))
    cache = tmp_path / "verified.jsonl"
    short = dataclasses.replace(LIMITS, timeout_s=2.0)
    assert verify_cached([slow], pizza, sandbox_run_fn(sandbox, pizza, short), cache, 1, progress=False) == []
    [reason] = verified_reasons(cache)
    assert "timeout" in reason.lower(), reason
    settings = WarmStartSettings(verify_timeout_s=2.0, verify_workers=16)
    message = corpus_failure_message(pizza.id, 64, [reason], settings, cache)
    assert "1 hit the 2 s verification timeout with 16 running at once" in message
    assert "--config.warmstart.verify_workers" in message and "generator" not in message

    calls = []

    def counting(code):
        calls.append(code)
        return sandbox_run_fn(sandbox, pizza, dataclasses.replace(LIMITS, timeout_s=60.0))(code)

    [v] = verify_cached([slow], pizza, counting, cache, 1, progress=False)
    assert len(calls) == 1 and v.duration_s > 4 and 0.55 < v.score < 0.85
    assert verified_reasons(cache) == []  # the program's last record decides


@pytest.mark.integration
def test_verification_leaves_no_results_folder_behind(pizza, tmp_path):
    """Like a rollout, a verification run's results folder (output and submission copy) goes once graded."""
    sandbox = make_sandbox(ExecutorSettings(backend="bwrap"), work_root=tmp_path / "work", out_root=tmp_path / "out")
    run_fn = sandbox_run_fn(sandbox, pizza, LIMITS, instrument_mode="off")
    valid = (
        "import pandas as pd\n"
        f"test = pd.read_json('{public_dir_in_sandbox(PIZZA)}test.json')\n"
        "pd.DataFrame({'request_id': test['request_id'], 'requester_received_pizza': 0.3})"
        ".to_csv('submission.csv', index=False)\n"
    )
    for code, ok in ((valid, True), ("raise SystemExit(3)\n", False)):
        graded, _, _ = run_fn(code)
        assert graded.valid is ok, graded
        assert list((tmp_path / "out").iterdir()) == []
        assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.integration
def test_a_corpus_seeded_improve_buffer_shows_working_programs_from_the_first_draw(pizza, tmp_path):
    """prompt.improve_seed="corpus": the run's improve buffer starts with the verified corpus programs (run in the
    sandbox once, cached beside the warm start's), so the first prompts already ask to revise working programs,
    each shown with the output of its instrumented run; a bad value is one ConfigError line."""
    import numpy as np

    from configs import base
    from mle_jax.env.rollout import Environment
    from mle_jax.infra.checkpoint import Checkpointer
    from mle_jax.infra.metrics import MetricsWriter
    from mle_jax.models.tokenizer import train_bpe_tokenizer
    from mle_jax.rl.loop import AsyncRLLoop
    from mle_jax.run.builders import improve_seeds, start_loop
    from mle_jax.run.settings import ConfigError, from_config

    cfg = base.apply_cpu(base.task_config(PIZZA, "paper"))
    cfg.workdir, cfg.prompt.max_prompt_tokens, cfg.warmstart.corpus_size = str(tmp_path / "run"), 8192, 2
    assert improve_seeds(from_config(cfg), pizza, sandbox_packages(), tmp_path) == []  # the paper: nothing
    cfg.prompt.improve_seed = "corpus"
    s = from_config(cfg)
    packages = sandbox_packages()
    seeds = improve_seeds(s, pizza, packages, tmp_path)
    corpus = generate_corpus(pizza.spec, 2, s.warmstart.seed, packages)
    assert [p.code for p in seeds] == [it.code for it in corpus]
    for p in seeds:
        assert p.valid and p.task == PIZZA and p.version == 0 and p.reward == p.score and 0.5 < p.score < 0.9
        assert p.output.splitlines()[0] == "imported packages" and "validation auc: 0." in p.output
    improve_seeds(s, pizza, packages, tmp_path)  # cached: nothing runs twice
    assert len((tmp_path / "warmstart" / "verified.jsonl").read_text().splitlines()) == 2
    tok = train_bpe_tokenizer(["import pandas as pd\nprint('x')"] * 4, 400, tmp_path / "tok")
    env = Environment(s.rollout, pizza, tok, packages, None, None, None, seed=s.seed)
    # a fresh loop, as launch and the learning experiment's arms start theirs
    loop = AsyncRLLoop(s.loop, env, None, Checkpointer(tmp_path / "c"), MetricsWriter(tmp_path, tensorboard=False))
    assert start_loop(loop, s, pizza, packages, tmp_path, resume=False) == (False, 2)
    buffer = loop.buffer
    assert len(buffer) == len(seeds)
    first = env.prompts(16, buffer, np.random.default_rng(0))
    improve = [i for i in first if i.kind == "improve"]
    assert improve and all(i.parent in seeds for i in improve)  # revising a working program from the first draw
    cfg.prompt.improve_seed = "bogus"
    with pytest.raises(ConfigError, match="prompt.improve_seed='bogus'"):
        from_config(cfg)
