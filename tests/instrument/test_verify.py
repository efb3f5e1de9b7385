"""verify(original, instrumented): only inserted progress prints are allowed."""

from __future__ import annotations

import pytest

from mle_jax.instrument.verify import verify
from mle_jax.tasks.progress import count_progress

ORIGINAL = """import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss


def main():
    df = pd.read_csv("train.csv")  # comment
    model = LogisticRegression(C=1.0)
    model.fit(df[["a"]], df["y"])
    loss = log_loss(df["y"], model.predict_proba(df[["a"]]))
    if loss > 1:
        pass
    print("done", loss)


if __name__ == "__main__":
    main()
"""

INSTRUMENTED = """import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
print("imported packages")


def main():
    df = pd.read_csv("train.csv")
    print("loaded data")
    model = LogisticRegression(C=1.0)
    print("defined model", flush=True)
    model.fit(df[["a"]], df["y"])
    print("trained model")
    loss = log_loss(df["y"], model.predict_proba(df[["a"]]))
    print("training loss:", loss)
    print(f"testing loss: {loss:.3f}")
    if loss > 1:
        pass
    print("done", loss)


if __name__ == "__main__":
    main()
"""


def test_accepts_pure_print_insertion():
    verdict = verify(ORIGINAL, INSTRUMENTED)
    assert verdict.ok, verdict.reason
    assert verdict.n_inserted == 6
    assert verify(ORIGINAL, ORIGINAL).ok and verify(ORIGINAL, ORIGINAL).n_inserted == 0


@pytest.mark.parametrize(
    "edit, old, new",
    [
        ("changed constant", "C=1.0", "C=2.0"),
        ("deleted line", '    print("done", loss)\n', ""),
        ("added import", "import pandas as pd\n", "import pandas as pd\nimport os\n"),
        ("syntax error", "def main():", "def main()"),
        (
            "reordered statements",
            'df = pd.read_csv("train.csv")\n    print("loaded data")\n    model = LogisticRegression(C=1.0)\n',
            'model = LogisticRegression(C=1.0)\n    print("loaded data")\n    df = pd.read_csv("train.csv")\n',
        ),
        ("pass replaced by a print", "        pass\n", '        print("loaded data")\n'),
        (
            "side effect hidden in a loss print",
            'print("training loss:", loss)',
            'print("training loss:", model.fit(df[["a"]], df["y"]))',
        ),
        ("walrus in a loss print", 'print("training loss:", loss)', 'print("training loss:", (loss := 0))'),
        ("non-progress print added", 'print("trained model")', 'print("trained model!")'),
        ("extra args on a plain progress print", 'print("trained model")', 'print("trained model", df.pop("a"))'),
    ],
)
def test_rejects_anything_else(edit, old, new):
    assert old in INSTRUMENTED
    verdict = verify(ORIGINAL, INSTRUMENTED.replace(old, new, 1))
    assert not verdict.ok, edit
    assert verdict.reason


def test_the_agents_own_progress_prints_do_not_confuse_it():
    original = 'import os\nprint("loaded data")\nx = 1\n'
    assert verify(original, 'import os\nprint("imported packages")\nprint("loaded data")\nx = 1\n').ok


def test_count_progress_line_start_and_once():
    text = "imported packages\nloaded data\nloaded data\n  trained model\n"
    text += "testing loss: 0.7\rpredicted test labels"
    expected = ("imported packages", "loaded data", "testing loss:", "predicted test labels")
    assert count_progress(text) == expected
    assert count_progress("") == ()
