"""Preparers: raw Kaggle files -> an MLE-bench `prepared/` folder (public/ for the agent, private/ answers).

Split rules are MLE-bench's (mlebench/competitions/<id>/prepare.py): sklearn's
train_test_split(..., random_state=0); pizza holds out len(test)/(len(train)+len(test)) of the labelled
requests, leaf/spooky/nomad2018/tweet-sentiment-extraction 10%; insults uses Kaggle's test-with-solutions as the
private test. data/README.md records which prepared files reproduce the md5 sums of MLE-bench's checksums.yaml.
Preparing is idempotent: a marker records a hash of the raw files and the preparer version, and a second
call with the same inputs does nothing.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mle_jax.tasks.paths import RAW_DATA_DIR
from mle_jax.tasks.registry import get_spec, load_task, register
from mle_jax.tasks.task import Task, TaskSpec

# The raw Kaggle files of the tasks with data ship in the repository (data/README.md: provenance, Kaggle's rules).
PREPARER_VERSION = 1
MARKER = ".mle_jax_prepared.json"
SPLIT_SEED = 0


def _split(frame_or_list, test_size: float):
    from sklearn.model_selection import train_test_split  # here: sklearn takes ~1 s to import, rarely needed

    return train_test_split(frame_or_list, test_size=test_size, random_state=SPLIT_SEED)


def _one_hot(ids: pd.Series, labels: pd.Series, id_column: str, classes: tuple[str, ...]) -> pd.DataFrame:
    """[N] ids and labels -> frame id + one 0/1 column per class (MLE-bench's df_to_one_hot)."""
    unknown = set(labels) - set(classes)
    if unknown:
        raise ValueError(f"labels outside the class list: {sorted(unknown)[:5]}")
    out = pd.DataFrame({id_column: ids.to_numpy()})
    values = labels.to_numpy()
    for c in classes:
        out[c] = (values == c).astype(np.int64)
    return out


def _prepare_pizza(raw: Path, public: Path, private: Path) -> None:
    spec = get_spec("random-acts-of-pizza")
    old_train = json.loads((raw / "train.json").read_text())
    old_test = json.loads((raw / "test.json").read_text())
    test_ratio = len(old_test) / (len(old_train) + len(old_test))
    # Public test records carry the fields Kaggle's test has; the raw train copy here lacks two of them
    # (see the data README), so keep those that exist in train.
    train_fields = set(old_train[0])
    test_fields = [k for k in old_test[0] if k in train_fields]
    new_train, new_test = _split(old_train, test_ratio)
    (public / "train.json").write_text(json.dumps(new_train, indent=4))
    public_test = [{k: r[k] for k in test_fields} for r in new_test]
    (public / "test.json").write_text(json.dumps(public_test, indent=4))
    answers = pd.DataFrame(
        {
            "request_id": [r["request_id"] for r in new_test],
            "requester_received_pizza": [int(r["requester_received_pizza"]) for r in new_test],
        }
    )
    answers.to_csv(private / spec.answers_file, index=False)
    sample = answers.copy()
    sample["requester_received_pizza"] = 0
    sample.to_csv(public / spec.sample_submission, index=False)


def _prepare_insults(raw: Path, public: Path, private: Path) -> None:
    spec = get_spec("detecting-insults-in-social-commentary")
    shutil.copyfile(raw / "train.csv", public / "train.csv")
    answers = pd.read_csv(raw / "test_with_solutions.csv")
    answers.to_csv(private / spec.answers_file, index=False)
    gold = answers[["Insult", "Date", "Comment"]]
    gold.to_csv(private / "gold_submission.csv", index=False)
    gold.drop(columns=["Insult"]).to_csv(public / "test.csv", index=False)
    sample = gold.copy()
    sample["Insult"] = 0
    sample.to_csv(public / spec.sample_submission, index=False)


def _prepare_leaf(raw: Path, public: Path, private: Path) -> None:
    spec = get_spec("leaf-classification")
    old_train = pd.read_csv(raw / "train.csv")
    new_train, new_test = _split(old_train, 0.1)
    new_train.to_csv(public / "train.csv", index=False)
    new_test.drop(columns=["species"]).to_csv(public / "test.csv", index=False)
    answers = _one_hot(new_test["id"], new_test["species"], "id", spec.target_columns)
    answers.to_csv(private / spec.answers_file, index=False)
    sample = answers.copy()
    sample[list(spec.target_columns)] = 1.0 / len(spec.target_columns)
    sample.to_csv(public / spec.sample_submission, index=False)


def _prepare_spooky(raw: Path, public: Path, private: Path) -> None:
    spec = get_spec("spooky-author-identification")
    old_train = pd.read_csv(raw / "train.csv")
    new_train, new_test = _split(old_train, 0.1)
    new_train.to_csv(public / "train.csv", index=False)
    new_test.drop(columns=["author"]).to_csv(public / "test.csv", index=False)
    answers = _one_hot(new_test["id"], new_test["author"], "id", spec.target_columns)
    answers.to_csv(private / spec.answers_file, index=False)
    sample = answers.copy()  # Kaggle's sample values (MLE-bench copies them)
    sample["EAP"], sample["HPL"], sample["MWS"] = 0.403493538995863, 0.287808366106543, 0.308698094897594
    sample.to_csv(public / spec.sample_submission, index=False)


def _prepare_nomad(raw: Path, public: Path, private: Path) -> None:
    spec = get_spec("nomad2018-predict-transparent-conductors")
    old_train = pd.read_csv(raw / "train.csv")
    new_train, new_test = _split(old_train, 0.1)
    new_train, new_test = new_train.copy(), new_test.copy()
    # ids renumbered 1..n in split order, separately for train and test (MLE-bench); geometry follows them
    train_map = {old: new for new, old in enumerate(new_train["id"], start=1)}
    test_map = {old: new for new, old in enumerate(new_test["id"], start=1)}
    new_train["id"] = new_train["id"].map(train_map)
    new_test["id"] = new_test["id"].map(test_map)
    new_train.to_csv(public / "train.csv", index=False)
    new_test.to_csv(private / spec.answers_file, index=False)
    new_test.drop(columns=list(spec.target_columns)).to_csv(public / "test.csv", index=False)
    geometry = raw / "train_geometry.tar.gz"
    if geometry.is_file():  # train/<old id>/geometry.xyz -> public/{train,test}/<new id>/geometry.xyz
        with tarfile.open(geometry, "r:gz") as tar:
            for member in tar:
                parts = Path(member.name).parts
                if not (member.isfile() and len(parts) == 3 and parts[0] == "train" and parts[1].isdigit()):
                    continue
                old_id = int(parts[1])
                split, mapping = ("train", train_map) if old_id in train_map else ("test", test_map)
                if old_id not in mapping:
                    continue
                dst = public / split / str(mapping[old_id])
                dst.mkdir(parents=True, exist_ok=True)
                (dst / "geometry.xyz").write_bytes(tar.extractfile(member).read())
    sample = pd.DataFrame({"id": new_test["id"], "formation_energy_ev_natom": 0.1779, "bandgap_energy_ev": 1.8892})
    sample.to_csv(public / spec.sample_submission, index=False)


def _prepare_tweet(raw: Path, public: Path, private: Path) -> None:
    spec = get_spec("tweet-sentiment-extraction")
    old_train = pd.read_csv(raw / "train.csv")
    new_train, new_test = _split(old_train, 0.1)
    new_train.to_csv(public / "train.csv", index=False)
    new_test.to_csv(private / spec.answers_file, index=False)
    new_test.drop(columns=list(spec.target_columns)).to_csv(public / "test.csv", index=False)
    sample = new_test[[spec.id_column, *spec.target_columns]].copy()
    sample[list(spec.target_columns)] = ""
    sample.to_csv(public / spec.sample_submission, index=False)


PREPARERS: dict[str, tuple[tuple[str, ...], Callable[[Path, Path, Path], None]]] = {
    # task id -> (raw files it reads, preparer)
    "random-acts-of-pizza": (("train.json", "test.json"), _prepare_pizza),
    "detecting-insults-in-social-commentary": (("train.csv", "test_with_solutions.csv"), _prepare_insults),
    "leaf-classification": (("train.csv",), _prepare_leaf),
    "spooky-author-identification": (("train.csv",), _prepare_spooky),
    "nomad2018-predict-transparent-conductors": (("train.csv", "train_geometry.tar.gz"), _prepare_nomad),
    "tweet-sentiment-extraction": (("train.csv",), _prepare_tweet),
}


def define_task(spec: TaskSpec, raw_files: tuple[str, ...], preparer: Callable[[Path, Path, Path], None]) -> None:
    """A new task, defined outside mle_jax: its spec (metric, medal thresholds, paper row), the raw files its preparer
    reads, and the preparer (raw, public, private) -> None that writes MLE-bench's prepared/ folders. Called by the
    module that defines the task, which a run imports first (`task.modules`); its warm-start programs are one more
    module (mle_jax.warmstart.programs.register). docs/architecture.md "A new task" walks through it."""
    register(spec)
    PREPARERS[spec.id] = (tuple(raw_files), preparer)


def _inputs_hash(task_id: str, raw: Path, files: tuple[str, ...]) -> str:
    h = hashlib.sha256(f"{task_id}:v{PREPARER_VERSION}".encode())
    for name in (*files, "description.md"):
        path = raw / name
        h.update(name.encode())
        if path.is_file():
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def prepare(task_id: str, raw_dir: str | Path, out_dir: str | Path) -> Task:
    """Make `out_dir` (an MLE-bench `prepared/` folder) from the raw files of `task_id` in `raw_dir`.

    A no-op when out_dir already holds this preparation (same raw files, same preparer version).
    The folder is built aside and moved into place, so a crash never leaves half a task.
    """
    spec = get_spec(task_id)
    if task_id not in PREPARERS:
        with_data = ", ".join(sorted(PREPARERS))
        raise ValueError(
            f"{task_id}: no preparer (its raw data does not ship here); prepare it with MLE-bench "
            f"(`mlebench prepare -c {task_id}`) and pass its prepared/ folder, or use one of: {with_data}"
        )
    raw, out = Path(raw_dir), Path(out_dir)
    files, preparer = PREPARERS[task_id]
    missing = [f for f in files if not (raw / f).is_file() and f != "train_geometry.tar.gz"]
    if missing:
        raise FileNotFoundError(f"{task_id}: raw file(s) {missing} not found in {raw}")
    digest = _inputs_hash(task_id, raw, files)
    marker = out / MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()).get("inputs_sha256") == digest:
                return load_task(task_id, out)
        except (json.JSONDecodeError, OSError, FileNotFoundError):
            pass  # a broken marker or folder: rebuild
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    try:
        public, private = staging / "public", staging / "private"
        public.mkdir()
        private.mkdir()
        preparer(raw, public, private)
        if (raw / "description.md").is_file():
            shutil.copyfile(raw / "description.md", public / "description.md")
        (staging / MARKER).write_text(
            json.dumps({"task_id": spec.id, "preparer_version": PREPARER_VERSION, "inputs_sha256": digest})
        )
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return load_task(task_id, out)


@dataclass(frozen=True)
class TaskSettings:
    """The `task` section of the run config: which task, and where its prepared/ folder comes from."""

    id: str = ""
    prepared_dir: str = ""  # an MLE-bench prepared/ folder (public/ + private/); empty: prepare from raw
    raw_dir: str = str(RAW_DATA_DIR)  # raw Kaggle files, one folder per task id
    data_root: str = "data/tasks"  # where preparers write <id>/prepared/
    modules: tuple[str, ...] = ()  # modules imported first, each defining tasks (`define_task`) outside mle_jax

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))
        for name in self.modules:
            try:
                importlib.import_module(name)
            except ImportError as e:
                raise ValueError(f"task.modules: cannot import {name!r} ({e}); is its folder on PYTHONPATH?") from None
        if not self.id:
            raise ValueError("task.id is empty: use a task config (configs/<task>.py) or set --config.task.id")


def prepare_task(settings: TaskSettings) -> Task:
    """The task's prepared/ folder: given, or made from the raw Kaggle files (idempotent)."""
    if settings.prepared_dir:
        return load_task(settings.id, Path(settings.prepared_dir))
    raw = Path(settings.raw_dir) / settings.id
    if not raw.is_dir():
        raise FileNotFoundError(
            f"no raw data for {settings.id} at {raw}; pass --config.task.prepared_dir=<MLE-bench prepared/ folder> "
            f"or --config.task.raw_dir=<folder with {settings.id}/>"
        )
    return prepare(settings.id, raw, Path(settings.data_root) / settings.id / "prepared")
