"""Preparers on the real data: MLE-bench's split sizes, no answers in public/, idempotence."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from sklearn.model_selection import train_test_split

from mle_jax.tasks.prepare import MARKER, PREPARERS, prepare

REPO = Path(__file__).resolve().parents[2]
# MLE-bench's checksums.yaml of each competition (vendored unchanged, tests/mlebench_reference/README.md)
CHECKSUMS = REPO / "tests" / "mlebench_reference" / "mlebench" / "competitions"
# Prepared files whose md5 differs from MLE-bench's, because the raw copy here differs from Kaggle's
# (data/README.md, "Checksums"): every pizza file (the raw train lacks a row and some fields), and insults'
# private test.csv (the raw solutions file has no Usage column). Everything else must match byte for byte.
DIFFERS_FROM_MLEBENCH = {
    ("random-acts-of-pizza", "public/train.json"),
    ("random-acts-of-pizza", "public/test.json"),
    ("random-acts-of-pizza", "public/sampleSubmission.csv"),
    ("random-acts-of-pizza", "private/test.csv"),
    ("detecting-insults-in-social-commentary", "private/test.csv"),
}

# test rows by MLE-bench's rules on these raw files (data README): sklearn rounds the test share up
EXPECTED_TEST_ROWS = {
    "random-acts-of-pizza": math.ceil(4039 * 1631 / (4039 + 1631)),  # 1162
    "detecting-insults-in-social-commentary": 2647,  # Kaggle's test with solutions, as is
    "leaf-classification": math.ceil(990 * 0.1),  # 99
    "spooky-author-identification": math.ceil(19579 * 0.1),  # 1958
    "nomad2018-predict-transparent-conductors": math.ceil(2400 * 0.1),  # 240
    "tweet-sentiment-extraction": math.ceil(27481 * 0.1),  # 2749
}
RAW_ROWS = {
    "random-acts-of-pizza": 4039,
    "leaf-classification": 990,
    "spooky-author-identification": 19579,
    "nomad2018-predict-transparent-conductors": 2400,
    "tweet-sentiment-extraction": 27481,
}


def _public_test(task) -> pd.DataFrame:
    path = task.public_dir / task.spec.data_files[1]
    return pd.read_json(path) if path.suffix == ".json" else pd.read_csv(path)


def _public_train(task) -> pd.DataFrame:
    path = task.public_dir / task.spec.data_files[0]
    return pd.read_json(path) if path.suffix == ".json" else pd.read_csv(path)


@pytest.mark.parametrize("task_id", sorted(EXPECTED_TEST_ROWS))
def test_split_sizes_and_no_leak(prepared, task_id):
    task = prepared[task_id]
    spec = task.spec
    answers = pd.read_csv(task.answers_path)
    public_test = _public_test(task)
    sample = pd.read_csv(task.sample_submission_path)
    assert len(answers) == len(public_test) == len(sample) == EXPECTED_TEST_ROWS[task_id]
    # the public test has no answer column; the private ids are exactly the public test ids
    answer_columns = set(spec.target_columns) | {"species", "author", "requester_received_pizza", "Insult"}
    assert not answer_columns & set(public_test.columns)
    assert sorted(answers[spec.id_column].astype(str)) == sorted(public_test[spec.id_column].astype(str))
    assert sorted(sample[spec.id_column].astype(str)) == sorted(public_test[spec.id_column].astype(str))
    assert spec.id_column in sample.columns
    assert set(spec.target_columns) <= set(sample.columns)
    assert (task.public_dir / "description.md").is_file()
    if task_id in RAW_ROWS:  # test rows are held out of the public train
        train = _public_train(task)
        assert len(train) + len(answers) == RAW_ROWS[task_id]
        if task_id != "nomad2018-predict-transparent-conductors":  # nomad renumbers ids per split
            assert not set(train[spec.id_column]) & set(public_test[spec.id_column])


def test_pizza_split_is_sklearns_with_seed_0(prepared, raw_data_dir):
    task = prepared["random-acts-of-pizza"]
    raw_train = json.loads((raw_data_dir / task.id / "train.json").read_text())
    raw_test = json.loads((raw_data_dir / task.id / "test.json").read_text())
    _, held_out = train_test_split(
        raw_train, test_size=len(raw_test) / (len(raw_train) + len(raw_test)), random_state=0
    )
    answers = pd.read_csv(task.answers_path)
    assert answers["request_id"].tolist() == [r["request_id"] for r in held_out]
    labels = [int(r["requester_received_pizza"]) for r in held_out]
    assert answers["requester_received_pizza"].tolist() == labels
    public_test = json.loads((task.public_dir / "test.json").read_text())
    leaky = {k for k in raw_train[0] if k.endswith("_at_retrieval")}
    leaky |= {"requester_received_pizza", "request_text"}
    assert not leaky & set(public_test[0])  # only the fields Kaggle's test has


def test_leaf_and_spooky_answers_are_one_hot(prepared):
    for task_id in ("leaf-classification", "spooky-author-identification"):
        task = prepared[task_id]
        answers = pd.read_csv(task.answers_path)
        assert list(answers.columns) == [task.spec.id_column, *task.spec.target_columns]
        assert (answers[list(task.spec.target_columns)].sum(axis=1) == 1).all()


def test_nomad_geometry_follows_the_renumbered_ids(prepared, raw_data_dir):
    task = prepared["nomad2018-predict-transparent-conductors"]
    train, test = pd.read_csv(task.public_dir / "train.csv"), pd.read_csv(task.public_dir / "test.csv")
    assert sorted(train["id"]) == list(range(1, len(train) + 1))
    assert sorted(test["id"]) == list(range(1, len(test) + 1))
    assert len(list(task.public_dir.glob("train/*/geometry.xyz"))) == len(train)
    assert len(list(task.public_dir.glob("test/*/geometry.xyz"))) == len(test)
    raw = pd.read_csv(raw_data_dir / task.id / "train.csv")
    _, held_out = train_test_split(raw, test_size=0.1, random_state=0)
    answers = pd.read_csv(task.answers_path)
    assert answers["bandgap_energy_ev"].tolist() == held_out["bandgap_energy_ev"].tolist()


def test_prepare_is_idempotent_and_rebuilds_when_inputs_change(raw_data_dir, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train.csv", "description.md"):
        (raw / name).write_bytes((raw_data_dir / "leaf-classification" / name).read_bytes())
    out = tmp_path / "prepared"
    prepare("leaf-classification", raw, out)
    marker = (out / MARKER).read_text()
    stamp = (out / "public" / "train.csv").stat().st_mtime_ns
    prepare("leaf-classification", raw, out)  # no-op
    assert (out / "public" / "train.csv").stat().st_mtime_ns == stamp
    with (raw / "description.md").open("a") as f:
        f.write("\nchanged\n")
    prepare("leaf-classification", raw, out)  # inputs changed: rebuilt
    assert (out / MARKER).read_text() != marker
    assert (out / "public" / "description.md").read_text().endswith("changed\n")
    assert not list(tmp_path.glob(".*staging*"))


def test_data_less_task_has_no_preparer(tmp_path):
    with pytest.raises(ValueError, match="mlebench prepare"):
        prepare("lmsys-chatbot-arena", tmp_path, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="train.json"):
        prepare("random-acts-of-pizza", tmp_path, tmp_path / "out")


def test_cli_prepare_twice(raw_data_dir, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "mle_jax.tasks",
        "prepare",
        "spooky-author-identification",
        "--raw",
        str(raw_data_dir),
        "--out",
        str(tmp_path / "prepared"),
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True)
    second = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert json.loads(first.stdout) == json.loads(second.stdout)
    assert (tmp_path / "prepared" / "private" / "test.csv").is_file()


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("task_id", sorted(PREPARERS))
def test_prepared_files_have_mlebench_checksums(prepared, task_id):
    """Our preparers reproduce MLE-bench's prepared files (md5 of its checksums.yaml) wherever the raw copy
    is Kaggle's; the files that cannot match are exactly the documented ones."""
    checksums = yaml.safe_load((CHECKSUMS / task_id / "checksums.yaml").read_text())
    folder = prepared[task_id].public_dir.parent
    differ = set()
    for side in ("public", "private"):
        for name, md5 in checksums[side].items():
            path = folder / side / name
            assert path.is_file(), f"{task_id}: MLE-bench prepares {side}/{name}, we do not"
            if _md5(path) != md5:
                differ.add((task_id, f"{side}/{name}"))
    assert differ == {d for d in DIFFERS_FROM_MLEBENCH if d[0] == task_id}


def test_tweet_split_and_sample_submission(prepared, raw_data_dir):
    task = prepared["tweet-sentiment-extraction"]
    raw = pd.read_csv(raw_data_dir / task.id / "train.csv")
    _, held_out = train_test_split(raw, test_size=0.1, random_state=0)
    answers = pd.read_csv(task.answers_path, keep_default_na=False)
    assert list(answers.columns) == ["textID", "text", "selected_text", "sentiment"]
    assert answers["textID"].tolist() == held_out["textID"].tolist()
    public_test = pd.read_csv(task.public_dir / "test.csv")
    assert list(public_test.columns) == ["textID", "text", "sentiment"]
    sample = pd.read_csv(task.sample_submission_path, keep_default_na=False)
    assert list(sample.columns) == ["textID", "selected_text"] and set(sample["selected_text"]) == {""}


def test_cli_prepares_tweet_from_the_shipped_data_by_default(tmp_path):
    """`python -m mle_jax.tasks prepare tweet-sentiment-extraction` with no --raw: MLE-bench's md5 sums."""
    done = subprocess.run(
        [sys.executable, "-m", "mle_jax.tasks", "prepare", "tweet-sentiment-extraction"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    out = tmp_path / Path(json.loads(done.stdout)["public"]).parent
    assert out == tmp_path / "data" / "tasks" / "tweet-sentiment-extraction" / "prepared"
    checksums = yaml.safe_load((CHECKSUMS / "tweet-sentiment-extraction" / "checksums.yaml").read_text())
    for side in ("public", "private"):
        assert {name: _md5(out / side / name) for name in checksums[side]} == checksums[side]
