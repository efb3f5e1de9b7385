"""Searches at test time through the real environment: the bwrap sandbox runs each node's program on the real pizza
data, the AST instrumenter tags its prints, the real grader scores its submission. The policy is scripted (a fake
sampler whose response is a function of the prompt it decodes): a tiny model cannot be made to fix a bug on cue.

- Only a debug step can produce a valid submission: every draft crashes with an error that only its output shows,
  and the scripted policy fixes the program only when a prompt shows that error. `aide` finds the fix within the
  budget; `independent`, which never shows a policy an output, does not.
- No prompt of any search policy depends on the private answers: the same searches run again on a copy of the task
  whose private answers are flipped (every AUC becomes 1 - AUC) show the policy exactly the same prompts, grow the
  same trees and submit the same nodes, while the grader's scores differ."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from configs import pizza
from mle_jax.env import search
from mle_jax.run import environment
from mle_jax.run.settings import from_config
from mle_jax.sampling.protocol import Completion
from mle_jax.tasks.medals import LEVELS
from mle_jax.tasks.prompts import data_mount
from mle_jax.tasks.task import Task

pytestmark = pytest.mark.integration
PIZZA = "random-acts-of-pizza"
ERROR = "RuntimeError: MISSING_STEP_42"  # what the broken program's run prints (its code never holds it whole)
BROKEN = 'The first step.\n```python\nraise RuntimeError("MISSING_" + "STEP_42")\n```'
FIXED = f"""The error says a step is missing: write the submission.
```python
import pandas as pd
test = pd.read_json("{data_mount(PIZZA)}test.json")
sub = pd.DataFrame({{"request_id": test["request_id"], "requester_received_pizza": 0.25}})
sub.to_csv("submission.csv", index=False)
```"""


def program(k: int, metric: float) -> str:
    """A response whose program prints `metric` as its validation metric (the AST instrumenter prints the value of
    `valid_auc`) and submits predictions whose AUC depends on k."""
    return f"""Solution {k}.
```python
import pandas as pd
def holdout_score(x):
    return x
test = pd.read_json("{data_mount(PIZZA)}test.json")
x_valid = {metric}
valid_auc = holdout_score(x_valid)
sub = pd.DataFrame({{"request_id": test["request_id"], "requester_received_pizza": (test.index * {k} % 101) / 101}})
sub.to_csv("submission.csv", index=False)
```"""


class ScriptedPolicy:
    """A fake sampler: each response is `respond(prompt text)`, the prompt decoded with the run's tokenizer."""

    version = 0

    def __init__(self, tokenizer, respond: Callable[[str], str]):
        self.tokenizer, self.respond = tokenizer, respond
        self.prompts: list[str] = []

    def generate(self, prompts, n=1, **_):
        out = []
        for p in prompts:
            text = self.tokenizer.decode(list(p))
            self.prompts.append(text)
            for _ in range(n):
                response = self.respond(text)
                ids = np.asarray(self.tokenizer.encode(response, add_special_tokens=False), np.int32)
                out.append(
                    Completion(np.asarray(p, np.int32), ids, np.zeros(len(ids), np.float32), response, "stop", 0)
                )
        return out

    def sync(self, params, version) -> None:
        pass


@pytest.fixture(scope="module")
def parts(tmp_path_factory, raw_data_dir):
    from mle_jax.models.tokenizer import train_bpe_tokenizer

    tmp = tmp_path_factory.mktemp("search")
    cfg = pizza.get_config("cpu")
    cfg.task.raw_dir, cfg.task.data_root = str(raw_data_dir), str(tmp / "tasks")
    cfg.executor.slots = 2
    cfg.instrument.mode = "ast"  # the deterministic instrumenter: no model to train
    cfg.prompt.max_prompt_tokens = 200_000  # a byte-level tokenizer trained on four programs: long prompts
    s = from_config(cfg)
    task, packages = environment.prepare(s)
    tok = train_bpe_tokenizer([FIXED, program(1, 0.5)] * 2, 300, tmp / "tok")
    return s, task, packages, tok, tmp


def grow(parts, task: Task, respond, searches: list[search.Search]) -> ScriptedPolicy:
    s, _, packages, tok, tmp = parts
    policy = ScriptedPolicy(tok, respond)
    with environment.open_environment(s, task, packages, None, tok, tmp / "run", sampler=policy) as env:
        search.run_searches(env, searches)
    return policy


def test_only_a_debug_step_fixes_the_program_and_aide_takes_it_where_independent_cannot(parts):
    _, task, *_ = parts
    respond = lambda prompt: FIXED if ERROR in prompt else BROKEN  # noqa: E731
    lower = {PIZZA: False}
    aide = search.new_searches(search.Aide(), 10, [0, 1], [PIZZA], lower)
    independent = search.new_searches(search.Independent(), 10, [0, 1], [PIZZA], lower)
    policy = grow(parts, task, respond, aide + independent)
    for run in aide:
        rec = run.record()
        sub = rec["submitted"]
        assert sub["valid"] and sub["score"] == pytest.approx(0.5) and sub["medal"] == "none", rec  # AUC of 0.25s
        node = rec["nodes"][sub["node"]]
        assert node["operator"] == "debug" and rec["nodes"][node["parent"]]["operator"] == "draft"
        assert [n["operator"] for n in rec["nodes"][:5]] == ["draft"] * 5 and len(rec["nodes"]) == 10
        assert all(n["buggy"] == (not n["valid"]) for n in rec["nodes"])  # the run's status and the grader agree
    for run in independent:
        rec = run.record()
        assert {n["operator"] for n in rec["nodes"]} == {"draft"} and not any(n["valid"] for n in rec["nodes"])
        assert rec["submitted"] == {"node": None, "metric": None, "valid": False, "score": None, "medal": None}
    # the fix came from a prompt that showed a failed run's output, which no scratch prompt does
    shown = [p for p in policy.prompts if ERROR in p]
    assert shown and all("Terminal output of the previous solution" in p for p in shown)


def _flipped(task: Task, where) -> Task:
    """The task with its private answers flipped (the grader's AUC of any submission becomes 1 - AUC)."""
    private = where / "flipped-private"
    private.mkdir()
    answers = pd.read_csv(task.answers_path)
    answers["requester_received_pizza"] = 1 - answers["requester_received_pizza"].astype(int)
    answers.to_csv(private / task.spec.answers_file, index=False)
    return Task(task.spec, task.public_dir, private)


def _respond():
    """Scratch prompts get, in turn, programs with different printed metrics and different AUCs, and a crash;
    an improve prompt gets the shown program's k + 2 with a worse printed metric."""
    scripted = [(7, 0.61), (13, 0.66), None, (29, 0.58), (31, 0.64), (37, 0.60), (41, 0.63)]
    drafts = iter([BROKEN if x is None else program(*x) for x in scripted] * 10)

    def respond(prompt: str) -> str:
        shown = re.findall(r"test\.index \* (\d+) % 101", prompt)
        return program(int(shown[-1]) + 2, 0.55) if "Previous solution" in prompt and shown else next(drafts)

    return respond


def test_no_prompt_or_choice_of_any_search_depends_on_the_private_answers(parts):
    _, task, _, _, tmp = parts
    flipped = _flipped(task, tmp)

    def searches() -> list[search.Search]:
        policies = [(search.Independent(), 3), (search.Aide(num_drafts=2), 4), (search.Greedy(num_drafts=2), 4)]
        return [search.Search(PIZZA, 0, p, b, search.Tree(False), np.random.default_rng(0)) for p, b in policies]

    runs, flipped_runs = searches(), searches()
    seen = grow(parts, task, _respond(), runs).prompts
    seen_flipped = grow(parts, flipped, _respond(), flipped_runs).prompts
    assert seen == seen_flipped  # every prompt of every policy, in order
    records = [r.record() for r in runs]
    flipped_records = [r.record() for r in flipped_runs]
    for rec, other in zip(records, flipped_records, strict=True):
        shape = [(n["operator"], n["parent"], n["buggy"], n["metric"]) for n in rec["nodes"]]
        assert shape == [(n["operator"], n["parent"], n["buggy"], n["metric"]) for n in other["nodes"]]
        assert rec["submitted"]["node"] == other["submitted"]["node"]
        for n, m in zip(rec["nodes"], other["nodes"], strict=True):  # the grader did see different answers
            assert (n["score"] is None) == (m["score"] is None)
            if n["score"] is not None:
                assert n["score"] == pytest.approx(1 - m["score"], abs=1e-4) and abs(n["score"] - 0.5) > 1e-3
    greedy = records[2]
    assert [n["operator"] for n in greedy["nodes"]] == ["draft", "draft", "improve", "improve"]
    # its drafts printed 0.60 and 0.63; its improvements print 0.55: it improves node 1 whatever the AUCs say
    assert [n["parent"] for n in greedy["nodes"]] == [None, None, 1, 1]
    assert {(n["metric"], n["metric_source"]) for n in records[0]["nodes"]} == {
        (0.61, "instrumenter"),
        (0.66, "instrumenter"),
        (None, None),
    }  # the AST instrumenter's tagged prints
    scores = {f"{n['score']:.4f}" for rec in records + flipped_records for n in rec["nodes"] if n["score"]}
    assert scores and not any(x in p for x in scores for p in seen)
    assert not any(str(task.private_dir) in p or lv in p for p in seen for lv in LEVELS if lv != "none")
