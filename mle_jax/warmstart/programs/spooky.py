"""The spooky-author-identification warm-start grid: text vectorizers x linear and Bayes models (log loss)."""

from __future__ import annotations

import itertools
from typing import Any

from mle_jax.warmstart.corpus import CorpusItem, fmt, grid, public_dir_in_sandbox

TASK_ID = SPOOKY = "spooky-author-identification"

_SPOOKY_HEAD = """import numpy as np
import pandas as pd
from scipy import sparse
from sklearn import calibration, linear_model, naive_bayes, svm
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split

train = pd.read_csv("{data}train.csv")
test = pd.read_csv("{data}test.csv")
y = train["author"]

"""

_SPOOKY_TAIL = """
X, X_test = features(train), features(test)
X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size=0.2, random_state=0)
model.fit(X_tr, y_tr)
print("validation log loss:", log_loss(y_va, model.predict_proba(X_va)))
pred = model.predict_proba(X_test)
sub = pd.DataFrame(pred, columns=model.classes_)
sub.insert(0, "id", test["id"])
sub.to_csv("submission.csv", index=False)
"""

# text representation -> (vectorizer expressions, plan words). "word+char" stacks two vectorizers.
_SPOOKY_TEXT = {
    "word": (
        ["{kind}(ngram_range={ngram_range!r}, max_features={max_features}, sublinear_tf=True)"],
        "word {ngram_words} ({max_features} terms)",
    ),
    "char": (
        ['{kind}(analyzer="char_wb", ngram_range=(2, 4), max_features={max_features}, sublinear_tf=True)'],
        "character 2-4-grams ({max_features} terms)",
    ),
    "word+char": (
        [
            "{kind}(ngram_range={ngram_range!r}, max_features={max_features}, sublinear_tf=True)",
            '{kind}(analyzer="char_wb", ngram_range=(2, 4), max_features={max_features}, sublinear_tf=True)',
        ],
        "word {ngram_words} and character 2-4-grams ({max_features} terms each)",
    ),
}
_SPOOKY_VECTORS = grid(
    kind=["TfidfVectorizer", "CountVectorizer"], ngram_range=[(1, 1), (1, 2)], max_features=[20000, 50000]
)

# How to tell a program's model family (its "kind of solution") from its code: first match wins.
# A program's kind of solution: its model family and its text representation (first match wins). The
# representation is part of it here because it is what makes a spooky program slow and good: naive Bayes on
# words + characters scores better than on words alone and takes several times longer (docs/results.md, "Do
# duration weights matter on the real loop?").
_FAMILIES = (
    ("linear_svm", r"LinearSVC\("),
    ("sgd", r"SGDClassifier\("),
    ("naive_bayes", r"(Multinomial|Complement|Bernoulli|Gaussian)NB\("),
    ("logreg", r"LogisticRegression\("),
)
_REPRESENTATIONS = (
    ("word+char", r"sparse\.hstack\("),  # two vectorizers stacked
    ("char", r'analyzer="char_wb"'),
    ("word", r"Vectorizer\("),
)
KINDS: tuple[tuple[str, str], ...] = tuple(
    (f"{family} {rep}", rf"(?s){rep_pattern}.*{family_pattern}")
    for rep, rep_pattern in _REPRESENTATIONS
    for family, family_pattern in _FAMILIES
)

_SPOOKY_MODELS: dict[str, dict[str, Any]] = {
    "logreg": dict(
        grid=grid(C=[1.0, 3.0, 10.0]),
        ctor="linear_model.LogisticRegression(C={C}, max_iter=1000)",
        plan="a multinomial logistic regression with C={C}",
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
        grid=grid(alpha=[1e-5, 3e-5, 1e-4]),
        ctor='linear_model.SGDClassifier(loss="log_loss", alpha={alpha}, max_iter=50, random_state=0)',
        plan="a logistic-loss SGD classifier with alpha={alpha}",
    ),
}


def programs(packages: frozenset[str]) -> list[CorpusItem]:
    """The spooky-author-identification grid (multi-class log loss over EAP/HPL/MWS, id `id`)."""
    del packages  # every family here is scikit-learn
    items = []
    for family, spec in _SPOOKY_MODELS.items():
        for rep, (vec_templates, words) in _SPOOKY_TEXT.items():
            for model_hp, vec_hp in itertools.product(spec["grid"], _SPOOKY_VECTORS):
                if rep == "char" and vec_hp["ngram_range"] != (1, 1):
                    continue  # the word n-gram range does not apply to characters
                hp = {**model_hp, **{f"vec_{k}": v for k, v in vec_hp.items()}}
                vecs = [t.format(**vec_hp) for t in vec_templates]
                if vec_hp["kind"] == "CountVectorizer":
                    vecs = [v.replace(", sublinear_tf=True", "") for v in vecs]
                lines = [f'vec{i} = {v}\nvec{i}.fit(train["text"])' for i, v in enumerate(vecs)]
                parts = [f'vec{i}.transform(df["text"])' for i in range(len(vecs))]
                body = parts[0] if len(parts) == 1 else f"sparse.hstack([{', '.join(parts)}]).tocsr()"
                shown = {k: fmt(v) if isinstance(v, float) else v for k, v in model_hp.items()}
                code = (
                    _SPOOKY_HEAD.format(data=public_dir_in_sandbox(SPOOKY))
                    + "\n".join(lines)
                    + f"\n\n\ndef features(df):\n    return {body}\n\n\n"
                    + f"model = {spec['ctor'].format(**shown)}\n"
                    + _SPOOKY_TAIL
                )
                ngram_words = "unigrams" if vec_hp["ngram_range"] == (1, 1) else "unigrams and bigrams"
                counts = "TF-IDF" if vec_hp["kind"] == "TfidfVectorizer" else "count"
                feats = words.format(ngram_words=ngram_words, max_features=vec_hp["max_features"])
                plan = (
                    f"I predict the author (EAP, HPL or MWS) of each sentence from {counts} features of "
                    f"{feats}. The model is {spec['plan'].format(**model_hp)}. I fit it on 80% of "
                    "train.csv, print the log loss on the other 20%, and write one probability column "
                    "per author, by id, to submission.csv."
                )
                items.append(CorpusItem(plan, code, {"task": SPOOKY, "model": family, "features": rep, "hparams": hp}))
    return items
