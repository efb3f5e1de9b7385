"""samples.html in headless Chromium, on records with what the page does not know (a multi-turn run's episode, turn
and observation) and with hostile text: every field shown, a filter by turn, sorting, and nothing in a sample's
text that runs as script or markup. A real run's page is read in tests/rl/test_loop.py and tests/test_e2e.py."""

from __future__ import annotations

import pytest

from mle_jax.reporting.samples_page import write_samples_page
from tests.samples_browser import open_page, rows

pytestmark = pytest.mark.integration  # Debian's chromium (make apt)

HOSTILE = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


def _records() -> list[dict]:
    base = {"task": "random-acts-of-pizza", "prompt": "scratch", "status": "ok", "outcome": "valid", "valid": True,
            "medal": "none", "duration_s": 1.5, "lag": 0}  # fmt: skip
    out = []
    for uid in range(6):
        turn = uid % 3 + 1
        out.append({
            **base, "step": 1 + uid // 3, "uid": uid, "episode": uid // 3, "turn": turn, "reward": 0.1 * uid,
            "score": 0.55, "program": f"print('turn {turn}')\nx = {uid}", "instrumenter_lines": [1],
            "stdout": f"turn {turn}\n{HOSTILE}", "progress_lines": [], "stderr": "",
            "observation": f"The run of turn {turn - 1} printed:\n{HOSTILE}",
        })  # fmt: skip
    out.append({**base, "step": 2, "uid": 6, "reward": -10.0, "valid": False, "outcome": "runtime_error",
                "status": "error", "error": "KeyError: 'id'", "texts_dropped": True, "code": "import x"})  # fmt: skip
    return out


def test_the_page_shows_fields_it_does_not_know_filters_by_turn_and_runs_no_sample_text(tmp_path):
    records = _records()
    path = write_samples_page(records, tmp_path, "Samples: <pizza>")
    with open_page(path) as opened:
        page = opened.page
        assert page.title() == "Samples: <pizza>"
        assert rows(page, "uid") == [str(r["uid"]) for r in records]
        assert "task" not in page.locator("#samples th").all_inner_texts()  # one task: no column for it
        page.select_option("#filter-turn", "2")
        assert rows(page, "uid") == ["1", "4"] and rows(page, "turn") == ["2", "2"]
        page.locator("#samples tr.sample").nth(1).click()
        figures = dict(zip(page.locator("#figures th").all_inner_texts(), page.locator("#figures td").all_inner_texts(),
                           strict=True))  # fmt: skip
        assert figures["episode"] == "1" and figures["turn"] == "2" and figures["uid"] == "4"
        assert page.inner_text("#field-observation") == f"The run of turn 1 printed:\n{HOSTILE}"
        assert page.locator("#program span.line").all_inner_texts() == ["print('turn 2')", "x = 4"]
        assert page.inner_text("#stdout").endswith(HOSTILE)  # shown as text
        assert page.evaluate("window.pwned") is None and page.locator("#detail img").count() == 0
        page.select_option("#filter-turn", "")
        page.click("#samples th[data-key='reward']")  # sort: ascending, then descending
        page.click("#samples th[data-key='reward']")
        assert rows(page, "uid") == ["5", "4", "3", "2", "1", "0", "6"]
        page.select_option("#filter-outcome", "runtime_error")
        page.locator("#samples tr.sample").first.click()
        detail = page.inner_text("#detail")
        assert "KeyError: 'id'" in detail and "size cap" in detail  # its texts were dropped, and it says so
        assert page.locator("#program span.line").all_inner_texts() == ["import x"]  # the response's code instead
    assert opened.errors == [] and opened.requests == []
