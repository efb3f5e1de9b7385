"""A deterministic corpus of verified solution programs for the warm-start SFT stage.

ML-Agent (arXiv 2505.23723) fine-tunes its agent on *diverse* expert trajectories before RL so that
RL can explore. A tiny model trained from scratch has no expert to imitate, so we write the
"experts" by program: a grid over model families × feature sets × hyperparameters, each point
rendered as a short plan (3-5 sentences) plus one complete solution program in the exact format the
RL prompts ask for.

The programs of one task share one skeleton (same imports, same data loading, same variable
names: `features(df)`, `X`, `X_test`, `model`, `pred`), and differ only in the few lines that carry
the choice. That keeps each program short (the tiny model has to learn to write them) and makes a
sampled mixture of two programs likely to still run. The plan names the features and the model
before the code, so the code the model writes is conditioned on a choice it has already stated.

Every program must run and grade before it enters the SFT set: `verify_corpus` runs each one through a
caller-supplied `run_fn` (the real sandbox + grader, see `sandbox_run_fn`) and keeps only valid ones.

Adding a task: write `def my_programs(packages) -> list[CorpusItem]` that enumerates its whole grid
and decorate it with `@register("<task-id>")`. `generate_corpus` does the seeded selection.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Protocol

from mle_jax.instrument import pyast

# ------------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class CorpusItem:
    """One warm-start example: the plan, the program, and the grid point it came from.

    meta: {"task": id, "model": family, "features": feature set, "hparams": {name: value}}.
    """

    plan: str
    code: str
    meta: dict[str, Any] = field(hash=False, compare=False)

    @property
    def key(self) -> tuple:
        """The grid point: (model, features, sorted hparams). Distinct items have distinct keys."""
        return (self.meta["model"], self.meta["features"], tuple(sorted(self.meta["hparams"].items())))

    def response(self) -> str:
        """The assistant response the RL prompt asks for: the plan, then one fenced python block."""
        return f"{self.plan}\n\n```python\n{self.code}```"


@dataclass(frozen=True)
class VerifiedItem:
    """A corpus item that ran in the sandbox and produced a valid submission with `score`.

    output: the terminal output of that run as an RL improve prompt shows it (the program instrumented
    with progress prints, stdout then stderr, its last `prompt.output_tail_chars` characters).
    """

    item: CorpusItem
    score: float
    duration_s: float
    output: str = ""


class GradeLike(Protocol):
    valid: bool
    score: float | None
    reason: str


# (code) -> (grade, duration_s, terminal output): runs one program on the task and grades its submission.
RunFn = Callable[[str], tuple[GradeLike, float, str]]

_GENERATORS: dict[str, Callable[[frozenset[str]], list[CorpusItem]]] = {}


def register(task_id: str) -> Callable:
    """Decorator: registers `fn(packages) -> list[CorpusItem]` (the whole grid) for `task_id`."""

    def wrap(fn: Callable[[frozenset[str]], list[CorpusItem]]) -> Callable:
        if task_id in _GENERATORS:
            raise ValueError(f"a corpus generator for {task_id!r} is already registered")
        _GENERATORS[task_id] = fn
        return fn

    return wrap


def registered_tasks() -> list[str]:
    return sorted(_GENERATORS)


def public_dir_in_sandbox(task_id: str) -> str:
    """Where the sandbox mounts the task's public files (what the RL prompt tells the agent)."""
    return f"/workdir/{task_id}/prepared/public/"


# ------------------------------------------------------------------------------------------------ API


def full_grid(task_id: str, packages: Iterable[str] | None = None) -> list[CorpusItem]:
    """Every program the generator for `task_id` can write given the sandbox's `packages`
    (None: only the packages every sandbox has: numpy, pandas, scipy, scikit-learn)."""
    if task_id not in _GENERATORS:
        raise KeyError(f"no warm-start corpus generator for task {task_id!r}; have {registered_tasks()}")
    pkgs = frozenset(p.lower().replace("_", "-") for p in (packages or ()))
    return _GENERATORS[task_id](pkgs)


def generate_corpus(task_spec: Any, n: int, seed: int = 0, packages: Iterable[str] | None = None) -> list[CorpusItem]:
    """`n` distinct programs for the task (a TaskSpec, Task or id), chosen deterministically by `seed`.

    Selection is balanced over model families: each family's grid is shuffled by the seed, then the
    families are interleaved round-robin, so the first n items cover every family before repeating one.
    """
    task_id = task_spec if isinstance(task_spec, str) else task_spec.id
    grid = full_grid(task_id, packages)
    if not 0 < n <= len(grid):
        raise ValueError(f"n={n} but the {task_id} grid has {len(grid)} distinct programs (1..{len(grid)})")
    rng = random.Random(seed)
    by_family: dict[str, list[CorpusItem]] = {}
    for item in grid:
        by_family.setdefault(item.meta["model"], []).append(item)
    families = sorted(by_family)
    rng.shuffle(families)
    for f in families:
        rng.shuffle(by_family[f])
    interleaved = [
        it for group in itertools.zip_longest(*(by_family[f] for f in families)) for it in group if it is not None
    ]
    return interleaved[:n]


def check_parses(items: Sequence[CorpusItem]) -> None:
    """Raises SyntaxError naming the first program that does not parse."""
    for it in items:
        try:
            pyast.parse(it.code)
        except SyntaxError as e:
            raise SyntaxError(f"corpus program {it.key} does not parse: {e}") from e


def verify_corpus(
    items: Sequence[CorpusItem],
    task: Any,
    run_fn: RunFn,
    workers: int = 1,
    progress: bool = True,
    on_result: Callable[[CorpusItem, VerifiedItem | None], None] | None = None,
) -> list[VerifiedItem]:
    """Runs every item with `run_fn` and returns those that graded valid, in input order, with score.

    `task` is only used for messages; `run_fn` already knows the task (see `sandbox_run_fn`).
    Invalid programs are dropped (a generator bug: the caller decides whether that is fatal).
    on_result(item, verified or None) is called in this thread as each run finishes (e.g. to cache it).
    """
    check_parses(items)
    task_id = task if isinstance(task, str) else getattr(task, "id", str(task))

    def one(it: CorpusItem) -> VerifiedItem | None:
        grade, duration, output = run_fn(it.code)
        if not grade.valid or grade.score is None:
            return None
        return VerifiedItem(it, float(grade.score), float(duration), output)

    results: list[VerifiedItem | None] = [None] * len(items)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, contextlib.ExitStack() as stack:
        index = {pool.submit(one, it): i for i, it in enumerate(items)}
        bar = None
        if progress:
            from rich.progress import Progress

            bar = stack.enter_context(Progress(transient=True))
            bar_task = bar.add_task(f"verify {task_id} corpus", total=len(items))
        for f in as_completed(index):
            i = index[f]
            results[i] = f.result()
            if on_result is not None:
                on_result(items[i], results[i])
            if bar is not None:
                bar.advance(bar_task)
    return [r for r in results if r is not None]


def sandbox_run_fn(
    sandbox: Any,
    task: Any,
    limits: Any,
    grade_fn: Callable[[Any, Any], GradeLike] | None = None,
    instrument_mode: str = "ast",
    output_chars: int = 1500,
) -> RunFn:
    """A RunFn over a real sandbox (`make_sandbox(...)`) and the task's grader.

    The program runs as RL runs it: instrumented with the progress prints (`instrument_mode`: "ast" or
    "off"; the LM instrumenter needs a model, which the warm start is still building), so the returned
    output is what an improve prompt about this program shows (`rollout.previous_output`, the last
    `output_chars` characters). A run that does not exit ok or writes no submission grades invalid with
    the sandbox's stderr tail.
    """
    from mle_jax.instrument import instrument_batch
    from mle_jax.rl.rollout import previous_output

    if grade_fn is None:
        from mle_jax.tasks.graders import grade as grade_fn
    if instrument_mode not in ("ast", "off"):
        raise ValueError(f"instrument_mode must be 'ast' or 'off' for corpus verification, got {instrument_mode!r}")

    @dataclass
    class _Failed:
        valid: bool
        score: float | None
        reason: str

    def run(code: str) -> tuple[GradeLike, float, str]:
        res = sandbox.run(instrument_batch([code], instrument_mode)[0].code, task, limits)
        output = previous_output(res, output_chars)
        if str(res.status) != "ok" or res.submission_path is None:
            return _Failed(False, None, f"{res.status}: {res.stderr_tail[-500:]}"), res.duration_s, output
        return grade_fn(task, res.submission_path), res.duration_s, output

    return run


# ------------------------------------------------------------------------------------------------ helpers


def _fmt(v: Any) -> str:
    """Python literal for a hyperparameter value (floats without trailing noise)."""
    if isinstance(v, float):
        return repr(round(v, 6))
    return repr(v)


def _grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    names = list(axes)
    return [dict(zip(names, vals, strict=True)) for vals in itertools.product(*(axes[k] for k in names))]


# ------------------------------------------------------------------------------------------------ pizza

PIZZA = "random-acts-of-pizza"

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
        grid=_grid(C=[0.1, 0.3, 1.0, 3.0], class_weight=[None, "balanced"]),
        ctor="linear_model.LogisticRegression(C={C}, class_weight={class_weight}, max_iter=1000)",
        plan="a logistic regression with C={C} and class_weight={class_weight}",
    ),
    "naive_bayes": dict(
        features=["tfidf", "tfidf+num", "tfidf+num+len"],
        grid=_grid(kind=["MultinomialNB", "ComplementNB"], alpha=[0.1, 0.3, 1.0]),
        ctor="naive_bayes.{kind}(alpha={alpha})",
        plan="a {kind} naive Bayes model with alpha={alpha}",
    ),
    "linear_svm": dict(
        features=_PIZZA_FEATURE_SETS,
        grid=_grid(C=[0.03, 0.1, 0.3, 1.0]),
        ctor="calibration.CalibratedClassifierCV(svm.LinearSVC(C={C}), cv=3)",
        plan="a linear SVM with C={C}, calibrated to probabilities",
    ),
    "random_forest": dict(
        features=_PIZZA_FEATURE_SETS,
        grid=_grid(n_estimators=[100, 200], max_depth=[8, 16, None], min_samples_leaf=[1, 3]),
        ctor="ensemble.RandomForestClassifier(n_estimators={n_estimators}, max_depth={max_depth}, "
        "min_samples_leaf={min_samples_leaf}, random_state=0)",
        plan="a random forest of {n_estimators} trees with max_depth={max_depth} and "
        "min_samples_leaf={min_samples_leaf}",
    ),
    "extra_trees": dict(
        features=_PIZZA_FEATURE_SETS,
        grid=_grid(n_estimators=[100, 200], max_depth=[8, 16, None], min_samples_leaf=[1, 3]),
        ctor="ensemble.ExtraTreesClassifier(n_estimators={n_estimators}, max_depth={max_depth}, "
        "min_samples_leaf={min_samples_leaf}, random_state=0)",
        plan="extra trees, {n_estimators} of them, with max_depth={max_depth} and min_samples_leaf={min_samples_leaf}",
    ),
    "gradient_boosting": dict(
        features=_DENSE,
        grid=_grid(n_estimators=[100, 200], learning_rate=[0.05, 0.1], max_depth=[2, 3]),
        ctor="ensemble.GradientBoostingClassifier(n_estimators={n_estimators}, "
        "learning_rate={learning_rate}, max_depth={max_depth})",
        plan="gradient boosting with {n_estimators} trees of depth {max_depth} and learning rate {learning_rate}",
    ),
    "hist_gradient_boosting": dict(
        features=_DENSE,
        grid=_grid(max_iter=[100, 200], learning_rate=[0.05, 0.1], max_leaf_nodes=[15, 31]),
        ctor="ensemble.HistGradientBoostingClassifier(max_iter={max_iter}, learning_rate={learning_rate}, "
        "max_leaf_nodes={max_leaf_nodes})",
        plan="histogram gradient boosting with {max_iter} iterations, learning rate {learning_rate} and "
        "{max_leaf_nodes} leaves",
    ),
    "xgboost": dict(
        features=_PIZZA_FEATURE_SETS,
        package="xgboost",
        imports="import xgboost",
        grid=_grid(n_estimators=[100, 200], max_depth=[3, 5], learning_rate=[0.05, 0.1]),
        ctor="xgboost.XGBClassifier(n_estimators={n_estimators}, max_depth={max_depth}, "
        "learning_rate={learning_rate}, n_jobs=1)",
        plan="XGBoost with {n_estimators} trees of depth {max_depth} and learning rate {learning_rate}",
    ),
    "lightgbm": dict(
        features=_PIZZA_FEATURE_SETS,
        package="lightgbm",
        imports="import lightgbm",
        grid=_grid(n_estimators=[100, 200], num_leaves=[15, 31], learning_rate=[0.05, 0.1]),
        ctor="lightgbm.LGBMClassifier(n_estimators={n_estimators}, num_leaves={num_leaves}, "
        "learning_rate={learning_rate}, n_jobs=1, verbose=-1)",
        plan="LightGBM with {n_estimators} trees, {num_leaves} leaves and learning rate {learning_rate}",
    ),
}

# TF-IDF settings, crossed with every model on a feature set that has text.
_PIZZA_TFIDF = _grid(max_features=[1000, 3000], ngram_range=[(1, 1), (1, 2)])


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


@register(PIZZA)
def pizza_programs(packages: frozenset[str]) -> list[CorpusItem]:
    """The random-acts-of-pizza grid (binary AUC on requester_received_pizza, id request_id)."""
    items = []
    for family, spec in _PIZZA_MODELS.items():
        if "package" in spec and spec["package"] not in packages:
            continue
        for fs in spec["features"]:
            text_grid = _PIZZA_TFIDF if "tfidf" in fs else [{}]
            for model_hp, text_hp in itertools.product(spec["grid"], text_grid):
                hp = {**model_hp, **text_hp}
                shown = {k: _fmt(v) if isinstance(v, float | str) and k != "kind" else v for k, v in model_hp.items()}
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


# ------------------------------------------------------------------------------------------------ spooky

SPOOKY = "spooky-author-identification"

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
_SPOOKY_VECTORS = _grid(
    kind=["TfidfVectorizer", "CountVectorizer"], ngram_range=[(1, 1), (1, 2)], max_features=[20000, 50000]
)

_SPOOKY_MODELS: dict[str, dict[str, Any]] = {
    "logreg": dict(
        grid=_grid(C=[1.0, 3.0, 10.0]),
        ctor="linear_model.LogisticRegression(C={C}, max_iter=1000)",
        plan="a multinomial logistic regression with C={C}",
    ),
    "naive_bayes": dict(
        grid=_grid(kind=["MultinomialNB", "ComplementNB"], alpha=[0.1, 0.3, 1.0]),
        ctor="naive_bayes.{kind}(alpha={alpha})",
        plan="a {kind} naive Bayes model with alpha={alpha}",
    ),
    "linear_svm": dict(
        grid=_grid(C=[0.1, 0.3, 1.0]),
        ctor="calibration.CalibratedClassifierCV(svm.LinearSVC(C={C}), cv=3)",
        plan="a linear SVM with C={C}, calibrated to probabilities",
    ),
    "sgd": dict(
        grid=_grid(alpha=[1e-5, 3e-5, 1e-4]),
        ctor='linear_model.SGDClassifier(loss="log_loss", alpha={alpha}, max_iter=50, random_state=0)',
        plan="a logistic-loss SGD classifier with alpha={alpha}",
    ),
}


@register(SPOOKY)
def spooky_programs(packages: frozenset[str]) -> list[CorpusItem]:
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
                shown = {k: _fmt(v) if isinstance(v, float) else v for k, v in model_hp.items()}
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
