"""Faulty corpus programs run in the real bwrap sandbox on the real pizza data: each kind fails, and the
observation an episode's agent reads shows why; a scripted turn 2 is run and graded as the held-out metric runs it."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from mle_jax.executor.result import Limits
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.sampling.protocol import Completion, SamplingSettings
from mle_jax.tasks.prepare import prepare
from mle_jax.warmstart.debug import fix_metrics, heldout_fixes
from mle_jax.warmstart.faults import FAULT_KINDS, inject, run_faults, sandbox_observe_fn
from mle_jax.warmstart.programs import full_grid, solution_kind
from mle_jax.warmstart.programs.pizza import PIZZA

LIMITS = Limits(timeout_s=120.0, memory_mb=3072, cpus=1, max_procs=64, max_file_mb=256)
# the error each kind's run must show (the shape fault's form here: the whole matrix fitted against y_tr)
ERRORS = {
    "column": "KeyError",
    "import": "NameError: name",
    "path": "FileNotFoundError",
    "api": "Error",  # ImportError (a renamed import) or AttributeError (a module attribute or method)
    "shape": "ValueError: Found input variables with inconsistent numbers of samples",
}


class ScriptedSampler:
    """A fake policy that answers turn 2 with the given texts, in order (the sandbox runs and grading are real)."""

    version = 0

    def __init__(self, texts):
        self.texts, self.prompts = list(texts), []

    def generate(self, prompts, n=1, **kwargs):
        self.prompts += [list(p) for p in prompts]
        return [
            Completion(np.asarray(p, np.int32), np.zeros(1, np.int32), np.zeros(1, np.float32), t, "stop", 0)
            for p, t in zip(prompts, self.texts, strict=True)
        ]


class WordTokenizer:
    """Only the token count matters to `heldout_fixes` once prompts are rendered: one id per character."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 256 for c in text]


@pytest.mark.integration
def test_each_fault_kind_fails_in_bwrap_and_the_observation_says_why(raw_data_dir: Path, tmp_path):
    task = prepare(PIZZA, raw_data_dir / PIZZA, tmp_path / "pizza" / "prepared")
    item = next(it for it in full_grid(PIZZA) if it.meta["model"] == "logreg" and it.meta["features"] == "num")
    faults = {}
    for kind in FAULT_KINDS:  # the first seed whose site is the form ERRORS expects
        faults[kind] = next(
            f for s in range(50) if (f := inject(item.code, kind, s)) and (kind != "shape" or f.what.startswith("fit"))
        )
    observe = sandbox_observe_fn(make_sandbox(ExecutorSettings(backend="bwrap")), task, LIMITS)
    cache = tmp_path / "faults.jsonl"
    planned = [(item, faults[k]) for k in FAULT_KINDS]
    runs = run_faults(planned, observe, cache, workers=2, progress=False)
    assert [r.fault.kind for r in runs] == list(FAULT_KINDS), "a faulty program did not fail"
    for r in runs:
        obs = r.run.observation
        assert obs.status == "error" and obs.exit_code == 1 and not r.run.valid, (r.fault.what, obs)
        assert ERRORS[r.fault.kind] in obs.output and ERRORS[r.fault.kind] in r.run.output, (r.fault.what, obs.output)
        assert obs.output.startswith("imported packages") or r.fault.kind in ("import", "api")  # it ran as RL runs it
        text = obs.text(1500)
        assert text.startswith("Your program stopped with an error (exit code 1).")
        assert "Submission check: no submission.csv was written" in text and ERRORS[r.fault.kind] in text

    def no_runs(code):
        raise AssertionError("a cached faulty program was run again")

    again = run_faults(planned, no_runs, cache, workers=2, progress=False)
    assert [r.run for r in again] == [r.run for r in runs]

    # turn 2, scripted: the original program, the faulty one again, no code, a program that writes nothing, no code
    texts = [
        item.response(),
        runs[1].response(),
        "I will think about it.",
        "Fix.\n\n```python\nprint('done')\n```",
        "",
    ]
    sampler = ScriptedSampler(texts)
    prompts = [[{"role": "user", "content": f"turn 2 after {r.fault.what}"}] for r in runs]
    records = heldout_fixes(
        sampler,
        WordTokenizer(),
        prompts,
        runs,
        768,
        SamplingSettings(max_tokens=320),
        observe,
        workers=2,
        progress=False,
        kind_of=partial(solution_kind, PIZZA),
    )
    assert [r["same_solution"] for r in records] == [True, True, False, False, False]  # the faulty one: same kind
    assert records[0]["similarity"] == 1.0 and 0.9 < records[1]["similarity"] < 1.0 and records[2]["similarity"] == 0
    assert [r["fixed"] for r in records] == [True, False, False, False, False]
    assert [r["exact"] for r in records] == [True, False, False, False, False]
    assert [r["repeat"] for r in records] == [False, True, False, False, False]
    assert [r["status"] for r in records] == ["ok", "error", None, "ok", None]  # no code: nothing ran
    assert records[1]["last_line"].startswith("NameError") and records[3]["last_line"] == "done"
    assert 0.55 < records[0]["score"] < 0.8  # the original program's real AUC
    m = fix_metrics(records)
    assert m["fix_same_solution_share"] == 0.2 and m["same_solution_share"] == 0.4
    assert m["fix_share"] == 0.2 and m["fix_column"] == 1.0 and m["fix_import"] == 0.0 and m["no_code_share"] == 0.4
