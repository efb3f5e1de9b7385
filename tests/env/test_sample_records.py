"""A trained sample as samples.jsonl keeps it: its outcome, error line, grader's reason, medal and texts (the plan, the
program as it ran with the instrumenter's lines, the ends of its output without the per-run tag), the file's size cap,
and the samples TensorBoard shows of a step."""

from __future__ import annotations

import json

import numpy as np

from mle_jax.env.rollout import TEXT_FIELDS, PromptItem, Sample, tail_lines
from mle_jax.env.sample_texts import pick_samples, sample_markdown, tensorboard_samples
from mle_jax.executor.result import ExecResult, Status
from mle_jax.infra.metrics import MetricsWriter, read_metrics
from mle_jax.instrument import instrument_batch
from mle_jax.instrument.tagging import tag_progress
from mle_jax.sampling.protocol import Completion
from mle_jax.tasks.progress import new_tag
from mle_jax.tasks.reward import Reward

PIZZA = "random-acts-of-pizza"
PROGRAM = """import pandas as pd
test = pd.read_json("test.json")
sub = pd.DataFrame({"request_id": test["request_id"], "requester_received_pizza": 0.3})
sub.to_csv("submission.csv", index=False)
"""


def _sample(
    uid: int, reward: Reward | None, result: ExecResult | None, code: str | None = PROGRAM, server: str = ""
) -> Sample:
    ids = np.zeros(1, np.int32)
    completion = Completion(ids, ids, np.zeros(1, np.float32), "", "stop", 0, server=server)
    s = Sample(uid, PromptItem("scratch", [0], task=PIZZA), completion, "I will predict 0.3.", code, task=PIZZA)
    if code is not None:  # instrumented and tagged as Environment.submit does it (the AST instrumenter)
        [inst] = instrument_batch([code], "ast")
        s.tag = new_tag()
        s.instrumented_code, s.instrument_path = tag_progress(inst.code, s.tag), inst.path
    s.result, s.reward = result, reward
    return s


def test_a_record_has_its_outcome_medal_and_texts_without_the_tag():
    s = _sample(0, None, None)
    out = f"{s.tag} imported packages\nwarming up\n{s.tag} loaded data\n{s.tag} predicted test labels\n"
    s.result = ExecResult(Status.OK, 0, 2.5, out, "a warning\n", None, {})
    s.reward = Reward(0.66, True, 0.66, ("loaded data",), 3)
    rec = s.record(output_chars=2000)
    assert rec["outcome"] == "valid" and rec["medal"] == "above_median"  # pizza: median 0.5996, bronze 0.6921
    program = rec["program"].split("\n")
    assert s.tag not in rec["program"] and s.tag not in rec["stdout"]
    assert [program[i - 1] for i in rec["instrumenter_lines"]] == [
        'print("imported packages")',
        'print("loaded data")',
        'print("predicted test labels")',
    ]
    assert rec["stdout"].split("\n")[0] == "imported packages" and rec["progress_lines"] == [1, 3, 4]
    assert rec["stderr"] == "a warning\n" and rec["plan"] == "I will predict 0.3." and rec["code"] == PROGRAM
    assert set(TEXT_FIELDS) <= set(rec) and not set(TEXT_FIELDS) & set(s.record())  # evaluation.json: figures only


def test_a_failed_samples_record_says_why():
    crash = ExecResult(Status.ERROR, 1, 0.4, "", "Traceback (most recent call last):\nKeyError: 'id'\n", None, {})
    s = _sample(1, Reward(-9.9, False, None, (), 1), crash)
    s.grade_reason = "the program did not run without error (exit code 1); its submission is not graded"
    rec = s.record()
    assert (rec["outcome"], rec["error"], rec["medal"]) == ("runtime_error", "KeyError: 'id'", None)
    assert rec["grader_reason"].startswith("the program did not run without error")
    none = _sample(2, Reward(-10.0, False, None, (), 0), None, code=None).record(output_chars=100)
    assert (none["outcome"], none["error"], none["program"], none["stdout"]) == ("no_code", None, None, "")


def test_a_record_names_the_server_that_sampled_it():
    assert _sample(3, None, None, server="http://127.0.0.1:8001").record()["server"] == "http://127.0.0.1:8001"
    assert _sample(4, None, None).record()["server"] is None  # sampled in process


def test_an_outputs_end_is_cut_at_the_cap_and_its_marked_lines_counted_in_it():
    tag = "@@mle0123456789ab@@"
    text = f"{tag} imported packages\n" + "x" * 50 + f"\n{tag} loaded data\nlast line"
    tail, marked = tail_lines(text, tag, 30)
    assert tail == "xxxxxxxx\nloaded data\nlast line" and len(tail) == 30
    assert marked == [2]  # "loaded data", the second line of the tail
    assert tail_lines(text, tag, 10_000) == (
        "imported packages\n" + "x" * 50 + "\nloaded data\nlast line",
        [1, 3],
    )
    assert tail_lines("a\nb", None, 1) == ("b", [])


def test_samples_jsonl_keeps_texts_within_its_allowance_and_the_figures_always(tmp_path):
    """samples_mb over 4 steps: step s may bring the file to s/4 of it with texts; past that a sample's figures
    alone are written, marked; a later step's larger allowance brings texts back."""
    big = "p" * 3000
    rec = {"uid": 0, "reward": 0.5, "plan": big, "program": big}
    line = len(json.dumps({"step": 1, **rec}) + "\n")
    w = MetricsWriter(tmp_path, tensorboard=False, samples_mb=4 * 2.5 * line / 2**20, steps=4)  # 2.5 lines a step
    for step in (1, 2):
        w.write_samples(step, [{**rec, "uid": step * 10 + i} for i in range(3)], texts=("plan", "program"))
    rows = read_metrics(tmp_path / "samples.jsonl")
    assert [("plan" in r, r.get("texts_dropped", False)) for r in rows] == [
        (True, False),
        (True, False),
        (False, True),
        (True, False),  # step 2's allowance: 5 lines
        (True, False),
        (False, True),
    ]
    assert all(r["reward"] == 0.5 for r in rows) and [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2]
    assert (tmp_path / "samples.jsonl").stat().st_size <= w.samples_allowance(2) + 3 * 100
    uncapped = MetricsWriter(tmp_path / "u", tensorboard=False)
    uncapped.write_samples(1, [rec] * 3, texts=("plan",))
    assert all("plan" in r for r in read_metrics(tmp_path / "u" / "samples.jsonl"))


def test_tensorboard_shows_a_steps_best_worst_and_a_failure():
    recs = [
        {"uid": 1, "reward": 0.6, "valid": True, "score": 0.6, "outcome": "valid", "program": "print(1)"},
        {"uid": 2, "reward": -10.0, "valid": False, "outcome": "no_code"},
        {"uid": 3, "reward": -9.8, "valid": False, "outcome": "syntax_error", "error": "SyntaxError: x ```"},
    ]
    picked = pick_samples(recs)
    assert {k: r["uid"] for k, r in picked.items()} == {"best": 1, "worst": 2, "failure": 3}
    assert pick_samples(recs[:1]) == {"best": recs[0]}  # one valid sample: nothing else to show
    texts = tensorboard_samples(recs)
    assert (
        "outcome syntax_error" in texts["samples/failure"]
        and "````\nSyntaxError: x ```\n````" in (texts["samples/failure"])
    )  # a fence longer than any backtick run inside
    assert "```python\nprint(1)\n```" in sample_markdown(recs[0])
