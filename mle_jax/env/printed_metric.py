"""Best of K by the agent's own printed metric: which of K programs an agent that cannot see the private score hands in.

The one-turn arm of the revising-against-resampling experiment (mle_jax/experiments/learning, `--turns`) draws K
independent programs per start prompt and submits one. It chooses as an MLE-bench agent could, from what it sees of
its runs (env/observation.py): the held-out metric its program printed, and whether its submission.csv passed the
format check. Never the grader's score.

What the programs print (checked on the warm-start corpora, mle_jax/warmstart/programs/): spooky's print
`validation log loss: 0.53`, pizza's `validation auc: 0.61`, the task's own metric on a 20% split. The instrumenter's
`testing loss:` print carries a value only when the program assigned the metric to a name (instrument/fallback.py);
the corpus programs compute it inside their own print, so the instrumented line is a bare `testing loss:`. The value
read is therefore the last of, in order of preference:

1. a tagged `testing loss: <number>` line (the instrumenter's print, with the agent's value);
2. the agent's own held-out print, a line starting `validation`, `valid`, `val`, `holdout`, `cv` or `oof` with a
   number after its colon or equals sign (`validation log loss: 0.53`), the test-time search's reading too
   (env/search.py): the parser lives here, for both.

Both are the task's metric as the agent computed it on data it held out, so the task's direction applies (log loss
lower, AUC higher: public, the competition's description says it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mle_jax.tasks.progress import untag

if TYPE_CHECKING:
    from mle_jax.env.rollout import Sample

METRIC_PRINT = "testing loss:"  # the progress print whose value is the program's own validation metric
_VALIDATION_LINE = re.compile(
    r"^[ \t]*(?:validation|valid|val|holdout|hold-out|cv|oof)(?:\b|_)[^\n:=]*[:=][ \t]*(.*)$",
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def tagged_metric(raw_output: str, tag: str | None) -> float | None:
    """The number after the last ``testing loss:`` print carrying `tag` (the instrumenter's) in a run's raw output;
    None when there is no such print, it has no number, or the number is not finite (or `tag` is None: a run that was
    never instrumented has no trusted print)."""
    if not tag:
        return None
    pattern = re.compile(r"^" + re.escape(tag) + r" ?" + re.escape(METRIC_PRINT) + r"(.*)$", re.MULTILINE)
    lines = pattern.findall(raw_output.replace("\r", "\n"))
    if not lines:
        return None
    m = _NUMBER.search(lines[-1])
    if m is None:
        return None
    value = float(m.group(0))
    return value if math.isfinite(value) else None


def program_metric(output: str) -> float | None:
    """The number on the last line of a program's output that reports a validation metric (module doc); None when
    no such line has a finite number."""
    for rest in reversed(_VALIDATION_LINE.findall(output.replace("\r", "\n"))):
        m = _NUMBER.search(rest)
        if m is not None and math.isfinite(float(m.group(0))):
            return float(m.group(0))
    return None


def node_metric(raw_output: str, tag: str | None) -> tuple[float | None, str | None]:
    """(a run's printed validation metric, its source: "instrumenter" or "program"), or (None, None)."""
    tagged = tagged_metric(raw_output, tag)
    if tagged is not None:
        return tagged, "instrumenter"
    output = untag(raw_output, tag) if tag else raw_output
    own = program_metric(output)
    return (own, "program") if own is not None else (None, None)


def printed_metric(raw_output: str, tag: str | None) -> float | None:
    """The held-out metric a run printed, or None when it printed none: the reading of the test-time search
    (`node_metric`: the instrumenter's tagged `testing loss:` value, else the program's own validation line),
    one parser for both.

    raw_output: the run's terminal output as captured, the instrumenter's lines still tagged; tag: the run's tag
    (None: no line is the instrumenter's)."""
    return node_metric(raw_output, tag)[0]


def choose(metrics: Sequence[float | None], format_ok: Sequence[bool], lower_is_better: bool) -> int:
    """The index of the program to submit among K: among those whose submission passed the format check, the best
    printed metric (the first of equals); when none of those printed one, the last of them; when no submission
    passed the check, the best printed metric among all, else the first program.

    metrics: [K], None where nothing was printed; format_ok: [K]."""
    if len(metrics) != len(format_ok) or not metrics:
        raise ValueError(f"choose: {len(metrics)} metrics and {len(format_ok)} format checks (need the same, >= 1)")
    sign = 1.0 if lower_is_better else -1.0

    def best(indices: list[int]) -> int | None:
        printed = [i for i in indices if metrics[i] is not None]
        return min(printed, key=lambda i: (sign * metrics[i], i)) if printed else None

    ok = [i for i, f in enumerate(format_ok) if f]
    if ok:
        chosen = best(ok)
        return ok[-1] if chosen is None else chosen
    chosen = best(list(range(len(metrics))))
    return 0 if chosen is None else chosen


def best_of_printed(samples: Sequence[Sample], lower_is_better: bool) -> Sample:
    """The sample `choose` picks among finished samples (a run's format check is in its observation)."""
    metrics = [printed_metric(s.raw_output, s.tag) for s in samples]
    ok = [bool(s.observation is not None and s.observation.submission_ok) for s in samples]
    return samples[choose(metrics, ok, lower_is_better)]
