"""Only the instrumenter's progress prints earn partial credit: the agent's own are stripped and the
instrumenter's carry a per-run tag (mle_jax/tasks/progress.py, mle_jax/instrument/tagging.py)."""

from __future__ import annotations

import subprocess
import sys

from mle_jax.instrument import instrument_batch
from mle_jax.instrument.tagging import strip_agent_progress, tag_progress
from mle_jax.tasks.progress import count_tagged_progress, new_tag, untag
from mle_jax.tasks.reward import compute_reward

AGENT = """import pandas as pd  # a policy that learned to fake progress
print("imported packages")
print("loaded data")
for epoch in range(2):
    print("training loss:", 0.1 * epoch)
print("trained model"); x = 1
df = pd.DataFrame({"a": [x]})
print("predicted test labels")
"""


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout


def test_agent_written_progress_prints_earn_nothing():
    cleaned = strip_agent_progress(AGENT)
    assert "print(" not in cleaned and cleaned.count("pass") == 5 and "x = 1" in cleaned
    assert subprocess.run([sys.executable, "-c", cleaned], timeout=60).returncode == 0  # still runs
    tag = new_tag()
    tagged = tag_progress(cleaned, tag)
    out = _run(tagged)
    assert count_tagged_progress(out, tag) == ()
    reward = compute_reward(None, out, lower_is_better=False, tag=tag)
    assert reward.total == -10.0 and reward.n_prints == 0
    untagged_reward = compute_reward(None, _run(AGENT), lower_is_better=False)  # the paper's counting
    assert untagged_reward.n_prints == 5


def test_instrumenter_prints_are_tagged_counted_and_shown_untagged(tmp_path):
    (tmp_path / "train.csv").write_text("a,b\n1,2\n3,4\n")
    program = AGENT.replace('df = pd.DataFrame({"a": [x]})', f'df = pd.read_csv("{tmp_path}/train.csv")')
    tag = new_tag()
    inst = instrument_batch([strip_agent_progress(program)], "ast")[0].code
    out = _run(tag_progress(inst, tag))
    prints = count_tagged_progress(out, tag)
    assert "imported packages" in prints and "loaded data" in prints
    assert compute_reward(None, out, lower_is_better=False, tag=tag).n_prints == len(prints)
    shown = untag(out, tag)
    assert tag not in shown and "imported packages\n" in shown
    assert count_tagged_progress(out, new_tag()) == ()  # another run's tag counts nothing


def test_tags_differ_and_unparsable_code_passes_through():
    assert len({new_tag() for _ in range(100)}) == 100
    broken = "print('loaded data'\n"
    assert strip_agent_progress(broken) == broken and tag_progress(broken, "@@x@@") == broken
