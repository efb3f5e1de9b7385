"""The leaf-classification warm-start grid: feature groups x scaling x classifiers from nearest neighbours to
boosted trees (multi-class log loss over 99 species, tabular margin/shape/texture features)."""

from __future__ import annotations

from typing import Any

from mle_jax.warmstart.corpus import CorpusItem, fmt, grid, public_dir_in_sandbox

TASK_ID = LEAF = "leaf-classification"

_HEAD = """import numpy as np
import pandas as pd
from sklearn import discriminant_analysis, ensemble, linear_model, naive_bayes, neighbors, neural_network, svm
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

train = pd.read_csv("{data}train.csv")
test = pd.read_csv("{data}test.csv")
y = train["species"]
cols = [c for c in test.columns if c.startswith({prefixes})]


def features(df):
    return df[cols].values

"""

_TAIL = """
X, X_test = features(train), features(test)
X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
model.fit(X_tr, y_tr)
print("validation log loss:", log_loss(y_va, model.predict_proba(X_va), labels=model.classes_))
pred = model.predict_proba(X_test)
sub = pd.DataFrame(pred, columns=model.classes_)
sub.insert(0, "id", test["id"])
sub.to_csv("submission.csv", index=False)
"""

# feature set -> (column prefixes, plan words); each group is 64 columns of the pre-extracted leaf descriptors
_FEATURES = {
    "margin": (("margin",), "the 64 margin features"),
    "shape": (("shape",), "the 64 shape features"),
    "texture": (("texture",), "the 64 texture features"),
    "margin+texture": (("margin", "texture"), "the margin and texture features"),
    "all": (("margin", "shape", "texture"), "all 192 margin, shape and texture features"),
}
_ALL = list(_FEATURES)

# model family -> feature sets, hyperparameter grid, estimator (inside make_pipeline with the scaler when
# `scale`), plan words; optional packages gate their families
_MODELS: dict[str, dict[str, Any]] = {
    "logreg": dict(
        features=_ALL,
        grid=grid(C=[1.0, 10.0, 100.0, 1000.0]),
        ctor="linear_model.LogisticRegression(C={C}, max_iter=2000)",
        plan="a multinomial logistic regression with C={C} on standardised features",
        scale=True,
    ),
    "lda": dict(
        features=_ALL,
        grid=grid(shrinkage=[0.01, 0.1, 0.3]),
        ctor='discriminant_analysis.LinearDiscriminantAnalysis(solver="lsqr", shrinkage={shrinkage})',
        plan="linear discriminant analysis with shrinkage {shrinkage}",
        scale=False,
    ),
    "naive_bayes": dict(
        features=_ALL,
        grid=grid(var_smoothing=[1e-6, 1e-3, 1e-1]),
        ctor="naive_bayes.GaussianNB(var_smoothing={var_smoothing})",
        plan="a Gaussian naive Bayes model with var_smoothing={var_smoothing}",
        scale=False,
    ),
    "knn": dict(
        features=_ALL,
        grid=grid(n_neighbors=[3, 5, 10], weights=["uniform", "distance"]),
        ctor="neighbors.KNeighborsClassifier(n_neighbors={n_neighbors}, weights={weights})",
        plan="a {n_neighbors}-nearest-neighbour vote ({weights} weights) on standardised features",
        scale=True,
    ),
    "mlp": dict(
        features=["margin+texture", "all"],
        grid=grid(hidden=[(128,), (256,)], alpha=[1e-4, 1e-2, 1.0]),
        ctor="neural_network.MLPClassifier(hidden_layer_sizes={hidden}, alpha={alpha}, max_iter=500, random_state=0)",
        plan="a neural network with hidden layers {hidden} and L2 penalty alpha={alpha} on standardised features",
        scale=True,
    ),
    "random_forest": dict(
        features=_ALL,
        grid=grid(n_estimators=[200, 500], max_features=["sqrt", 0.3]),
        ctor="ensemble.RandomForestClassifier(n_estimators={n_estimators}, max_features={max_features}, "
        "n_jobs=1, random_state=0)",
        plan="a random forest of {n_estimators} trees with max_features={max_features}",
        scale=False,
    ),
    "extra_trees": dict(
        features=_ALL,
        grid=grid(n_estimators=[200, 500], max_features=["sqrt", 0.3]),
        ctor="ensemble.ExtraTreesClassifier(n_estimators={n_estimators}, max_features={max_features}, "
        "n_jobs=1, random_state=0)",
        plan="extra trees, {n_estimators} of them, with max_features={max_features}",
        scale=False,
    ),
    "svm": dict(
        features=["margin+texture", "all"],
        grid=grid(C=[1.0, 10.0, 100.0]),
        ctor='svm.SVC(C={C}, kernel="rbf", probability=True, random_state=0)',
        plan="an RBF support vector machine with C={C}, its probabilities from Platt scaling, on standardised features",
        scale=True,
    ),
    "lightgbm": dict(
        features=["margin+texture", "all"],
        package="lightgbm",
        imports="import lightgbm",
        grid=grid(n_estimators=[100, 200], learning_rate=[0.05, 0.1]),
        ctor="lightgbm.LGBMClassifier(n_estimators={n_estimators}, learning_rate={learning_rate}, num_leaves=7, "
        "min_child_samples=3, n_jobs=1, verbose=-1)",
        plan="LightGBM with {n_estimators} rounds of 7-leaf trees per species and learning rate {learning_rate}",
        scale=False,
    ),
}


def _tuple_literal(names: tuple[str, ...]) -> str:
    """('a',) -> '("a",)'; ('a', 'b') -> '("a", "b")' (double quotes, as the rest of the program)."""
    inner = ", ".join(f'"{n}"' for n in names)
    return f"({inner},)" if len(names) == 1 else f"({inner})"


def programs(packages: frozenset[str]) -> list[CorpusItem]:
    """The leaf-classification grid (log loss over the 99 species, id `id`)."""
    items = []
    for family, spec in _MODELS.items():
        if "package" in spec and spec["package"] not in packages:
            continue
        for fs in spec["features"]:
            prefixes, words = _FEATURES[fs]
            for hp in spec["grid"]:
                shown = {k: fmt(v) if isinstance(v, float | str) else v for k, v in hp.items()}
                estimator = spec["ctor"].format(**shown)
                if spec["scale"]:
                    estimator = f"make_pipeline(StandardScaler(), {estimator})"
                local_import = spec["imports"] + "\n\n" if "imports" in spec else ""
                code = (
                    _HEAD.format(data=public_dir_in_sandbox(LEAF), prefixes=_tuple_literal(prefixes))
                    + "\n"
                    + local_import
                    + f"model = {estimator}\n"
                    + _TAIL
                )
                plan = (
                    f"I predict the species of each leaf from {words}. The model is "
                    f"{spec['plan'].format(**hp)}. I fit it on a stratified 80% of train.csv, print the log loss "
                    "on the other 20%, and write one probability column per species, by id, to submission.csv."
                )
                items.append(CorpusItem(plan, code, {"task": LEAF, "model": family, "features": fs, "hparams": hp}))
    return items
