"""instrument(): the three modes, and the LM route's accept / fall back decisions.

The LM is played by a scripted sampler (the project's JaxSampler lives in mle_jax.sampling on another
branch): it implements the Sampler protocol, records the token prompts it gets, and returns fixed texts, so
each test decides what "the frozen model" answered. Prompt rendering, parsing and verification are real.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from mle_jax.instrument import PATHS, Instrumented, instrument, instrument_batch
from mle_jax.instrument.fallback import ast_instrument
from mle_jax.sampling.protocol import Completion, Sampler
from tests.tasks.chat_tokenizer import tiny_chat_tokenizer

CODE = 'import pandas as pd\ndf = pd.read_csv("train.csv")\nprint(len(df))\n'
GOOD = (
    'import pandas as pd\nprint("imported packages")\ndf = pd.read_csv("train.csv")\nprint("loaded data")\n'
    "print(len(df))\n"
)


class ScriptedSampler:
    version = 0

    def __init__(self, replies: Sequence[str]):
        self.replies = list(replies)
        self.calls: list[dict] = []

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, top_k=-1, seed=None):
        self.calls.append(
            {"prompts": [list(p) for p in prompts], "n": n, "temperature": temperature, "max_tokens": max_tokens}
        )
        out = []
        for p in prompts:
            text = self.replies.pop(0)
            out.append(
                Completion(
                    np.asarray(p, np.int32), np.zeros(3, np.int32), np.zeros(3, np.float32), text, "stop", self.version
                )
            )
        return out

    def sync(self, params, version):
        self.version = version


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


def test_scripted_sampler_is_a_sampler():
    assert isinstance(ScriptedSampler([]), Sampler)


def test_off_and_ast_modes():
    assert instrument(CODE, "off") == Instrumented(CODE, "off")
    ast_result = instrument(CODE, "ast")
    assert ast_result == Instrumented(ast_instrument(CODE), "ast")
    assert 'print("loaded data")' in ast_result.code
    with pytest.raises(ValueError, match="mode"):
        instrument(CODE, "magic")
    with pytest.raises(ValueError, match="sampler"):
        instrument(CODE, "lm")


def test_lm_output_accepted_when_it_only_inserts_prints(tok):
    sampler = ScriptedSampler([f"Here it is:\n```python\n{GOOD}```"])
    result = instrument(CODE, "lm", sampler=sampler, tokenizer=tok, max_tokens=512)
    assert result == Instrumented(GOOD.rstrip("\n"), "lm")
    call = sampler.calls[0]
    assert call["temperature"] == 0.0 and call["n"] == 1 and call["max_tokens"] == 512  # greedy
    prompt = tok.decode(call["prompts"][0])
    assert 'print("predicted test labels")' in prompt and 'df = pd.read_csv("train.csv")' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "reply, why",
    [
        (f"```python\n{GOOD.replace('train.csv', 'test.csv')}```", "rejected"),  # changed a constant
        (f"```python\n{GOOD.replace('print(len(df))', '')}```", "rejected"),  # deleted a line
        (f"```python\nimport os\n{GOOD}```", "rejected"),  # added an import
        (f"```python\n{CODE}```", "no progress prints"),
        ("I cannot do that.", "no code block"),
    ],
)
def test_lm_output_rejected_falls_back_to_ast(tok, reply, why):
    result = instrument(CODE, "lm", sampler=ScriptedSampler([reply]), tokenizer=tok)
    assert result.path == "fallback" and why in result.reason
    assert result.code == ast_instrument(CODE)


def test_batch_mixes_paths_in_one_generate_call(tok):
    other = "x = 1\n"
    sampler = ScriptedSampler([f"```python\n{GOOD}```", "no code"])
    results = instrument_batch([CODE, other], "lm", sampler=sampler, tokenizer=tok)
    assert [r.path for r in results] == ["lm", "fallback"]
    assert len(sampler.calls) == 1 and len(sampler.calls[0]["prompts"]) == 2
    assert set(r.path for r in results) <= set(PATHS)


def test_prompt_over_budget_falls_back_without_calling_the_lm(tok):
    sampler = ScriptedSampler([])
    result = instrument(CODE * 50, "lm", sampler=sampler, tokenizer=tok, max_prompt_tokens=64)
    assert result.path == "fallback" and "too long" in result.reason and sampler.calls == []


def test_a_program_that_does_not_parse_is_not_sent_to_the_lm(tok):
    sampler = ScriptedSampler([f"```python\n{GOOD}```"])
    broken = "x = (1\n"
    results = instrument_batch([broken, CODE], "lm", sampler=sampler, tokenizer=tok)
    assert results[0] == Instrumented(broken, "unparsed", "the program does not parse")
    assert results[1].path == "lm"
    assert len(sampler.calls[0]["prompts"]) == 1  # only the program that parses was prompted
    assert instrument_batch([broken], "lm", sampler=ScriptedSampler([]), tokenizer=tok)[0].path == "unparsed"
