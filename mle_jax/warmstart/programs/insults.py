"""The detecting-insults-in-social-commentary warm-start grid: text vectorizers x linear, Bayes and tree models
(binary AUC on `Insult`; rows are identified by the `Comment` text)."""

from __future__ import annotations

import itertools
from typing import Any

from mle_jax.warmstart.corpus import CorpusItem, fmt, grid, public_dir_in_sandbox

TASK_ID = INSULTS = "detecting-insults-in-social-commentary"

_HEAD = """import numpy as np
import pandas as pd
from scipy import sparse
from sklearn import calibration, ensemble, linear_model, naive_bayes, svm
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

train = pd.read_csv("{data}train.csv")
test = pd.read_csv("{data}test.csv")
y = train["Insult"]

"""

_TAIL = """
X, X_test = features(train), features(test)
X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size=0.2, random_state=0)
model.fit(X_tr, y_tr)
print("validation auc:", roc_auc_score(y_va, model.predict_proba(X_va)[:, 1]))
pred = model.predict_proba(X_test)[:, 1]
sub = pd.DataFrame({"Insult": pred, "Date": test["Date"], "Comment": test["Comment"]})
sub.to_csv("submission.csv", index=False)
"""

# text representation -> (vectorizer templates, plan words); "word+char" stacks two vectorizers
_TEXT = {
    "word": (
        ["{kind}(ngram_range={ngram_range!r}, max_features={max_features}, sublinear_tf=True)"],
        "word {ngram_words} ({max_features} terms)",
    ),
    "char": (
        ['{kind}(analyzer="char_wb", ngram_range=(2, 5), max_features={max_features}, sublinear_tf=True)'],
        "character 2-5-grams ({max_features} terms)",
    ),
    "word+char": (
        [
            "{kind}(ngram_range={ngram_range!r}, max_features={max_features}, sublinear_tf=True)",
            '{kind}(analyzer="char_wb", ngram_range=(2, 5), max_features={max_features}, sublinear_tf=True)',
        ],
        "word {ngram_words} and character 2-5-grams ({max_features} terms each)",
    ),
}
_VECTORS = grid(kind=["TfidfVectorizer", "CountVectorizer"], ngram_range=[(1, 1), (1, 2)], max_features=[10000])
# trees split on a few thousand columns at most: their vectorizers keep 2000 terms
_TREE_VECTORS = grid(kind=["TfidfVectorizer", "CountVectorizer"], ngram_range=[(1, 1), (1, 2)], max_features=[2000])

# model family -> grid, constructor, plan words, vectorizer grid; optional packages gate their families
_MODELS: dict[str, dict[str, Any]] = {
    "logreg": dict(
        grid=grid(C=[1.0, 3.0, 10.0], class_weight=[None, "balanced"]),
        ctor="linear_model.LogisticRegression(C={C}, class_weight={class_weight}, max_iter=1000)",
        plan="a logistic regression with C={C} and class_weight={class_weight}",
    ),
    "naive_bayes": dict(
        grid=grid(kind=["MultinomialNB", "ComplementNB"], alpha=[0.1, 0.3, 1.0]),
        ctor="naive_bayes.{kind}(alpha={alpha})",
        plan="a {kind} naive Bayes model with alpha={alpha}",
    ),
    "linear_svm": dict(
        grid=grid(C=[0.1, 0.3, 1.0]),
        ctor="calibration.CalibratedClassifierCV(svm.LinearSVC(C={C}), cv=3)",
        plan="a linear SVM with C={C}, calibrated to probabilities",
    ),
    "sgd": dict(
        grid=grid(alpha=[1e-5, 1e-4, 1e-3]),
        ctor='linear_model.SGDClassifier(loss="modified_huber", alpha={alpha}, max_iter=50, random_state=0)',
        plan="a modified-Huber SGD classifier with alpha={alpha}",
    ),
    "random_forest": dict(
        grid=grid(n_estimators=[200, 400], min_samples_leaf=[1, 3]),
        ctor="ensemble.RandomForestClassifier(n_estimators={n_estimators}, min_samples_leaf={min_samples_leaf}, "
        "n_jobs=1, random_state=0)",
        plan="a random forest of {n_estimators} trees with min_samples_leaf={min_samples_leaf}",
        vectors=_TREE_VECTORS,
        texts=["word", "char"],
    ),
    "xgboost": dict(
        package="xgboost",
        imports="import xgboost",
        grid=grid(n_estimators=[200, 400], max_depth=[4, 6]),
        ctor="xgboost.XGBClassifier(n_estimators={n_estimators}, max_depth={max_depth}, learning_rate=0.1, n_jobs=1)",
        plan="XGBoost with {n_estimators} trees of depth {max_depth} and learning rate 0.1",
        vectors=_TREE_VECTORS,
        texts=["word", "char"],
    ),
    "lightgbm": dict(
        package="lightgbm",
        imports="import lightgbm",
        grid=grid(n_estimators=[200, 400], num_leaves=[15, 31]),
        ctor="lightgbm.LGBMClassifier(n_estimators={n_estimators}, num_leaves={num_leaves}, learning_rate=0.1, "
        "n_jobs=1, verbose=-1)",
        plan="LightGBM with {n_estimators} trees, {num_leaves} leaves and learning rate 0.1",
        vectors=_TREE_VECTORS,
        texts=["word", "char"],
    ),
}


def _vectorizer_code(templates: list[str], vec_hp: dict[str, Any]) -> str:
    vecs = [t.format(**vec_hp) for t in templates]
    if vec_hp["kind"] == "CountVectorizer":  # float counts: LightGBM refuses integer sparse matrices
        vecs = [v.replace(", sublinear_tf=True", ", dtype=np.float32") for v in vecs]
    lines = [f'vec{i} = {v}\nvec{i}.fit(train["Comment"])' for i, v in enumerate(vecs)]
    parts = [f'vec{i}.transform(df["Comment"])' for i in range(len(vecs))]
    body = parts[0] if len(parts) == 1 else f"sparse.hstack([{', '.join(parts)}]).tocsr()"
    return "\n".join(lines) + f"\n\n\ndef features(df):\n    return {body}\n\n\n"


def programs(packages: frozenset[str]) -> list[CorpusItem]:
    """The detecting-insults grid (binary AUC on Insult, id Comment)."""
    items = []
    for family, spec in _MODELS.items():
        if "package" in spec and spec["package"] not in packages:
            continue
        texts = {k: _TEXT[k] for k in spec.get("texts", _TEXT)}
        for rep, (templates, words) in texts.items():
            for model_hp, vec_hp in itertools.product(spec["grid"], spec.get("vectors", _VECTORS)):
                if rep == "char" and vec_hp["ngram_range"] != (1, 1):
                    continue  # the word n-gram range does not apply to characters
                hp = {**model_hp, **{f"vec_{k}": v for k, v in vec_hp.items()}}
                shown = {k: fmt(v) if isinstance(v, float | str) and k != "kind" else v for k, v in model_hp.items()}
                local_import = spec["imports"] + "\n\n" if "imports" in spec else ""
                code = (
                    _HEAD.format(data=public_dir_in_sandbox(INSULTS))
                    + _vectorizer_code(templates, vec_hp)
                    + local_import
                    + f"model = {spec['ctor'].format(**shown)}\n"
                    + _TAIL
                )
                ngram_words = "unigrams" if vec_hp["ngram_range"] == (1, 1) else "unigrams and bigrams"
                counts = "TF-IDF" if vec_hp["kind"] == "TfidfVectorizer" else "count"
                feats = words.format(ngram_words=ngram_words, max_features=vec_hp["max_features"])
                plan = (
                    f"I predict whether a comment is an insult from {counts} features of {feats}. The model is "
                    f"{spec['plan'].format(**model_hp)}. I fit it on 80% of train.csv, print the ROC AUC on the "
                    "other 20%, and write its test probabilities with each Comment and Date to submission.csv."
                )
                meta = {"task": INSULTS, "model": family, "features": rep, "hparams": hp}
                items.append(CorpusItem(plan, code, meta))
    return items
