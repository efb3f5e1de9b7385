"""Realistic faults injected into verified corpus programs, and the real runs of the faulty programs.

A tiny model trained from scratch has never seen an error message, so a multi-turn agent built on it cannot answer
one. The warm start teaches it (warmstart/debug.py): a corpus program with one injected fault is run in the sandbox,
and turn 2, shown that run's real output, is taught to answer with the original program. The faults are what a
code model gets wrong (kind: what it changes):

- "column": a DataFrame column read under a misspelt name (`train["auhtor"]`): KeyError.
- "import": a used name whose import is left out (`log_loss` never imported): NameError.
- "path": a data file read from the wrong place (Kaggle's `../input/`, a wrong file name): FileNotFoundError.
- "api": a scikit-learn name that does not exist in the sandbox's scikit-learn (`LogisticRegressionClassifier`,
  `sklearn.cross_validation`, `predict_probabilities`): AttributeError / ImportError.
- "shape": rows that do not line up (the full feature matrix fitted against the training split's labels, or
  predictions of the validation rows written as the test's): a ValueError, or a submission of the wrong length.

`inject(code, kind, seed)` is a pure function of its arguments: it edits the program's text at the node the seed
picks (every other character unchanged) and returns None when the program has no site for that kind. Only faulty
programs that really fail in the sandbox become examples (`FaultyRun.fails`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mle_jax.env.observation import Observation, observe_run
from mle_jax.env.rollout import previous_output
from mle_jax.executor.grading import grade_run
from mle_jax.instrument import instrument_batch, pyast
from mle_jax.instrument.tagging import strip_agent_progress
from mle_jax.warmstart.corpus import CorpusItem, parallel_runs

FAULT_KINDS = ("column", "import", "path", "api", "shape")

# scikit-learn names of the corpus programs -> a name a code model plausibly writes instead, which no scikit-learn
# module has (tests/warmstart/test_faults.py checks that against the installed scikit-learn)
WRONG_NAMES = {
    "LogisticRegression": "LogisticRegressionClassifier",
    "MultinomialNB": "MultinomialNaiveBayes",
    "ComplementNB": "ComplementNaiveBayes",
    "GaussianNB": "GaussianNaiveBayes",
    "LinearSVC": "LinearSVMClassifier",
    "SVC": "SVMClassifier",
    "SVR": "SVMRegressor",
    "SGDClassifier": "StochasticGradientClassifier",
    "RandomForestClassifier": "RandomForestClassifer",
    "RandomForestRegressor": "RandomForestRegresor",
    "ExtraTreesClassifier": "ExtraTreesClassifer",
    "ExtraTreesRegressor": "ExtraTreesRegresor",
    "GradientBoostingClassifier": "GradientBoostedClassifier",
    "GradientBoostingRegressor": "GradientBoostedRegressor",
    "HistGradientBoostingClassifier": "HistogramGradientBoostingClassifier",
    "HistGradientBoostingRegressor": "HistogramGradientBoostingRegressor",
    "KNeighborsClassifier": "KNearestNeighborsClassifier",
    "KNeighborsRegressor": "KNearestNeighborsRegressor",
    "LinearDiscriminantAnalysis": "LinearDiscriminantClassifier",
    "MLPClassifier": "MultiLayerPerceptronClassifier",
    "Ridge": "RidgeRegression",
    "CalibratedClassifierCV": "CalibratedClassifier",
    "TfidfVectorizer": "TFIDFVectorizer",
    "CountVectorizer": "CountVectoriser",
    "FeatureHasher": "FeatureHashing",
    "StandardScaler": "StandardScalar",
    "make_pipeline": "build_pipeline",
    "roc_auc_score": "auc_roc_score",
    "log_loss": "logloss",
}
# estimator methods -> what a model writes instead (no estimator has it)
WRONG_METHODS = {"predict_proba": "predict_probabilities", "transform": "transform_text"}
# a module path of old scikit-learn (removed in 0.20) that a model trained on old code still imports from
OLD_MODULES = {"sklearn.model_selection": "sklearn.cross_validation"}


@dataclass(frozen=True)
class Fault:
    """A faulty version of a program: its kind (FAULT_KINDS), the whole faulty program, and one line saying what
    changed (for people: never shown to the agent)."""

    kind: str
    code: str
    what: str


# ------------------------------------------------------------------------------------------------ text edits


def _offsets(code: str) -> list[int]:
    """Character offset of the start of each line (1-based line numbers index it from 1)."""
    starts, total = [0, 0], 0
    for line in code.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _pos(code: str, starts: list[int], lineno: int, col_bytes: int) -> int:
    line_start = starts[lineno]
    line = code[line_start : starts[lineno + 1] if lineno + 1 < len(starts) else len(code)]
    return line_start + len(line.encode()[:col_bytes].decode(errors="ignore"))  # AST columns count UTF-8 bytes


def _span(code: str, node: ast.AST) -> tuple[int, int]:
    starts = _offsets(code)
    return _pos(code, starts, node.lineno, node.col_offset), _pos(code, starts, node.end_lineno, node.end_col_offset)


def _edit(code: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """`code` with each (start, end, text) span replaced (spans must not overlap)."""
    for start, end, text in sorted(edits, reverse=True):
        code = code[:start] + text + code[end:]
    return code


def _replace(code: str, node: ast.AST, text: str) -> str:
    start, end = _span(code, node)
    return _edit(code, [(start, end, text)])


def _walk(tree: ast.AST) -> list[ast.AST]:
    """The nodes in source order (ast.walk is breadth-first)."""
    nodes = [n for n in ast.walk(tree) if hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset, -n.end_lineno, -n.end_col_offset))


def _loaded_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


# ------------------------------------------------------------------------------------------------ the faults


def misspell(word: str, rng: random.Random) -> str:
    """A misspelling of `word` (!= word): two neighbouring letters swapped, a letter dropped or doubled, or the
    first letter's case flipped, picked by rng among those that change it."""
    options = []
    for i in range(len(word) - 1):
        if word[i].isalpha() and word[i + 1].isalpha() and word[i] != word[i + 1]:
            options.append(word[:i] + word[i + 1] + word[i] + word[i + 2 :])
    if len(word) > 3:
        options += [word[:i] + word[i + 1 :] for i in range(1, len(word) - 1) if word[i].isalpha()]
    options += [word[:i] + word[i] + word[i:] for i in range(1, len(word)) if word[i].isalpha()]
    if word[:1].isalpha():
        options.append(word[0].swapcase() + word[1:])
    options = sorted({o for o in options if o != word})
    return rng.choice(options) if options else word + "s"


def _frame_names(tree: ast.Module) -> set[str]:
    """Names bound to DataFrames, as far as the syntax tells: assigned from a `read_*` call (chains included),
    functions' `df` parameters, and the splits of such a name by `train_test_split`."""
    names = {"df"}
    for node in _walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            calls = {pyast.call_name(c.func) for c in ast.walk(node.value) if isinstance(c, ast.Call)}
            first = node.value.args[0] if node.value.args else None
            from_frame = isinstance(first, ast.Name) and first.id in names
            if any(c.startswith("read_") for c in calls) or ("train_test_split" in calls and from_frame):
                for target in node.targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    names |= {e.id for e in elts if isinstance(e, ast.Name)}
    return names


def misspelt_column(code: str, rng: random.Random) -> Fault | None:
    """A column read from a DataFrame (`frame["name"]`, loaded) under a misspelt name."""
    tree = pyast.parse(code)
    frames = _frame_names(tree)
    sites = [
        n
        for n in _walk(tree)
        if isinstance(n, ast.Subscript)
        and isinstance(n.ctx, ast.Load)
        and isinstance(n.value, ast.Name)
        and n.value.id in frames
        and isinstance(n.slice, ast.Constant)
        and isinstance(n.slice.value, str)
    ]
    if not sites:
        return None
    site = rng.choice(sites)
    old = site.slice.value
    new = misspell(old, rng)
    return Fault("column", _replace(code, site.slice, json.dumps(new)), f'{site.value.id}["{old}"] -> "{new}"')


def _bound(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _import_text(node: ast.Import | ast.ImportFrom, aliases: Sequence[ast.alias]) -> str:
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    if isinstance(node, ast.Import):
        return f"import {names}"
    return f"from {'.' * node.level}{node.module or ''} import {names}"


def missing_import(code: str, rng: random.Random) -> Fault | None:
    """One used name's import left out: its alias dropped from its import statement, or the whole statement (and
    its line) when it imports only that name."""
    tree = pyast.parse(code)
    used = _loaded_names(tree)
    sites = [
        (node, alias)
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "module", "") != "__future__"
        for alias in node.names
        if _bound(alias) in used and alias.name != "*"
    ]
    if not sites:
        return None
    node, alias = rng.choice(sites)
    rest = [a for a in node.names if a is not alias]
    start, end = _span(code, node)
    if rest:
        faulty = _edit(code, [(start, end, _import_text(node, rest))])
    else:
        end += 1 if code[end : end + 1] == "\n" else 0
        faulty = _edit(code, [(start, end, "")])
    return Fault("import", faulty, f"no import of {_bound(alias)}")


def _data_paths(tree: ast.Module) -> list[ast.Constant]:
    return [
        n
        for n in _walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.match(r"^/workdir/.+/public/\S+$", n.value)
    ]


def wrong_path(path: str, rng: random.Random) -> str:
    """A wrong version of a data file's path under the sandbox's public folder: Kaggle's `../input/`, the working
    directory, the folder without `prepared/`, or a wrong file name or extension."""
    folder, name = path.rsplit("/", 1)
    stem, dot, ext = name.rpartition(".")
    options = [f"../input/{name}", f"./{name}", f"data/{name}"]
    if "/prepared/public" in folder:
        options.append(folder.replace("/prepared/public", "/public") + "/" + name)
    if dot:
        options.append(f"{folder}/{stem}ing.{ext}" if stem in ("train", "test") else f"{folder}/{stem}s.{ext}")
        options.append(f"{folder}/{stem}.{'json' if ext == 'csv' else 'csv'}")
    return rng.choice(options)


def wrong_data_path(code: str, rng: random.Random) -> Fault | None:
    """A data file read from the wrong path."""
    sites = _data_paths(pyast.parse(code))
    if not sites:
        return None
    site = rng.choice(sites)
    new = wrong_path(site.value, rng)
    return Fault("path", _replace(code, site, json.dumps(new)), f"{site.value} -> {new}")


def _sklearn_modules(tree: ast.Module) -> dict[str, str]:
    """Names bound to scikit-learn modules by `from sklearn import a, b` -> their module path."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "sklearn":
            out |= {_bound(a): f"sklearn.{a.name}" for a in node.names}
    return out


def missing_api(code: str, rng: random.Random) -> Fault | None:
    """A scikit-learn name the sandbox's scikit-learn does not have, written where the program has a real one: a
    module attribute it calls (`linear_model.LogisticRegressionClassifier(`), a name it imports from a module (renamed
    at the import and at every use), an old module path (`sklearn.cross_validation`), or an estimator method
    (`.predict_probabilities(`)."""
    tree = pyast.parse(code)
    modules = _sklearn_modules(tree)
    sites: list[tuple[str, Any]] = []
    for node in _walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in modules and node.func.attr in WRONG_NAMES:
                sites.append(("attribute", node.func))
            elif node.func.attr in WRONG_METHODS and not (isinstance(owner, ast.Name) and owner.id in modules):
                sites.append(("method", node.func))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sklearn."):
            sites += [("name", (node, a)) for a in node.names if a.name in WRONG_NAMES and not a.asname]
            if node.module in OLD_MODULES:
                sites.append(("module", node))
    if not sites:
        return None
    how, site = rng.choice(sites)
    if how in ("attribute", "method"):
        table = WRONG_NAMES if how == "attribute" else WRONG_METHODS
        start, end = _span(code, site)
        new = table[site.attr]
        head = code[start:end].rsplit(site.attr, 1)[0]
        return Fault("api", _edit(code, [(start, end, head + new)]), f".{site.attr} -> .{new}")
    if how == "module":
        new = OLD_MODULES[site.module]
        return Fault(
            "api",
            _replace(code, site, _import_text(site, site.names).replace(site.module, new, 1)),
            f"{site.module} -> {new}",
        )
    node, alias = site
    new = WRONG_NAMES[alias.name]
    renamed = [ast.alias(new) if a is alias else a for a in node.names]
    edits = [(*_span(code, node), _import_text(node, renamed))]
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == alias.name]
    edits += [(*_span(code, n), new) for n in uses]
    return Fault("api", _edit(code, edits), f"{alias.name} -> {new}")


def _splits(tree: ast.Module) -> dict[str, ast.expr]:
    """`A_tr` -> the expression split, for each `A_tr, A_va, ... = train_test_split(A, ...)`."""
    out = {}
    for node in _walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and pyast.call_name(node.value.func) == "train_test_split"
            and isinstance(node.targets[0], ast.Tuple)
            and len(node.targets[0].elts) >= 4
            and node.value.args
        ):
            first = node.targets[0].elts[0]
            if isinstance(first, ast.Name):
                out[first.id] = node.value.args[0]
    return out


_VALIDATION_OF = {"X_test": "X_va", "test": "va"}


def shape_mismatch(code: str, rng: random.Random) -> Fault | None:
    """Rows that do not line up: a model fitted on the whole feature matrix against the training split's labels
    (`model.fit(X, y_tr)`), or the test predictions made on the validation rows (`model.predict_proba(X_va)` where
    the submission wants X_test's)."""
    tree = pyast.parse(code)
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    splits = _splits(tree)
    sites: list[tuple[str, Any]] = []
    for node in _walk(tree):
        if isinstance(node, ast.Call) and pyast.call_name(node.func) == "fit" and len(node.args) == 2:
            x = node.args[0]
            if isinstance(x, ast.Name) and x.id in splits:
                sites.append(("fit", node))
    preds = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign | ast.For)
        for a in ast.walk(n)
        if isinstance(a, ast.Assign)
        and any(isinstance(t, ast.Name | ast.Subscript) and _target_name(t) == "pred" for t in a.targets)
    ]
    for node in preds[-1:]:
        last = [
            a for a in ast.walk(node) if isinstance(a, ast.Assign) and any(_target_name(t) == "pred" for t in a.targets)
        ][-1]
        names = [n for n in ast.walk(last.value) if isinstance(n, ast.Name) and _VALIDATION_OF.get(n.id) in assigned]
        if names:
            sites.append(("predict", names))
    if not sites:
        return None
    how, site = rng.choice(sites)
    if how == "fit":
        x = site.args[0]
        whole = ast.get_source_segment(code, splits[x.id]) or ast.unparse(splits[x.id])
        return Fault("shape", _replace(code, x, whole), f"fit({x.id}, ...) -> fit({whole}, ...)")
    edits = [(*_span(code, n), _VALIDATION_OF[n.id]) for n in site]
    return Fault("shape", _edit(code, edits), f"predictions of {site[0].id} -> {_VALIDATION_OF[site[0].id]}")


def _target_name(target: ast.expr) -> str:
    if isinstance(target, ast.Subscript):
        target = target.value
    return target.id if isinstance(target, ast.Name) else ""


_INJECTORS: dict[str, Callable[[str, random.Random], Fault | None]] = {
    "column": misspelt_column,
    "import": missing_import,
    "path": wrong_data_path,
    "api": missing_api,
    "shape": shape_mismatch,
}


def inject(code: str, kind: str, seed: int) -> Fault | None:
    """`code` with one fault of `kind` at the site `seed` picks (deterministic); None when it has no such site."""
    if kind not in _INJECTORS:
        raise ValueError(f"fault kind must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
    fault = _INJECTORS[kind](code, random.Random(f"{kind}:{seed}"))
    if fault is None or fault.code == code:
        return None
    pyast.parse(fault.code)  # an injected fault is a runtime fault, never a syntax error
    return fault


def plan_faults(items: Sequence[CorpusItem], n: int, seed: int) -> list[tuple[CorpusItem, Fault]]:
    """n (program, fault) pairs of distinct faulty programs, deterministic given seed: programs go round `items`
    (reshuffled each round) and kinds round FAULT_KINDS (a program without a site for its kind gets the next kind
    that has one). Fewer than n when the items have fewer distinct faults."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    out: list[tuple[CorpusItem, Fault]] = []
    seen: set[str] = set()
    order: list[CorpusItem] = []
    attempts = 0
    while len(out) < n and items and attempts < 20 * n + 20:
        if not order:
            order = list(items)
            rng.shuffle(order)
        item = order.pop()
        attempts += 1
        first = attempts % len(FAULT_KINDS)
        for k in range(len(FAULT_KINDS)):
            kind = FAULT_KINDS[(first + k) % len(FAULT_KINDS)]
            fault = inject(item.code, kind, rng.randrange(2**31))
            if fault is not None and fault.code not in seen:
                seen.add(fault.code)
                out.append((item, fault))
                break
    return out


# ------------------------------------------------------------------------------------------------ running them


@dataclass(frozen=True)
class ObservedRun:
    """One program's run as an episode's agent and the reward see it: the observation (env/observation.observe,
    with MLE-bench's format check), the output an improve prompt shows (rollout.previous_output), whether the
    grader found a valid submission, its score, and the run's time."""

    observation: Observation
    output: str
    valid: bool
    score: float | None
    duration_s: float

    @property
    def fails(self) -> bool:
        """Exited non-zero (or was stopped), or wrote no submission of the right format."""
        return self.observation.status != "ok" or not self.observation.submission_ok

    def record(self) -> dict:
        return {**asdict(self), "observation": asdict(self.observation)}

    @classmethod
    def from_record(cls, rec: dict) -> ObservedRun:
        return cls(**{**rec, "observation": Observation(**rec["observation"])})


ObserveFn = Callable[[str], ObservedRun]


def sandbox_observe_fn(
    sandbox: Any, task: Any, limits: Any, instrument_mode: str = "ast", output_chars: int = 1500
) -> ObserveFn:
    """An ObserveFn over a real sandbox: the program runs as RL runs it (the agent's own progress prints stripped,
    instrumented with the AST instrumenter, or not at all in mode "off"; the corpus verification's instrumenter,
    `corpus.sandbox_run_fn`), then its submission gets MLE-bench's format check and the task's grade; its results
    folder is removed once read."""
    if instrument_mode not in ("ast", "off"):
        raise ValueError(f"instrument_mode must be 'ast' or 'off' here, got {instrument_mode!r}")

    def run(code: str) -> ObservedRun:
        res = sandbox.run(instrument_batch([strip_agent_progress(code)], instrument_mode)[0].code, task, limits)
        try:
            observation = observe_run(res, None, task)
            graded = grade_run(task, res)
        finally:
            if res.extra.get("results_dir"):
                shutil.rmtree(res.extra["results_dir"], ignore_errors=True)
        score = None if graded.score is None else float(graded.score)
        return ObservedRun(observation, previous_output(res, output_chars), bool(graded.valid), score, res.duration_s)

    return run


@dataclass(frozen=True)
class FaultyRun:
    """A corpus program with an injected fault, and the real run of the faulty program."""

    source: CorpusItem
    fault: Fault
    run: ObservedRun

    def response(self) -> str:
        """The faulty program as the agent's turn-1 response: the source's plan, then the faulty code."""
        return CorpusItem(self.source.plan, self.fault.code, self.source.meta).response()


def _sha(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def run_faults(
    planned: Sequence[tuple[CorpusItem, Fault]],
    observe_fn: ObserveFn,
    cache_path: Path,
    workers: int = 1,
    progress: bool = True,
    label: str = "faulty programs",
) -> list[FaultyRun]:
    """Runs each faulty program (`observe_fn`) and returns those that fail (`ObservedRun.fails`), in input order.

    Runs are cached in `cache_path` (JSONL by the faulty code's sha256, written as each ends): a resumed warm start
    runs no faulty program twice."""
    seen: dict[str, ObservedRun] = {}
    if cache_path.is_file():
        for line in cache_path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                seen[rec["sha256"]] = ObservedRun.from_record(rec["run"])
    todo = list({_sha(f.code): f.code for _, f in planned if _sha(f.code) not in seen}.values())
    if todo:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        with cache_path.open("a") as f:

            def record(code: str, run: ObservedRun) -> None:
                seen[_sha(code)] = run
                f.write(json.dumps({"sha256": _sha(code), "run": run.record()}) + "\n")
                f.flush()

            parallel_runs(todo, observe_fn, workers, progress, label, on_result=record)
    out = [FaultyRun(item, fault, seen[_sha(fault.code)]) for item, fault in planned]
    return [r for r in out if r.run.fails]
