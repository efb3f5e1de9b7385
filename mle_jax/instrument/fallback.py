"""Deterministic instrumenter: the seven progress prints inserted by reading the program's syntax tree.

Used when the LM's instrumentation is rejected, or instead of it by config. Where each print goes:
- "imported packages": after the last top-level import that precedes the first real work;
- "loaded data": after a statement reading data (pd.read_*, np.load, json.load, open(..) for reading...);
- "defined model": after a model is constructed (sklearn/xgboost/lightgbm/catboost estimators, torch
  nn.Module subclasses, names ending in Classifier/Regressor/Model/Net...);
- "trained model": after .fit(...) on a model, lgb/xgb.train, or a loop that calls backward()/step();
- "training loss:" / "testing loss:": after a metric or loss is computed, on train or held-out data
  (with its value when it was assigned to a name);
- "predicted test labels": after .predict/.predict_proba on test data (or, failing that, just before the
  submission is written).
A statement inside a loop gets its prints after the outermost loop, so nothing prints per batch. Prints
never go after return/raise/break/continue; a function whose return value reads data or builds a model
passes its events to the statements calling it. Class bodies (e.g. nn.Module.forward) are left alone.
The result always passes verify(original, result); when it cannot be produced, the original is returned.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from mle_jax.instrument import pyast
from mle_jax.instrument.verify import verify
from mle_jax.tasks.progress import PROGRESS_PRINTS

IMPORTED, LOADED, DEFINED, TRAIN_LOSS, TRAINED, TEST_LOSS, PREDICTED = PROGRESS_PRINTS
_ORDER = (IMPORTED, LOADED, DEFINED, TRAINED, TRAIN_LOSS, TEST_LOSS, PREDICTED)  # the order stages complete

_READ_CALLS = {
    "read_csv",
    "read_json",
    "read_parquet",
    "read_table",
    "read_excel",
    "read_feather",
    "read_pickle",
    "read_hdf",
    "read_fwf",
    "read_sql",
    "loadtxt",
    "genfromtxt",
    "fromfile",
    "imread",
    "load_img",
    "read_file",
    "load_dataset",
    "load_files",
    "read_image",
    "decode_image",
}
_LOAD_MODULES = {"np", "numpy", "json", "pickle", "joblib", "pd", "pandas"}
_MODEL_NAME = re.compile(
    r"^([A-Z]\w*)?(Classifier|Regressor|Regression|Model|Net|Network|Booster|SVC|SVR|NB|Sequential|Pipeline|"
    r"SearchCV|CV|Forest|Ridge|Lasso|ElasticNet|Neighbors|Perceptron|Boost|Trees|Tree|MLP|LSTM|GRU|"
    r"Transformer|Ensemble)$"
)
_MODEL_FUNCS = {
    "make_pipeline",
    "Pipeline",
    "Sequential",
    "GaussianNB",
    "MultinomialNB",
    "BernoulliNB",
    "ComplementNB",
    "SVC",
    "SVR",
    "LinearSVC",
    "LinearSVR",
    "NuSVC",
    "KMeans",
}
_NOT_MODEL = re.compile(
    r"(Vectorizer|Scaler|Encoder|Imputer|Selector|Split|Fold|Tokenizer|Dataset|"
    r"DataLoader|Loss|Optimizer|Adam|AdamW|SGD|Normalizer|Binarizer)$"
)
_MODEL_VAR = re.compile(
    r"(model|clf|classifier|regressor|reg|estimator|est|pipe|pipeline|grid|search|gbm|"
    r"xgb|lgb|lgbm|cat|rf|lr|svm|svc|knn|nb|net|booster|ensemble|stack|vote)",
    re.I,
)
_FIT_CALLS = {"fit", "fit_generator"}
_PREDICT_CALLS = {"predict", "predict_proba", "predict_log_proba", "decision_function"}
_METRIC_NAME = re.compile(
    r"(_score|_loss|_error|^log_loss|^accuracy|^auc|^pearsonr|^spearmanr|^rmse|^rmsle|^mse|^mae|^qwk|"
    r"^criterion|^loss_fn|^loss_func|^compute_loss|^jaccard|^kappa)$"
)
_HELD_OUT = re.compile(r"(val|valid|test|holdout|dev|oof|eval)", re.I)
_TRAIN = re.compile(r"train", re.I)
_TEST = re.compile(r"test", re.I)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_TERMINAL = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _always_exits(stmt: ast.stmt) -> bool:
    """True when control never reaches the statement after `stmt` (a print there would never run)."""
    if isinstance(stmt, _TERMINAL):
        return True
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return bool(stmt.body) and _always_exits(stmt.body[-1])
    if isinstance(stmt, ast.If):
        both = bool(stmt.body and stmt.orelse)
        return both and _always_exits(stmt.body[-1]) and _always_exits(stmt.orelse[-1])
    return False


def _root(expr: ast.expr) -> str:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else ""


def _walk_no_scopes(node: ast.AST):
    """ast.walk that does not enter nested functions, classes or lambdas."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        for child in ast.iter_child_nodes(cur):
            if not isinstance(child, _SCOPES):
                stack.append(child)


def _header_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """The parts of a statement evaluated by the statement itself (not its nested bodies)."""
    if isinstance(stmt, (ast.If, ast.While)):
        return [stmt.test]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.iter]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return list(stmt.items)
    if isinstance(stmt, (ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    if hasattr(ast, "TryStar") and isinstance(stmt, ast.TryStar):
        return []
    if isinstance(stmt, ast.Match):
        return [stmt.subject]
    return [stmt]


def _names_in(nodes: list[ast.expr]) -> list[str]:
    out = []
    for n in nodes:
        for sub in ast.walk(n):
            if isinstance(sub, ast.Name):
                out.append(sub.id)
            elif isinstance(sub, ast.Attribute):
                out.append(sub.attr)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) < 80:
                out.append(sub.value)
    return out


def _is_open_for_reading(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
    if mode is None:
        return True
    is_text = isinstance(mode, ast.Constant) and isinstance(mode.value, str)
    return is_text and not set(mode.value) & set("wax+")


@dataclass
class _Facts:
    """What the whole program tells about names: model classes, model variables, functions' return events."""

    model_classes: set[str] = field(default_factory=set)
    model_vars: set[str] = field(default_factory=set)
    other_vars: set[str] = field(default_factory=set)
    returns: dict[str, set[str]] = field(default_factory=dict)
    test_predict_exists: bool = False
    last_predict_line: int = -1


class _Instrumenter:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.facts = _Facts()
        self.after: dict[int, tuple[ast.stmt, list[ast.stmt], list[str]]] = {}  # id(stmt) -> prints after
        self.before: dict[int, tuple[ast.stmt, list[ast.stmt], list[str]]] = {}
        self._collect_facts()

    # ---- facts -------------------------------------------------------------------------------------
    def _is_model_ctor(self, call: ast.Call) -> bool:
        name = pyast.call_name(call.func)
        if not name or _NOT_MODEL.search(name):
            return False
        return name in self.facts.model_classes or name in _MODEL_FUNCS or bool(_MODEL_NAME.match(name))

    def _collect_facts(self) -> None:
        f = self.facts
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ClassDef):
                bases = " ".join(ast.unparse(b) for b in node.bases)
                if re.search(r"(Module|Model|Net|Estimator|Classifier|Regressor)", bases):
                    f.model_classes.add(node.name)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
                is_model = self._is_model_ctor(node.value)
                (f.model_vars if is_model else f.other_vars).update(targets)
        predicts = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and pyast.call_name(node.func) in _PREDICT_CALLS:
                predicts.append(node)
                if any(_TEST.search(n) for n in _names_in(node.args)):
                    f.test_predict_exists = True
        if predicts:
            f.last_predict_line = max(p.lineno for p in predicts)
        # functions whose return value carries an event (to a fixpoint: helpers calling helpers)
        funcs = [n for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        changed = True
        while changed:
            changed = False
            for fn in funcs:
                events: set[str] = set()
                for node in _walk_no_scopes(fn):
                    if isinstance(node, ast.Return) and node.value is not None:
                        events |= self._expr_events([node.value], in_training_loop=False)
                events &= {LOADED, DEFINED, TRAINED, PREDICTED}
                if events - f.returns.get(fn.name, set()):
                    f.returns[fn.name] = f.returns.get(fn.name, set()) | events
                    changed = True

    # ---- events of expressions ---------------------------------------------------------------------
    def _is_fit_on_model(self, call: ast.Call) -> bool:
        if not isinstance(call.func, ast.Attribute) or call.func.attr not in _FIT_CALLS:
            return False
        receiver = call.func.value
        if isinstance(receiver, ast.Call):
            return self._is_model_ctor(receiver) or pyast.call_name(receiver.func) in _FIT_CALLS
        root = _root(receiver)
        if root in self.facts.model_vars:
            return True
        return root not in self.facts.other_vars and bool(_MODEL_VAR.search(root))

    def _metric_event(self, call: ast.Call, in_training_loop: bool) -> str | None:
        name = pyast.call_name(call.func)
        is_metric = bool(_METRIC_NAME.search(name)) and name not in ("cross_val_predict",)
        if name == "score" and isinstance(call.func, ast.Attribute):
            is_metric = True
        if not is_metric or name in _PREDICT_CALLS:
            return None
        if name in ("cross_val_score", "cross_validate"):
            return TEST_LOSS
        names = _names_in(call.args + [k.value for k in call.keywords])
        if any(_HELD_OUT.search(n) for n in names):
            return TEST_LOSS
        if any(_TRAIN.search(n) for n in names) or in_training_loop:
            return TRAIN_LOSS
        return TEST_LOSS

    def _expr_events(self, nodes: list[ast.AST], in_training_loop: bool) -> set[str]:
        f = self.facts
        events: set[str] = set()
        for top in nodes:
            for node in _walk_no_scopes(top):
                if not isinstance(node, ast.Call):
                    continue
                name = pyast.call_name(node.func)
                root = _root(node.func.value) if isinstance(node.func, ast.Attribute) else ""
                if name in _READ_CALLS or (name == "load" and root in _LOAD_MODULES):
                    events.add(LOADED)
                elif name == "open" and (isinstance(node.func, ast.Name) or root == "Image"):
                    if root == "Image" or _is_open_for_reading(node):
                        events.add(LOADED)
                if self._is_model_ctor(node):
                    events.add(DEFINED)
                if name == "train" and root in ("lgb", "lightgbm", "xgb", "xgboost", "cb", "catboost"):
                    events |= {DEFINED, TRAINED}
                if self._is_fit_on_model(node):
                    events.add(TRAINED)
                if name == "train" and "trainer" in root.lower():
                    events.add(TRAINED)
                if name in _PREDICT_CALLS:
                    test_arg = any(_TEST.search(n) for n in _names_in(node.args))
                    if test_arg or (not f.test_predict_exists and node.lineno == f.last_predict_line):
                        events.add(PREDICTED)
                if isinstance(node.func, ast.Name) and name in f.model_vars:
                    if any(_TEST.search(n) for n in _names_in(node.args)):
                        events.add(PREDICTED)
                metric = self._metric_event(node, in_training_loop)
                if metric:
                    events.add(metric)
                if isinstance(node.func, ast.Name) and name in f.returns:
                    events |= f.returns[name]
        return events

    # ---- placement ---------------------------------------------------------------------------------
    def _add(self, where: dict, stmt: ast.stmt, body: list[ast.stmt], prints: list[str]) -> None:
        if not prints:
            return
        _, _, existing = where.setdefault(id(stmt), (stmt, body, []))
        for p in prints:
            if p not in existing:
                existing.append(p)

    def _loss_print(self, stmt: ast.stmt, event: str) -> str:
        """The print statement's source: with the value when the statement assigned the metric to a name."""
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            return f"print({event!r}, {stmt.targets[0].id})".replace("'", '"')
        return f'print("{event}")'

    def _prints_for(self, stmt: ast.stmt | None, events: set[str]) -> list[str]:
        out = []
        for p in _ORDER:
            if p == IMPORTED or p not in events:
                continue
            out.append(
                self._loss_print(stmt, p) if p in (TRAIN_LOSS, TEST_LOSS) and stmt is not None else f'print("{p}")'
            )
        return out

    def _loop_events(self, loop: ast.stmt) -> set[str]:
        calls = [n for n in _walk_no_scopes(loop) if isinstance(n, ast.Call)]
        training = any(pyast.call_name(c.func) == "backward" for c in calls) or any(
            pyast.call_name(c.func) == "step"
            and re.search(r"optim|opt\b|opt_", _root(c.func.value) if isinstance(c.func, ast.Attribute) else "")
            for c in calls
        )
        events = self._expr_events([loop], in_training_loop=training)
        if training:
            events.add(TRAINED)
        return events

    def place(self, body: list[ast.stmt], top_level: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ClassDef):
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.place(stmt.body, top_level=False)
                continue
            if isinstance(stmt, _LOOPS):
                self._add(self.after, stmt, body, self._prints_for(None, self._loop_events(stmt)))
                continue
            if isinstance(stmt, _TERMINAL):
                continue
            if not _always_exits(stmt):
                events = self._expr_events(_header_nodes(stmt), in_training_loop=False)
                self._add(self.after, stmt, body, self._prints_for(stmt, events))
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    self.place(inner, top_level=False)
            for handler in getattr(stmt, "handlers", []):
                self.place(handler.body, top_level=False)
            for case in getattr(stmt, "cases", []):
                self.place(case.body, top_level=False)

    def merge_runs(self) -> None:
        """`a = read(); b = read()` gets one "loaded data", after b: drop prints the next statement repeats"""
        for key, (stmt, body, prints) in list(self.after.items()):
            idx = next(i for i, x in enumerate(body) if x is stmt)
            nxt = self.after.get(id(body[idx + 1])) if idx + 1 < len(body) else None
            if nxt is not None and set(prints) <= set(nxt[2]):
                del self.after[key]

    def place_imports(self) -> None:
        body = self.tree.body

        def is_import(s: ast.stmt) -> bool:
            if isinstance(s, (ast.Import, ast.ImportFrom)):
                return True
            return isinstance(s, ast.Try) and all(isinstance(x, (ast.Import, ast.ImportFrom)) for x in s.body)

        last = None
        for s in body:
            if is_import(s):
                last = s
            elif not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                self._expr_events(_header_nodes(s) if not isinstance(s, _LOOPS) else [s], False) or id(s) in self.after
            ):
                break
        if last is not None:
            self.after.setdefault(id(last), (last, body, []))[2].insert(0, f'print("{IMPORTED}")')
            return
        for node in ast.walk(self.tree):  # imports only inside functions: after the first import run there
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(node, name, None)
                if isinstance(inner, list):
                    runs = [s for s in inner if isinstance(s, ast.stmt)]
                    for i, s in enumerate(runs):
                        if is_import(s) and (i + 1 == len(runs) or not is_import(runs[i + 1])):
                            self.after.setdefault(id(s), (s, inner, []))[2].insert(0, f'print("{IMPORTED}")')
                            return
        # no import at all: nothing to wait for
        first = body[0] if body else None
        skip = first is not None and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        anchor = body[0] if skip else None
        if anchor is not None:
            self.after.setdefault(id(anchor), (anchor, body, []))[2].insert(0, f'print("{IMPORTED}")')
        elif body:
            self.before.setdefault(id(body[0]), (body[0], body, []))[2].insert(0, f'print("{IMPORTED}")')

    def place_predict_fallback(self) -> None:
        """No prediction found: say so just before the submission is written."""
        if any(f'"{PREDICTED}"' in p for _, _, prints in self.after.values() for p in prints):
            return

        def writes_submission(nodes: list[ast.AST]) -> bool:
            for top in nodes:
                for node in _walk_no_scopes(top):
                    if isinstance(node, ast.Call) and pyast.call_name(node.func) in ("to_csv", "savetxt", "open"):
                        args = node.args + [k.value for k in node.keywords]
                        if any("submission" in n for n in _names_in(args)) and not (
                            pyast.call_name(node.func) == "open" and _is_open_for_reading(node)
                        ):
                            return True
            return False

        def visit(body: list[ast.stmt]) -> bool:
            for stmt in body:
                if isinstance(stmt, ast.ClassDef):
                    continue
                inner_bodies = [getattr(stmt, n, None) for n in ("body", "orelse", "finalbody")]
                inner_bodies = [b for b in inner_bodies if isinstance(b, list) and b]
                simple = isinstance(stmt, _LOOPS) or not inner_bodies
                if writes_submission([stmt] if simple else _header_nodes(stmt)):
                    self._add(self.before, stmt, body, [f'print("{PREDICTED}")'])
                    return True
                if not simple and any(visit(b) for b in inner_bodies):
                    return True
            return False

        visit(self.tree.body)


# ---- rendering -------------------------------------------------------------------------------------
def _render_text(code: str, inst: _Instrumenter) -> str | None:
    """Insert print lines into the source text (comments and layout kept); None when a statement does not
    start its own line (e.g. `if x: y = 1`), where text insertion is unsafe."""
    lines = code.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    inserts: dict[int, list[str]] = {}  # line index -> lines inserted before it

    def indent_of(stmt: ast.stmt) -> str | None:
        line = lines[stmt.lineno - 1]
        ws = line[: len(line) - len(line.lstrip())]
        return ws if len(ws.expandtabs()) == stmt.col_offset or len(ws) == stmt.col_offset else None

    for stmt, body, prints in inst.after.values():
        ws = indent_of(stmt)
        idx = next(i for i, s in enumerate(body) if s is stmt)
        if ws is None or (idx + 1 < len(body) and body[idx + 1].lineno <= stmt.end_lineno):
            return None
        inserts.setdefault(stmt.end_lineno, []).extend(ws + p + "\n" for p in prints)
    for stmt, _body, prints in inst.before.values():
        ws = indent_of(stmt)
        if ws is None:
            return None
        inserts.setdefault(stmt.lineno - 1, []).extend(ws + p + "\n" for p in prints)
    out = []
    for i, line in enumerate(lines):
        out.extend(inserts.get(i, []))
        out.append(line)
    out.extend(inserts.get(len(lines), []))
    return "".join(out)


def _render_unparse(inst: _Instrumenter) -> str:
    """Insert print statements into the tree and unparse it (layout and comments are lost)."""
    for where, offset in ((inst.after, 1), (inst.before, 0)):
        for stmt, body, prints in where.values():
            idx = next(i for i, s in enumerate(body) if s is stmt)
            body[idx + offset : idx + offset] = [pyast.parse(p).body[0] for p in prints]
    return ast.unparse(ast.fix_missing_locations(inst.tree))


def ast_instrument(code: str) -> str:
    """`code` with the seven progress prints inserted where their stages complete; `code` unchanged when it
    does not parse (nothing could run anyway) or when no safe insertion exists."""
    try:
        tree = pyast.parse(code)
    except SyntaxError:
        return code
    inst = _Instrumenter(tree)
    inst.place(tree.body, top_level=True)
    inst.merge_runs()
    inst.place_imports()
    inst.place_predict_fallback()
    text = _render_text(code, inst)
    if text is not None and verify(code, text).ok:
        return text
    try:
        unparsed = _render_unparse(inst)
    except (ValueError, SyntaxError, StopIteration):
        return code
    return unparsed if verify(code, unparsed).ok else code
