"""Preparers on the real data: MLE-bench's split sizes, no answers in public/, idempotence."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
from sklearn.model_selection import train_test_split

from mle_jax.tasks.prepare import MARKER, prepare

# test rows by MLE-bench's rules on these raw files (data README): sklearn rounds the test share up
EXPECTED_TEST_ROWS = {
    "random-acts-of-pizza": math.ceil(4039 * 1631 / (4039 + 1631)),  # 1162
    "detecting-insults-in-social-commentary": 2647,  # Kaggle's test with solutions, as is
    "leaf-classification": math.ceil(990 * 0.1),  # 99
    "spooky-author-identification": math.ceil(19579 * 0.1),  # 1958
    "nomad2018-predict-transparent-conductors": math.ceil(2400 * 0.1),  # 240
}
RAW_ROWS = {
    "random-acts-of-pizza": 4039,
    "leaf-classification": 990,
    "spooky-author-identification": 19579,
    "nomad2018-predict-transparent-conductors": 2400,
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
