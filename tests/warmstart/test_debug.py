"""Warm-start examples of turn 2 after a faulty run: their prompts are the tokens the RL loop builds for turn 2
(`Environment.next_turn_prompt`) in each episode context, the SFT renders them so, and the set has its share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mle_jax.env.observation import observe, user_turn_text
from mle_jax.env.rollout import Environment, PromptItem, Sample, previous_output
from mle_jax.env.settings import AgentSettings, RolloutSettings
from mle_jax.executor.result import ExecResult, Status
from mle_jax.sampling.protocol import Completion
from mle_jax.tasks.prepare import prepare
from mle_jax.tasks.prompts import PromptSettings, parse_response
from mle_jax.tasks.submission_format import FormatCheck
from mle_jax.warmstart.corpus import VerifiedItem
from mle_jax.warmstart.debug import Conversation, debug_count, debug_examples, debug_prompt, fix_metrics
from mle_jax.warmstart.faults import FaultyRun, ObservedRun, inject
from mle_jax.warmstart.programs import generate_corpus
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.settings import WarmStartSettings
from mle_jax.warmstart.sft import end_of_turn_id, tokenize_examples, train_task_tokenizer
from mle_jax.warmstart.stage import sft_examples

PACKAGES = ["numpy", "pandas", "scipy", "scikit-learn"]
TRACEBACK = (
    "imported packages\nloaded data\n"
    + "".join(f"  warning line {i} of a long run\n" for i in range(60))
    + 'Traceback (most recent call last):\n  File "main.py", line 11, in <module>\n'
    "KeyError: 'request_txet_edit_aware'"
)


@pytest.fixture(scope="module")
def task(raw_data_dir: Path, tmp_path_factory):
    return prepare(PIZZA, raw_data_dir / PIZZA, tmp_path_factory.mktemp("pizza") / "prepared")


@pytest.fixture(scope="module")
def faulty(task):
    """A pizza corpus program with a misspelt column, and a run of it as the sandbox reports one."""
    item = generate_corpus(PIZZA, 1, seed=0)[0]
    fault = inject(item.code, "column", 0)
    res = ExecResult(
        Status.ERROR, 1, 2.5, "imported packages\nloaded data\n", TRACEBACK.split("loaded data\n", 1)[1], None
    )
    obs = observe(res, None, FormatCheck(False, "no submission.csv was written"))
    return FaultyRun(item, fault, ObservedRun(obs, previous_output(res, 1500), False, None, 2.5)), res


@pytest.fixture(scope="module")
def tokenizer(task, faulty, tmp_path_factory):
    run, _ = faulty
    chat = debug_prompt("conversation", task, PACKAGES, PromptSettings(), AgentSettings(turns=2), run)
    texts = [it.response() for it in generate_corpus(PIZZA, 16, seed=0)] + [run.response()]
    return train_task_tokenizer(texts, [chat], 2048, tmp_path_factory.mktemp("tok"))


def test_debug_count_gives_the_configured_share():
    assert debug_count(128, 0.2) == 32 and debug_count(128, 0.0) == 0 and debug_count(60, 0.5) == 60
    with pytest.raises(ValueError, match="debug_fraction"):
        debug_count(64, 1.0)
    with pytest.raises(ValueError, match="debug_fraction"):
        WarmStartSettings(debug_fraction=-0.1)


def test_one_turn_runs_learn_the_improve_prompt_form():
    assert WarmStartSettings().debug_context == "state" and not WarmStartSettings().measures_debug
    two = WarmStartSettings(agent=AgentSettings(turns=2, context="conversation"))
    assert two.debug_context == "conversation" and two.measures_debug  # measured whenever episodes revise
    assert WarmStartSettings(debug_fraction=0.2).measures_debug
    assert not WarmStartSettings(debug_fraction=0.2, debug_eval=0).measures_debug


@pytest.mark.parametrize("shrunk", [False, True])
@pytest.mark.parametrize("context", ["conversation", "state"])
def test_the_prompt_is_the_one_the_rl_loop_builds_for_turn_two(task, faulty, tokenizer, context, shrunk):
    """Turn 1 answered the scratch prompt with the faulty program and its run failed: the debug example's prompt
    tokens are those of `Environment.next_turn_prompt` (a small observation budget makes it shrink the output)."""
    run, res = faulty
    bare = run.run.observation.text(0)  # the observation without output: its instructions, never cut
    observation_tokens = len(tokenizer.encode(user_turn_text(tokenizer, bare, "<|im_end|>"))) + 40 if shrunk else 512
    prompt, agent = (
        PromptSettings(max_prompt_tokens=768),
        AgentSettings(turns=2, context=context, observation_tokens=observation_tokens),
    )
    env = Environment(RolloutSettings(prompt=prompt, agent=agent), task, tokenizer, PACKAGES, None, None, None)
    response = run.response()
    token_ids = [*tokenizer.encode(response, add_special_tokens=False), end_of_turn_id(tokenizer)]
    first: PromptItem = env.scratch_prompt(task.id)
    parsed = parse_response(response)
    completion = Completion(
        np.asarray(first.prompt_ids, np.int32),
        np.asarray(token_ids, np.int32),
        np.zeros(len(token_ids), np.float32),
        response,
        "stop",
        0,
    )
    last = Sample(
        0, first, completion, parsed.plan, parsed.code, task=task.id, result=res, observation=run.run.observation
    )
    expected = env.next_turn_prompt(last).prompt_ids

    [(messages, target)] = debug_examples(context, task, PACKAGES, prompt, agent, [run])
    assert target == run.source.response() and parse_response(target).code == run.source.code.strip("\n")
    prompts, responses, _ = tokenize_examples([(messages, target)], tokenizer, prompt.max_prompt_tokens, 1000)
    assert prompts[0] == list(expected)
    assert responses[0][-1] == end_of_turn_id(tokenizer)
    shown = tokenizer.decode(prompts[0])
    assert run.fault.code.strip() in shown.replace("\r", "")  # the faulty program, as turn 1 wrote it
    assert "KeyError: 'request_txet_edit_aware'" in shown  # the error's last line survives any shrinking
    if context == "conversation":
        assert isinstance(messages, Conversation) and "Submission check: no submission.csv was written" in shown
        assert shrunk == ("warning line 3 " not in shown)  # the output tail shrank to fit
    else:
        assert shown.count("You have implemented a previous solution") == 1


def test_the_sft_set_puts_debug_examples_after_scratch_and_improve(task, faulty):
    run, _ = faulty
    verified = [VerifiedItem(it, 0.6, 1.0, "loaded data\n") for it in generate_corpus(PIZZA, 4, seed=0)]
    settings = WarmStartSettings(debug_fraction=0.2)
    debug = debug_examples("state", task, PACKAGES, settings.prompt, settings.agent, [run, run])
    examples, chats = sft_examples(settings, task, PACKAGES, verified, ["x = 1\n"], debug)
    assert len(examples) == 4 + 4 + 2 + 1
    assert examples[8:10] == debug and examples[-1][0][-1]["content"].startswith("Please insert print statements")
    assert sum(c is debug[0][0] or c == debug[0][0] for c in chats) == 1  # one chat per distinct prompt


def test_fix_metrics_sum_up_the_records():
    recs = [
        {"kind": "column", "fixed": True, "exact": True, "repeat": False, "code": "a"},
        {"kind": "column", "fixed": False, "exact": False, "repeat": True, "code": "b"},
        {"kind": "path", "fixed": True, "exact": False, "repeat": False, "code": "c"},
        {"kind": "api", "fixed": False, "exact": False, "repeat": False, "code": None},
    ]
    m = fix_metrics(recs)
    assert m["n"] == 4 and m["fix_share"] == 0.5 and m["exact_share"] == m["repeat_share"] == 0.25
    assert m["no_code_share"] == 0.25 and m["fix_column"] == 0.5 and m["fix_path"] == 1.0 and m["fix_api"] == 0.0
    assert "fix_shape" not in m and fix_metrics([])["n"] == 0
