"""MLE-bench validity rules per metric family, on generated answers shaped like each task's, and the garbage
list: a grader never raises for a bad submission."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr
from sklearn.metrics import accuracy_score, cohen_kappa_score, log_loss, roc_auc_score

from mle_jax.tasks.graders import GradeResult, InvalidSubmission, grade, grade_csv, grade_frames
from mle_jax.tasks.graders.reading import read_submission
from mle_jax.tasks.registry import all_specs, get_spec
from mle_jax.tasks.task import TaskSpec
from tests.tasks.generated import make_answers, make_submission


def reference_score(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """The score computed the way MLE-bench's grade.py does, with sklearn/scipy."""
    merged = answers.merge(sub, on=spec.id_column, suffixes=("_true", ""))
    cols = list(spec.target_columns)
    true = merged[[f"{c}_true" for c in cols]].to_numpy()
    pred = merged[cols].to_numpy()
    if spec.metric == "auc":
        return roc_auc_score(true[:, 0], pred[:, 0])
    if spec.metric == "mean_column_auc":
        return float(np.mean([roc_auc_score(true[:, j], pred[:, j]) for j in range(len(cols))]))
    if spec.metric == "log_loss":
        return log_loss(true, pred)
    if spec.metric == "qwk":
        return cohen_kappa_score(pred[:, 0], true[:, 0], weights="quadratic")
    if spec.metric == "accuracy":
        return accuracy_score(true[:, 0], pred[:, 0])
    if spec.metric == "pearson":
        return pearsonr(true[:, 0].astype(float), pred[:, 0].astype(float))[0]
    if spec.metric == "mean_column_rmsle":
        from sklearn.metrics import root_mean_squared_log_error

        return float(np.mean([root_mean_squared_log_error(true[:, j], pred[:, j]) for j in range(len(cols))]))
    if spec.metric == "jaccard":

        def jac(a, b):
            sa, sb = set(a.lower().split()), set(b.lower().split())
            return len(sa & sb) / len(sa | sb)

        return float(np.mean([jac(p, t) for p, t in zip(pred[:, 0], true[:, 0], strict=True)]))
    raise AssertionError(spec.metric)


SPECS = list(all_specs())
IDS = [s.id for s in SPECS]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_valid_submission_scores_like_mle_bench(spec):
    rng = np.random.default_rng(0)
    answers = make_answers(spec, rng)
    sub = make_submission(spec, answers, rng)
    result = grade_frames(spec, sub, answers)
    assert result.valid, result.reason
    assert result.score == pytest.approx(reference_score(spec, sub, answers), abs=1e-5)


def _invalid(spec, sub, answers, match):
    result = grade_frames(spec, sub, answers)
    assert not result.valid and result.score is None, result
    assert match in result.reason, result.reason


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_rejected_structure(spec):
    rng = np.random.default_rng(1)
    answers = make_answers(spec, rng)
    sub = make_submission(spec, answers, rng)
    target = spec.target_columns[0]
    _invalid(spec, sub.drop(columns=[target]), answers, "missing column")
    _invalid(spec, sub.drop(columns=[spec.id_column]), answers, "missing column")
    _invalid(spec, sub.iloc[:-1], answers, "rows")
    _invalid(spec, pd.concat([sub, sub.iloc[:1]]), answers, "rows")
    wrong_id = sub.copy()
    first_id = answers[spec.id_column].iloc[0]
    wrong_id.loc[0, spec.id_column] = first_id * 2 if spec.id_column == "id" else "nope"
    _invalid(spec, wrong_id, answers, "do not match")
    duplicated = sub.copy()
    duplicated.loc[0, spec.id_column] = duplicated.loc[1, spec.id_column]
    _invalid(spec, duplicated, answers, "duplicated")
    extra = sub.assign(note="x")
    assert grade_frames(spec, extra, answers).valid is (not spec.exact_columns)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.metric != "jaccard"], ids=lambda s: s.id)
def test_rejected_values(spec):
    rng = np.random.default_rng(2)
    answers = make_answers(spec, rng)
    sub = make_submission(spec, answers, rng)
    target = spec.target_columns[0]
    for bad, why in ((np.nan, "NaN"), (np.inf, "inf"), ("high", "numeric")):
        broken = sub.copy().astype({target: object})
        broken.loc[3, target] = bad
        _invalid(spec, broken, answers, why)


@pytest.mark.parametrize("task_id", ["random-acts-of-pizza", "tabular-playground-series-may-2022"])
def test_auc_needs_probabilities(task_id):
    spec = get_spec(task_id)
    rng = np.random.default_rng(3)
    answers = make_answers(spec, rng)
    sub = make_submission(spec, answers, rng)
    sub.loc[0, spec.target_columns[0]] = 1.5
    _invalid(spec, sub, answers, "[0, 1]")


LOG_LOSS_TASKS = ["leaf-classification", "spooky-author-identification", "lmsys-chatbot-arena"]


@pytest.mark.parametrize("task_id", LOG_LOSS_TASKS)
def test_log_loss_rows_must_be_probabilities(task_id):
    spec = get_spec(task_id)
    rng = np.random.default_rng(4)
    answers = make_answers(spec, rng)
    sub = make_submission(spec, answers, rng)
    cols = list(spec.target_columns)
    logits = sub.copy()
    logits[cols] = rng.normal(size=(len(sub), len(cols)))  # no softmax is applied for the agent
    _invalid(spec, logits, answers, "sum to 1")
    off = sub.copy()
    off.loc[0, cols[0]] += 2e-5
    _invalid(spec, off, answers, "sum to 1")
    close = sub.copy()
    close.loc[0, cols[0]] += 4e-7
    assert grade_frames(spec, close, answers).valid
    # MLE-bench's own checks: np.isclose(sum, 1, atol=1e-6) for leaf and spooky (numpy's rtol adds 1e-5),
    # round(sum, 6) == 1 for lmsys
    nearly = sub.copy()
    nearly.loc[0, cols[0]] += 5e-6
    assert grade_frames(spec, nearly, answers).valid is (spec.row_sum_rule == "isclose")
    negative = sub.copy()
    negative.loc[0, cols] = 0.0
    negative.loc[0, cols[0]], negative.loc[0, cols[1]] = 1.5, -0.5
    _invalid(spec, negative, answers, "[0, 1]")
    confident = sub.copy()  # hard 0/1 predictions stay finite: clipped like sklearn
    confident[cols] = np.eye(len(cols))[np.zeros(len(sub), dtype=int)]
    result = grade_frames(spec, confident, answers)
    assert result.valid and np.isfinite(result.score) and result.score > 1.0


def test_constant_predictions_where_the_metric_is_undefined():
    spec = get_spec("us-patent-phrase-to-phrase-matching")
    answers = make_answers(spec, np.random.default_rng(5))
    sub = answers.assign(score=0.0)
    _invalid(spec, sub, answers, "undefined")


def test_numeric_ids_compare_as_numbers():
    spec = get_spec("tabular-playground-series-dec-2021")
    answers = make_answers(spec, np.random.default_rng(6)).rename(columns={"row": "Id"})
    sub = answers.copy()
    sub["Id"] = sub["Id"].astype(str)  # text ids that equal the answers' text
    assert grade_frames(spec, sub, answers) == GradeResult(True, 1.0, "")


# ---- garbage files -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pizza(prepared):
    return prepared["random-acts-of-pizza"]


def _grade_bytes(task, tmp_path, data: bytes, name: str = "submission.csv") -> GradeResult:
    path = tmp_path / name
    path.write_bytes(data)
    return grade(task, path)


@pytest.mark.parametrize(
    "data, why",
    [
        (b"", "empty"),
        (b"  \n\n", "empty"),
        (bytes(range(256)) * 4, "binary"),
        ("request_id,requester_received_pizza\nt3_é,0.5\n".encode("latin-1"), "UTF-8"),
        (b"request_id,requester_received_pizza\n", "rows"),
        (b"just some words\nnot a table at all\n", "missing column"),
        (b'request_id,requester_received_pizza\n"t3_x,0.5\n', "not a parsable CSV"),
        (b"a,b\n1,2,3,4\n5\n", "missing column"),
    ],
)
def test_garbage_files_are_invalid_not_errors(pizza, tmp_path, data, why):
    result = _grade_bytes(pizza, tmp_path, data)
    assert not result.valid and result.score is None
    assert why in result.reason, result.reason


def test_missing_wrong_kind_and_oversized_files(pizza, tmp_path):
    assert "no submission" in grade(pizza, None).reason
    assert "no submission file" in grade(pizza, tmp_path / "absent.csv").reason
    assert ".csv" in _grade_bytes(pizza, tmp_path, b"a,b\n", "submission.txt").reason
    (tmp_path / "dir.csv").mkdir()
    assert not grade(pizza, tmp_path / "dir.csv").valid
    with pytest.raises(InvalidSubmission, match="cap"):
        read_submission(pizza.answers_path, max_bytes=100)
    assert grade_csv(pizza.spec, pizza.answers_path, pizza.answers_path).valid  # under the default cap


def test_a_million_rows_is_rejected(pizza, tmp_path):
    path = tmp_path / "big.csv"
    rows = "\n".join(f"t3_{i},0.5" for i in range(1_000_000))
    path.write_text("request_id,requester_received_pizza\n" + rows + "\n")
    result = grade(pizza, path)
    assert not result.valid and "1000000 rows" in result.reason


def test_real_pizza_answers_and_sample_submission(pizza, tmp_path):
    answers = pd.read_csv(pizza.answers_path)
    assert grade(pizza, pizza.sample_submission_path) == GradeResult(True, 0.5, "")
    perfect = answers.sample(frac=1.0, random_state=0)
    perfect.to_csv(tmp_path / "perfect.csv", index=False)
    assert grade(pizza, tmp_path / "perfect.csv") == GradeResult(True, 1.0, "")


def test_insults_duplicated_comment_ids_grade_the_gold_submission(prepared):
    insults = prepared["detecting-insults-in-social-commentary"]
    answers = pd.read_csv(insults.answers_path)
    assert answers["Comment"].duplicated().any()  # the id repeats in the real test set
    gold = insults.private_dir / "gold_submission.csv"
    assert grade(insults, gold) == GradeResult(True, 1.0, "")


def test_cli_grade_prints_json(pizza):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mle_jax.tasks",
            "grade",
            pizza.id,
            str(pizza.sample_submission_path),
            "--answers",
            str(pizza.public_dir.parent),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    # a constant prediction: valid, AUC 0.5, below pizza's MLE-bench median
    assert json.loads(out.stdout) == {"valid": True, "score": 0.5, "reason": "", "medal": "none"}


PIZZA_HEADER = b"request_id,requester_received_pizza"
MILLION = 10**6


def wide_record(n: int, quoted: bool = False) -> bytes:
    """One CSV record of n fields (7.9 MB at a million)."""
    cell = '"c{}"' if quoted else "c{}"
    return ",".join(cell.format(i) for i in range(n)).encode()


@pytest.mark.timeout(60)  # pandas alone takes minutes and gigabytes over this header
def test_a_million_column_header_is_refused_before_pandas(pizza, tmp_path):
    result = _grade_bytes(pizza, tmp_path, PIZZA_HEADER + b"," + wide_record(MILLION) + b"\nt3_x,0.5\n")
    assert not result.valid and result.score is None
    assert "header has 1000002 fields, more than the 102 columns" in result.reason, result.reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "data, why",  # the data made by the test, not at collection (4 million-field records took every worker 2 s)
    [
        # pandas reads a first row wider than the header as that many index columns: as slow as a wide header
        (lambda: PIZZA_HEADER + b"\n" + wide_record(MILLION) + b"\n", "first row has 1000000 fields"),
        (
            lambda: b"\n \n" + wide_record(MILLION) + b"\n",
            "header has 1000000 fields",
        ),  # blank lines above: still found
        (lambda: b"\xef\xbb\xbf" + wide_record(MILLION) + b"\n", "header has 1000000 fields"),  # behind a BOM
        (lambda: wide_record(MILLION, quoted=True) + b"\n", "quoted record over 1048576 bytes"),
        # a quote in mid-field is a plain character (to pandas and csv alike); the field opened by the next one
        # holds a line end: the header is 5002 fields long, not the first physical line's 2
        (lambda: b'a"b,"c\nx",' + wide_record(5000) + b"\n1,2\n", "header has 5002 fields"),
        (lambda: b"\r".join([PIZZA_HEADER, *[b"t3_%d,0.5" % i for i in range(3000)]]), "3000 rows by its line ends"),
    ],
)
def test_hostile_shapes_are_refused_on_the_raw_bytes(pizza, tmp_path, data, why):
    result = _grade_bytes(pizza, tmp_path, data())
    assert not result.valid and why in result.reason, result.reason


def test_exact_column_task_refuses_an_extra_field_in_the_header(prepared, tmp_path):
    spooky = prepared["spooky-author-identification"]
    assert spooky.spec.exact_columns
    header = ",".join([spooky.spec.id_column, *spooky.spec.target_columns, "notes"])
    result = _grade_bytes(spooky, tmp_path, f"{header}\nid1,0.3,0.3,0.4,x\n".encode())
    assert not result.valid and "header has 5 fields, more than the 4 columns" in result.reason, result.reason


def test_quoted_header_and_multiline_fields_still_grade(pizza, tmp_path):
    """The raw-byte checks count what pandas reads: quoted names, and a row whose field holds line ends."""
    answers = pd.read_csv(pizza.answers_path)
    pairs = zip(answers["request_id"], answers["requester_received_pizza"], strict=True)
    text = '"request_id","requester_received_pizza","note"\n' + "".join(f'{i},{p},"two\nlines"\n' for i, p in pairs)
    result = _grade_bytes(pizza, tmp_path, text.encode())
    assert result == GradeResult(True, 1.0, ""), result


@pytest.mark.timeout(60)
def test_grade_cli_refuses_a_million_column_header(pizza, tmp_path):
    path = tmp_path / "submission.csv"
    path.write_bytes(PIZZA_HEADER + b"," + wide_record(MILLION) + b"\nt3_x,0.5\n")
    out = subprocess.run(
        [sys.executable, "-m", "mle_jax.tasks", "grade", pizza.id, str(path), "--answers", str(pizza.answers_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert result["valid"] is False and "header has 1000002 fields" in result["reason"], result
    assert result["medal"] is None
