"""The random-acts-of-pizza warm-start grid: model families x feature sets x hyperparameters (binary AUC)."""

from __future__ import annotations

import itertools
from typing import Any

from mle_jax.warmstart.corpus import CorpusItem, fmt, grid, public_dir_in_sandbox

TASK_ID = PIZZA = "random-acts-of-pizza"

# Feature sets: what `features(df)` stacks. Only columns present in BOTH public train.json and test.json
# are used (the "_at_request" numbers, the title, the edit-aware text); train also has retrieval-time
# columns (leaks) that test lacks, and test has subreddit columns that this copy of train lacks.
_PIZZA_PARTS = {  # feature part -> (expression on df, plan words)
    "tfidf": ("vec.transform(text(df))", "a TF-IDF of title and text ({max_features} {ngrams})"),
    "num": ("np.log1p(df[num].abs().values)", "the log-scaled request-time user numbers"),
    "len": ('np.log1p(np.c_[text(df).str.len(), text(df).str.count(" ")])', "the text length in characters and words"),
}
_PIZZA_FEATURE_SETS = ["num", "len", "num+len", "tfidf", "tfidf+num", "tfidf+num+len"]

_PIZZA_HEAD = """import numpy as np
import pandas as pd
from scipy import sparse
from sklearn import calibration, ensemble, linear_model, naive_bayes, svm
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

train = pd.read_json("{data}train.json")
test = pd.read_json("{data}test.json")
y = train["requester_received_pizza"].astype(int)
num = [c for c in test.columns if c.endswith("_at_request") and c in train.columns]


def text(df):
    return df["request_title"] + " " + df["request_text_edit_aware"]

"""

_PIZZA_TAIL = """
X, X_test = features(train), features(test)
X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size=0.2, random_state=0)
model.fit(X_tr, y_tr)
print("validation auc:", roc_auc_score(y_va, model.predict_proba(X_va)[:, 1]))
pred = model.predict_proba(X_test)[:, 1]
sub = pd.DataFrame({"request_id": test["request_id"], "requester_received_pizza": pred})
sub.to_csv("submission.csv", index=False)
"""


def _pizza_features_code(fs: str, hp: dict[str, Any]) -> str:
    parts = [_PIZZA_PARTS[p][0] for p in fs.split("+")]
    lines = []
    if "tfidf" in fs:
        vec = f"TfidfVectorizer(max_features={hp['max_features']}, ngram_range={hp['ngram_range']!r})"
        lines += ["", f"vec = {vec}", "vec.fit(text(train))", ""]
    if len(parts) == 1:
        body = parts[0]
    elif "tfidf" in fs:
        body = f"sparse.hstack([{', '.join(parts)}]).tocsr()"
    else:
        body = f"np.hstack([{', '.join(parts)}])"
    lines += ["", "def features(df):", f"    return {body}", "", ""]
    return "\n".join(lines) + "\n"


_DENSE = ["num", "len", "num+len"]
# model family -> feature sets it pairs with, hyperparameter grid, constructor, plan words, and for
# families outside sklearn the sandbox package they need and its import line. Histogram/classic gradient
# boosting take dense features only (no sparse TF-IDF); naive Bayes only makes sense with TF-IDF counts.
_PIZZA_MODELS: dict[str, dict[str, Any]] = {
    "logreg": dict(
        features=_PIZZA_FEATURE_SETS,
        grid=grid(C=[0.1, 0.3, 1.0, 3.0], class_weight=[None, "balanced"]),
        ctor="linear_model.LogisticRegression(C={C}, class_weight={class_weight}, max_iter=1000)",
        plan="a logistic regression with C={C} and class_weight={class_weight}",
    ),
    "naive_bayes": dict(
        features=["tfidf", "tfidf+num", "tfidf+num+len"],
        grid=grid(kind=["MultinomialNB", "ComplementNB"], alpha=[0.1, 0.3, 1.0]),
        ctor="naive_bayes.{kind}(alpha={alpha})",
        plan="a {kind} naive Bayes model with alpha={alpha}",
    ),
    "linear_svm": dict(
        features=_PIZZA_FEATURE_SETS,
        grid=grid(C=[0.03, 0.1, 0.3, 1.0]),
        ctor="calibration.CalibratedClassifierCV(svm.LinearSVC(C={C}), cv=3)",
        plan="a linear SVM with C={C}, calibrated to probabilities",
    ),
    "random_forest": dict(
        features=_PIZZA_FEATURE_SETS,
        grid=grid(n_estimators=[100, 200], max_depth=[8, 16, None], min_samples_leaf=[1, 3]),
        ctor="ensemble.RandomForestClassifier(n_estimators={n_estimators}, max_depth={max_depth}, "
        "min_samples_leaf={min_samples_leaf}, random_state=0)",
        plan="a random forest of {n_estimators} trees with max_depth={max_depth} and "
        "min_samples_leaf={min_samples_leaf}",
    ),
    "extra_trees": dict(
        features=_PIZZA_FEATURE_SETS,
        grid=grid(n_estimators=[100, 200], max_depth=[8, 16, None], min_samples_leaf=[1, 3]),
        ctor="ensemble.ExtraTreesClassifier(n_estimators={n_estimators}, max_depth={max_depth}, "
        "min_samples_leaf={min_samples_leaf}, random_state=0)",
        plan="extra trees, {n_estimators} of them, with max_depth={max_depth} and min_samples_leaf={min_samples_leaf}",
    ),
    "gradient_boosting": dict(
        features=_DENSE,
        grid=grid(n_estimators=[100, 200], learning_rate=[0.05, 0.1], max_depth=[2, 3]),
        ctor="ensemble.GradientBoostingClassifier(n_estimators={n_estimators}, "
        "learning_rate={learning_rate}, max_depth={max_depth})",
        plan="gradient boosting with {n_estimators} trees of depth {max_depth} and learning rate {learning_rate}",
    ),
    "hist_gradient_boosting": dict(
        features=_DENSE,
        grid=grid(max_iter=[100, 200], learning_rate=[0.05, 0.1], max_leaf_nodes=[15, 31]),
        ctor="ensemble.HistGradientBoostingClassifier(max_iter={max_iter}, learning_rate={learning_rate}, "
        "max_leaf_nodes={max_leaf_nodes})",
        plan="histogram gradient boosting with {max_iter} iterations, learning rate {learning_rate} and "
        "{max_leaf_nodes} leaves",
    ),
    "xgboost": dict(
        features=_PIZZA_FEATURE_SETS,
        package="xgboost",
        imports="import xgboost",
        grid=grid(n_estimators=[100, 200], max_depth=[3, 5], learning_rate=[0.05, 0.1]),
        ctor="xgboost.XGBClassifier(n_estimators={n_estimators}, max_depth={max_depth}, "
        "learning_rate={learning_rate}, n_jobs=1)",
        plan="XGBoost with {n_estimators} trees of depth {max_depth} and learning rate {learning_rate}",
    ),
    "lightgbm": dict(
        features=_PIZZA_FEATURE_SETS,
        package="lightgbm",
        imports="import lightgbm",
        grid=grid(n_estimators=[100, 200], num_leaves=[15, 31], learning_rate=[0.05, 0.1]),
        ctor="lightgbm.LGBMClassifier(n_estimators={n_estimators}, num_leaves={num_leaves}, "
        "learning_rate={learning_rate}, n_jobs=1, verbose=-1)",
        plan="LightGBM with {n_estimators} trees, {num_leaves} leaves and learning rate {learning_rate}",
    ),
}

# How to tell a program's model family (its "kind of solution") from its code: first match wins.
KINDS: tuple[tuple[str, str], ...] = (
    ("hist_gradient_boosting", r"HistGradientBoostingClassifier\("),
    ("gradient_boosting", r"GradientBoostingClassifier\("),
    ("random_forest", r"RandomForestClassifier\("),
    ("extra_trees", r"ExtraTreesClassifier\("),
    ("xgboost", r"XGBClassifier\("),
    ("lightgbm", r"LGBMClassifier\("),
    ("linear_svm", r"LinearSVC\("),
    ("naive_bayes", r"(Multinomial|Complement|Bernoulli|Gaussian)NB\("),
    ("logreg", r"LogisticRegression\("),
)

# TF-IDF settings, crossed with every model on a feature set that has text.
_PIZZA_TFIDF = grid(max_features=[1000, 3000], ngram_range=[(1, 1), (1, 2)])


def _pizza_plan(model_desc: str, fs: str, hp: dict[str, Any]) -> str:
    words = [_PIZZA_PARTS[p][1] for p in fs.split("+")]
    feats = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    if "tfidf" in fs:
        ngrams = "words" if hp["ngram_range"] == (1, 1) else "words and word pairs"
        feats = feats.format(max_features=hp["max_features"], ngrams=ngrams)
    return (
        f"I predict requester_received_pizza from {feats}. The model is {model_desc}. "
        "I fit it on 80% of train.json, print the ROC AUC on the other 20%, "
        "and write its test probabilities by request_id to submission.csv."
    )


def programs(packages: frozenset[str]) -> list[CorpusItem]:
    """The random-acts-of-pizza grid (binary AUC on requester_received_pizza, id request_id)."""
    items = []
    for family, spec in _PIZZA_MODELS.items():
        if "package" in spec and spec["package"] not in packages:
            continue
        for fs in spec["features"]:
            text_grid = _PIZZA_TFIDF if "tfidf" in fs else [{}]
            for model_hp, text_hp in itertools.product(spec["grid"], text_grid):
                hp = {**model_hp, **text_hp}
                shown = {k: fmt(v) if isinstance(v, float | str) and k != "kind" else v for k, v in model_hp.items()}
                # optional packages are imported where the model is built: the import sits next to its use
                local_import = spec["imports"] + "\n\n" if "imports" in spec else ""
                code = (
                    _PIZZA_HEAD.format(data=public_dir_in_sandbox(PIZZA))
                    + _pizza_features_code(fs, hp)
                    + local_import
                    + f"model = {spec['ctor'].format(**shown)}\n"
                    + _PIZZA_TAIL
                )
                plan = _pizza_plan(spec["plan"].format(**model_hp), fs, hp)
                items.append(CorpusItem(plan, code, {"task": PIZZA, "model": family, "features": fs, "hparams": hp}))
    return items
