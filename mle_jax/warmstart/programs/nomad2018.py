"""The nomad2018-predict-transparent-conductors warm-start grid: composition and lattice features x regressors
from ridge to boosted trees, one fit per target on log1p (mean column RMSLE of formation energy and band gap).
The geometry files are left out: the tabular columns carry most of the signal and keep programs short."""

from __future__ import annotations

from typing import Any

from mle_jax.warmstart.corpus import CorpusItem, fmt, grid, public_dir_in_sandbox

TASK_ID = NOMAD = "nomad2018-predict-transparent-conductors"

_HEAD = """import numpy as np
import pandas as pd
from sklearn import ensemble, linear_model, neighbors, svm
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

train = pd.read_csv("{data}train.csv")
test = pd.read_csv("{data}test.csv")
targets = ["formation_energy_ev_natom", "bandgap_energy_ev"]
num = [c for c in test.columns if c not in ("id", "spacegroup")]
groups = np.sort(train["spacegroup"].unique())

"""

_VOLUME = """
def volume(df):
    a, b, c = (df[f"lattice_vector_{i}_ang"] for i in (1, 2, 3))
    al, be, ga = (np.radians(df[f"lattice_angle_{k}_degree"]) for k in ("alpha", "beta", "gamma"))
    cos = np.cos(al) ** 2 + np.cos(be) ** 2 + np.cos(ga) ** 2 - 2 * np.cos(al) * np.cos(be) * np.cos(ga)
    v = a * b * c * np.sqrt(1 - cos)
    return np.c_[v, df["number_of_total_atoms"] / v]

"""

_TAIL = """
X, X_test = features(train), features(test)
pred = {}
for target in targets:
    y = np.log1p(train[target])
    X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size=0.2, random_state=0)
    model.fit(X_tr, y_tr)
    print(f"validation rmsle of {target}:", np.sqrt(np.mean((model.predict(X_va) - y_va) ** 2)))
    pred[target] = np.expm1(model.predict(X_test))
sub = pd.DataFrame({"id": test["id"], **pred})
sub.to_csv("submission.csv", index=False)
"""

# feature part -> (expression on df, plan words)
_PARTS = {
    "num": ("df[num].values", "the composition, atom count and lattice columns"),
    "spacegroup": ('(df[["spacegroup"]].values == groups).astype(float)', "a one-hot spacegroup"),
    "volume": ("volume(df)", "the cell volume and atom density"),
}
_FEATURE_SETS = ["num", "num+spacegroup", "num+volume", "num+spacegroup+volume"]

_MODELS: dict[str, dict[str, Any]] = {
    "ridge": dict(
        grid=grid(alpha=[0.1, 1.0, 10.0]),
        ctor="make_pipeline(StandardScaler(), linear_model.Ridge(alpha={alpha}))",
        plan="a ridge regression with alpha={alpha} on standardised features",
    ),
    "knn": dict(
        grid=grid(n_neighbors=[5, 10, 20], weights=["uniform", "distance"]),
        ctor="make_pipeline(StandardScaler(), neighbors.KNeighborsRegressor(n_neighbors={n_neighbors}, "
        "weights={weights}))",
        plan="a {n_neighbors}-nearest-neighbour average ({weights} weights) on standardised features",
    ),
    "svr": dict(
        grid=grid(C=[0.3, 1.0, 3.0]),
        ctor="make_pipeline(StandardScaler(), svm.SVR(C={C}, epsilon=0.01))",
        plan="an RBF support vector regression with C={C} on standardised features",
    ),
    "random_forest": dict(
        grid=grid(n_estimators=[100, 300], min_samples_leaf=[1, 5]),
        ctor="ensemble.RandomForestRegressor(n_estimators={n_estimators}, min_samples_leaf={min_samples_leaf}, "
        "n_jobs=1, random_state=0)",
        plan="a random forest of {n_estimators} trees with min_samples_leaf={min_samples_leaf}",
    ),
    "extra_trees": dict(
        grid=grid(n_estimators=[100, 300], min_samples_leaf=[1, 5]),
        ctor="ensemble.ExtraTreesRegressor(n_estimators={n_estimators}, min_samples_leaf={min_samples_leaf}, "
        "n_jobs=1, random_state=0)",
        plan="extra trees, {n_estimators} of them, with min_samples_leaf={min_samples_leaf}",
    ),
    "gradient_boosting": dict(
        grid=grid(n_estimators=[200, 500], learning_rate=[0.05, 0.1], max_depth=[3, 5]),
        ctor="ensemble.GradientBoostingRegressor(n_estimators={n_estimators}, learning_rate={learning_rate}, "
        "max_depth={max_depth}, random_state=0)",
        plan="gradient boosting with {n_estimators} trees of depth {max_depth} and learning rate {learning_rate}",
    ),
    "hist_gradient_boosting": dict(
        grid=grid(max_iter=[200, 500], learning_rate=[0.05, 0.1], max_leaf_nodes=[15, 31]),
        ctor="ensemble.HistGradientBoostingRegressor(max_iter={max_iter}, learning_rate={learning_rate}, "
        "max_leaf_nodes={max_leaf_nodes}, random_state=0)",
        plan="histogram gradient boosting with {max_iter} iterations, learning rate {learning_rate} and "
        "{max_leaf_nodes} leaves",
    ),
    "xgboost": dict(
        package="xgboost",
        imports="import xgboost",
        grid=grid(n_estimators=[200, 500], max_depth=[4, 6], learning_rate=[0.05, 0.1]),
        ctor="xgboost.XGBRegressor(n_estimators={n_estimators}, max_depth={max_depth}, "
        "learning_rate={learning_rate}, n_jobs=1)",
        plan="XGBoost with {n_estimators} trees of depth {max_depth} and learning rate {learning_rate}",
    ),
    "lightgbm": dict(
        package="lightgbm",
        imports="import lightgbm",
        grid=grid(n_estimators=[200, 500], num_leaves=[15, 31], learning_rate=[0.05, 0.1]),
        ctor="lightgbm.LGBMRegressor(n_estimators={n_estimators}, num_leaves={num_leaves}, "
        "learning_rate={learning_rate}, n_jobs=1, verbose=-1)",
        plan="LightGBM with {n_estimators} trees, {num_leaves} leaves and learning rate {learning_rate}",
    ),
}


def _features_code(fs: str) -> str:
    parts = [_PARTS[p][0] for p in fs.split("+")]
    body = parts[0] if len(parts) == 1 else f"np.hstack([{', '.join(parts)}])"
    return (_VOLUME if "volume" in fs else "") + f"\ndef features(df):\n    return {body}\n\n\n"


def programs(packages: frozenset[str]) -> list[CorpusItem]:
    """The nomad2018 grid (mean column RMSLE of formation_energy_ev_natom and bandgap_energy_ev, id `id`)."""
    items = []
    for family, spec in _MODELS.items():
        if "package" in spec and spec["package"] not in packages:
            continue
        for fs in _FEATURE_SETS:
            for hp in spec["grid"]:
                shown = {k: fmt(v) if isinstance(v, float | str) else v for k, v in hp.items()}
                local_import = spec["imports"] + "\n\n" if "imports" in spec else ""
                code = (
                    _HEAD.format(data=public_dir_in_sandbox(NOMAD))
                    + _features_code(fs)
                    + local_import
                    + f"model = {spec['ctor'].format(**shown)}\n"
                    + _TAIL
                )
                words = [_PARTS[p][1] for p in fs.split("+")]
                feats = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
                plan = (
                    f"I predict the formation energy and the band gap from {feats}. The model is "
                    f"{spec['plan'].format(**hp)}, fit once per target on log1p of the target so that its squared "
                    "error is the RMSLE. I fit it on 80% of train.csv, print each target's RMSLE on the other 20%, "
                    "and write the test predictions by id to submission.csv."
                )
                items.append(CorpusItem(plan, code, {"task": NOMAD, "model": family, "features": fs, "hparams": hp}))
    return items
