"""The deterministic AST instrumenter: where the prints go, that its output verifies, and that it runs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pandas as pd

from mle_jax.instrument.fallback import ast_instrument
from mle_jax.instrument.verify import progress_print_text, verify
from mle_jax.tasks.graders import grade
from mle_jax.tasks.progress import PROGRESS_PRINTS, count_progress
from mle_jax.tasks.prompts import data_mount

# The paper's Figure 11 program, plus a validation split so that losses are computed.
PIZZA_SOLUTION = """import pandas as pd
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.model_selection import train_test_split
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import roc_auc_score
import numpy as np

# Load and preprocess data
train_data = pd.read_json("/workdir/random-acts-of-pizza/prepared/public/train.json")
test_data = pd.read_json("/workdir/random-acts-of-pizza/prepared/public/test.json")

# Preprocess text data
tfidf_vectorizer = TfidfVectorizer(stop_words="english", max_features=1000)
X = tfidf_vectorizer.fit_transform(train_data["request_text_edit_aware"])
y = train_data["requester_received_pizza"].astype(int)
X_test_tfidf = tfidf_vectorizer.transform(test_data["request_text_edit_aware"])
X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.2, random_state=0)

# Train a RandomForestClassifier
rf_classifier = RandomForestClassifier(n_estimators=30, random_state=42, n_jobs=1)
rf_classifier.fit(X_train, y_train)
train_auc = roc_auc_score(y_train, rf_classifier.predict_proba(X_train)[:, 1])
val_auc = roc_auc_score(y_val, rf_classifier.predict_proba(X_val)[:, 1])

# Predict probabilities for the test set
y_pred_proba = rf_classifier.predict_proba(X_test_tfidf)[:, 1]

# Prepare submission file
submission = pd.DataFrame(
    {"request_id": test_data["request_id"], "requester_received_pizza": y_pred_proba}
)
submission.to_csv("./submission.csv", index=False)
"""


def _prints_after(code: str) -> dict[str, list[str]]:
    """Source line (stripped) -> the progress prints that directly follow it."""
    out: dict[str, list[str]] = {}
    last = None
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("print(") and any(p in stripped for p in PROGRESS_PRINTS):
            out.setdefault(last, []).append(next(p for p in PROGRESS_PRINTS if f'"{p}' in stripped))
        elif stripped and not stripped.startswith("#"):
            last = stripped
    return out


def test_pizza_solution_prints_land_after_each_stage():
    out = ast_instrument(PIZZA_SOLUTION)
    assert verify(PIZZA_SOLUTION, out).ok
    after = _prints_after(out)
    assert after["import numpy as np"] == ["imported packages"]
    assert after['test_data = pd.read_json("/workdir/random-acts-of-pizza/prepared/public/test.json")'] == [
        "loaded data"
    ]
    assert out.count('print("loaded data")') == 1  # once, after both files are read
    assert after["rf_classifier = RandomForestClassifier(n_estimators=30, random_state=42, n_jobs=1)"] == [
        "defined model"
    ]
    assert after["rf_classifier.fit(X_train, y_train)"] == ["trained model"]
    assert after["train_auc = roc_auc_score(y_train, rf_classifier.predict_proba(X_train)[:, 1])"] == ["training loss:"]
    assert after["val_auc = roc_auc_score(y_val, rf_classifier.predict_proba(X_val)[:, 1])"] == ["testing loss:"]
    assert after["y_pred_proba = rf_classifier.predict_proba(X_test_tfidf)[:, 1]"] == ["predicted test labels"]
    assert 'print("training loss:", train_auc)' in out and 'print("testing loss:", val_auc)' in out
    assert "# Preprocess text data" in out  # comments and layout kept
    assert 'print("defined model")\nX = tfidf' not in out  # a vectorizer is no model


def test_instrumented_pizza_solution_runs_and_prints_every_stage(pizza_task, tmp_path):
    code = ast_instrument(PIZZA_SOLUTION).replace(data_mount(pizza_task.id), f"{pizza_task.public_dir}/")
    (tmp_path / "solution.py").write_text(code)
    run = subprocess.run([sys.executable, "solution.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert count_progress(run.stdout) == PROGRESS_PRINTS
    lines = [line.split(":")[0] + (":" if ":" in line else "") for line in run.stdout.splitlines()]
    first_seen = list(dict.fromkeys(p for p in lines if p in PROGRESS_PRINTS))
    assert first_seen == [
        "imported packages",
        "loaded data",
        "defined model",
        "trained model",
        "training loss:",
        "testing loss:",
        "predicted test labels",
    ]  # stages' order
    assert float(run.stdout.split("testing loss:")[1].split()[0]) > 0.5  # the value is printed
    result = grade(pizza_task, tmp_path / "submission.csv")
    assert result.valid and result.score > 0.5


FUNCTIONS_PROGRAM = '''"""A solution organised in functions."""
import json
import numpy as np


def load(path):
    with open(path) as f:
        return json.load(f)


class Net:
    def forward(self, x):
        return x * np.ones(2)


def main():
    rows = load(DATA)
    scores = [r["score"] for r in rows]
    model = Net()
    for fold in range(3):
        model.forward(np.array(scores[:2]))
        model.fit_count = fold
    preds = [s * 0.5 for s in scores]
    with open("submission.csv", "w") as f:
        f.write("id,score\\n" + "\\n".join(f"{i},{p}" for i, p in enumerate(preds)))
    return preds


if __name__ == "__main__":
    main()
'''


def test_functions_loops_and_main_block(tmp_path):
    out = ast_instrument(FUNCTIONS_PROGRAM)
    assert verify(FUNCTIONS_PROGRAM, out).ok
    tree = ast.parse(out)
    load_fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "load")
    net = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    loop = next(n for n in ast.walk(tree) if isinstance(n, ast.For))
    for untouched in (load_fn, net, loop):  # nothing after return, in class bodies, or per loop iteration
        assert not any(progress_print_text(s) for s in ast.walk(untouched) if isinstance(s, ast.stmt))
    after = _prints_after(out)
    assert after["rows = load(DATA)"] == ["loaded data"]  # the helper's return value reads data
    assert after["model = Net()"] == ["defined model"]
    assert after["import numpy as np"] == ["imported packages"]
    assert after["preds = [s * 0.5 for s in scores]"] == ["predicted test labels"]  # before the write
    (tmp_path / "data.json").write_text(json.dumps([{"score": 1.0}, {"score": 3.0}]))
    (tmp_path / "solution.py").write_text(f"DATA = {str(tmp_path / 'data.json')!r}\n" + out)
    run = subprocess.run([sys.executable, "solution.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert count_progress(run.stdout) == ("imported packages", "loaded data", "defined model", "predicted test labels")
    assert pd.read_csv(tmp_path / "submission.csv")["score"].tolist() == [0.5, 1.5]


def test_training_loop_prints_after_the_loop():
    code = (
        "import torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(2, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(3):\n"
        "    for xb in [torch.ones(4, 2)]:\n"
        "        loss = model(xb).pow(2).mean()\n"
        "        opt.zero_grad()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "x = 1\n"
    )
    out = ast_instrument(code)
    assert verify(code, out).ok
    assert out.endswith('        opt.step()\nprint("trained model")\nx = 1\n')
    assert 'print("defined model")' in out


def test_one_line_blocks_fall_back_to_unparsing():
    code = "import pandas as pd\nif True: df = pd.read_csv('x.csv'); n = 1\n"
    out = ast_instrument(code)
    assert verify(code, out).ok and verify(code, out).n_inserted == 2
    assert 'print("loaded data")' in out or "print('loaded data')" in out


def test_syntax_error_and_no_imports():
    broken = "import pandas as pd\ndef f(:\n"
    assert ast_instrument(broken) == broken
    plain = '"""doc"""\nx = 1\n'
    out = ast_instrument(plain)
    assert verify(plain, out).ok and out.startswith('"""doc"""\nprint("imported packages")\n')


def test_prediction_not_recognised_prints_before_the_submission_is_written():
    code = (
        "import pandas as pd\n"
        "test = pd.read_csv('test.csv')\n"
        "test['target'] = 0.5\n"
        "test[['id', 'target']].to_csv('submission.csv', index=False)\n"
    )
    out = ast_instrument(code)
    assert verify(code, out).ok
    assert "test['target'] = 0.5\nprint(\"predicted test labels\")\ntest[['id', 'target']].to_csv" in out


def test_every_output_verifies_on_a_mixed_bag():
    programs = [
        PIZZA_SOLUTION,
        FUNCTIONS_PROGRAM,
        "try:\n    import xgboost as xgb\nexcept ImportError:\n    xgb = None\nimport numpy as np\n"
        "X = np.load('x.npy')\nm = xgb.XGBClassifier()\nm.fit(X, X)\np = m.predict(X_test)\n",
        "import lightgbm as lgb\nbooster = lgb.train({}, lgb.Dataset(X, y))\nscore = booster.predict(Xt)\n",
        "import numpy as np\nmatch x:\n    case 1:\n        y = np.loadtxt('a')\n    case _:\n        pass\n",
        "import pandas as pd\nasync def f():\n    return pd.read_csv('a')\nwhile False:\n    break\n",
    ]
    for code in programs:
        out = ast_instrument(code)
        verdict = verify(code, out)
        assert verdict.ok and verdict.n_inserted >= 1, code
