"""Prompts of appendix C rendered with a real (tiny) ChatML tokenizer, the token budget, the parser."""

from __future__ import annotations

import pytest

from mle_jax.tasks.progress import PROGRESS_PRINTS
from mle_jax.tasks.prompts import (
    DATA_MOUNT,
    SYSTEM_PROMPT,
    PromptTooLong,
    improve_messages,
    instrument_messages,
    observation_text,
    parse_response,
    render_prompt,
    scratch_messages,
    terminal_text,
)
from tests.tasks.chat_tokenizer import tiny_chat_tokenizer

PACKAGES = ["pandas", "numpy", "scikit-learn", "xgboost", "torch"]


@pytest.fixture(scope="module")
def tok():
    return tiny_chat_tokenizer()


def test_scratch_prompt_carries_the_instructions(prepared):
    pizza = prepared["random-acts-of-pizza"]
    msgs = scratch_messages(pizza, PACKAGES)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == SYSTEM_PROMPT
    user = msgs[1]["content"]
    mount = DATA_MOUNT.format(task_id="random-acts-of-pizza")
    assert mount == "/workdir/random-acts-of-pizza/prepared/public/"
    for needle in (
        "3-5 sentences",
        "single markdown code block",
        f"`{mount}`",
        "./submission.csv",
        "`xgboost`",
        "internet",
        "request_id,requester_received_pizza",
        "Data snippet",
        f"{mount}train.json",
        pizza.spec.statement,
    ):
        assert needle in user, needle
    assert "t3_" in user  # first rows of the sample submission


def test_messages_pickle_as_a_plain_chat(prepared):
    import copy
    import pickle

    msgs = scratch_messages(prepared["leaf-classification"], PACKAGES)
    assert pickle.loads(pickle.dumps(msgs)) == list(msgs) == copy.deepcopy(msgs)


def test_render_keeps_instructions_and_shrinks_the_snippet(prepared, tok):
    spooky = prepared["spooky-author-identification"]
    msgs = scratch_messages(spooky, PACKAGES, snippet_chars=4000)
    full = render_prompt(msgs, tok, max_tokens=100_000)
    assert full[-3:] == tok.encode("<|im_start|>assistant\n", add_special_tokens=False)[-3:]
    text = tok.decode(full)
    assert "Data snippet" in text and "id,text" in text
    budget = len(full) - 300
    short = render_prompt(msgs, tok, max_tokens=budget)
    assert len(short) <= budget
    short_text = tok.decode(short)
    assert msgs[1]["content"].split("\n\nData snippet")[0] in short_text  # instructions intact
    assert len(short) > budget - 40  # the snippet was cut just enough (binary search)
    bare = render_prompt(msgs.rebuilt({"snippet": 0}), tok, max_tokens=100_000)  # instructions only
    assert render_prompt(msgs, tok, max_tokens=len(bare)) == bare
    with pytest.raises(PromptTooLong):
        render_prompt(msgs, tok, max_tokens=50)


def test_improve_prompt_shrinks_output_first(prepared, tok):
    pizza = prepared["random-acts-of-pizza"]
    output = "imported packages\nloaded data\n" + "epoch log line\n" * 400 + "Traceback: KeyError 'x'\n"
    code = "import pandas as pd\nprint('hi')\n" * 10
    msgs = improve_messages(pizza, PACKAGES, "I will use a random forest.", code, output, output_chars=20_000)
    user = msgs[1]["content"]
    assert "previous solution" in user and "I will use a random forest." in user and code.strip() in user
    full = render_prompt(msgs, tok, max_tokens=100_000)
    ids = render_prompt(msgs, tok, max_tokens=len(full) - 500)
    text = tok.decode(ids)
    assert len(ids) <= len(full) - 500
    assert code.strip() in text  # the code is kept while the output shrinks
    assert "imported packages" in text and "KeyError" in text and "elided" in text  # head and tail kept


def test_instrument_prompt_lists_the_seven_prints():
    msgs = instrument_messages("x = 1\n")
    content = msgs[0]["content"]
    for p in PROGRESS_PRINTS:
        assert f'print("{p}")' in content
    assert "Do not modify the original python code" in content and "x = 1" in content


@pytest.mark.parametrize(
    "text, plan, code",
    [
        (
            "I will train a model.\n```python\nimport os\nprint(1)\n```\nDone.",
            "I will train a model.",
            "import os\nprint(1)",
        ),
        ("Plan.\n```\nx = 1\n```", "Plan.", "x = 1"),
        ("Plan.\n```bash\npip install x\n```\n```py\ny = 2\n```", "Plan.", "y = 2"),
        ("Plan with no code at all.", "Plan with no code at all.", None),
        ("Plan.\n```python\n\n```", "Plan.", None),
        ("Plan.\n```python\nimport pandas as pd\ndf = 1", "Plan.", "import pandas as pd\ndf = 1"),  # cut off
        ("", "", None),
    ],
)
def test_parse_response(text, plan, code):
    parsed = parse_response(text)
    assert parsed.plan == plan
    assert parsed.code == code


def test_terminal_control_in_a_programs_output_never_reaches_the_model(prepared):
    """ANSI escape sequences (colours, cursor moves, a window title) are removed and NUL and other control bytes
    written as escapes, in the observation and in the improve prompt; the program's own text is kept."""
    raw = "\x1b[31mloaded data\x1b[0m\r\nepoch 1\x1b[2K\x1b]0;pwned\x07 loss 0.3\x00\x00 done\x1b\nKeyError: 'x'"
    assert terminal_text(raw) == "loaded data\nepoch 1 loss 0.3\\x00\\x00 done\\x1b\nKeyError: 'x'"
    seen = observation_text("error", 1, raw, "no submission.csv was written", 1500)
    msgs = improve_messages(prepared["random-acts-of-pizza"], ["pandas"], "plan", "print(1)", raw)
    for text in (seen, "".join(m["content"] for m in msgs)):
        assert "\x1b" not in text and "\x00" not in text and "\r" not in text
        assert "loaded data\nepoch 1 loss 0.3\\x00\\x00 done" in text and "KeyError: 'x'" in text


TUTORIAL = """I will load the data, fit a model and write the submission.

```python
import pandas as pd
train = pd.read_json("train.json")
```

The data look like this:

```
request_id  requester_received_pizza
t3_1  0
```

```python
model = train.mean()
```

```python
def broken(:
```
"""


def test_aide_extraction_joins_the_blocks_that_parse_as_aide_does():
    """A response in a tutorial's shape (Qwen2.5-Coder-0.5B writes many): "first" takes the first block, "aide" joins
    every python or untagged block that parses (the data sample and the broken block left out; a comma-separated
    sample would parse, as a tuple, and be kept, as in AIDE), as AIDE's extract_code; with no block at all, the whole
    text if it parses."""
    first, aide = parse_response(TUTORIAL), parse_response(TUTORIAL, "aide")
    assert first.plan == aide.plan == "I will load the data, fit a model and write the submission."
    assert first.code == 'import pandas as pd\ntrain = pd.read_json("train.json")'
    assert aide.code == 'import pandas as pd\ntrain = pd.read_json("train.json")\n\nmodel = train.mean()'
    assert parse_response("x = 1\nprint(x)", "aide").code == "x = 1\nprint(x)"
    assert parse_response("I would train a model but write no code.", "aide").code is None
    assert parse_response("```python\ndef f(:\n```", "aide").code is None
    with pytest.raises(ValueError, match="code extraction 'all'"):
        parse_response(TUTORIAL, "all")
