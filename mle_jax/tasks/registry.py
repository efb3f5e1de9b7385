"""The paper's 12 MLE-bench tasks (Table 1) and the reader of a prepared MLE-bench folder.

Each spec follows the competition's MLE-bench definition (openai/mle-bench, mlebench/competitions/<id>/:
config.yaml for file names, grade.py for metric, id and target columns, prepare.py for public files).
"""

from __future__ import annotations

from pathlib import Path

from mle_jax.tasks.leaf_species import LEAF_SPECIES
from mle_jax.tasks.task import Task, TaskSpec

_SPECS: tuple[TaskSpec, ...] = (
    TaskSpec(
        id="detecting-insults-in-social-commentary",
        paper=(0.87, 0.895),
        metric="auc",
        lower_is_better=False,
        statement=(
            "Predict whether a social-media comment is insulting to a participant of the conversation. "
            "Give for each comment of test.csv the probability (0 to 1) that it is an insult, in the "
            "`Insult` column; rows are identified by the `Comment` text. Submissions are evaluated on "
            "the area under the ROC curve."
        ),
        id_column="Comment",
        target_columns=("Insult",),
        data_files=("train.csv", "test.csv"),
        has_data_here=True,
        sample_submission="sample_submission_null.csv",
    ),
    TaskSpec(
        id="learning-agency-lab-automated-essay-scoring-2",
        paper=(0.331, 0.746),
        metric="qwk",
        lower_is_better=False,
        statement=(
            "Score student essays: predict the holistic score (an integer from 1 to 6) of each essay "
            "(`full_text`) in test.csv. Submissions are evaluated on the quadratic weighted kappa "
            "between predicted and human scores."
        ),
        id_column="essay_id",
        target_columns=("score",),
        data_files=("train.csv", "test.csv"),
        answers_file="answers.csv",
    ),
    TaskSpec(
        id="random-acts-of-pizza",
        paper=(0.589, 0.663),
        metric="auc",
        lower_is_better=False,
        statement=(
            "Your task is to predict the probability that a Reddit request resulted in a free pizza "
            "(`requester_received_pizza`). Submissions are evaluated on the area under the ROC curve "
            "between the predicted probability and the observed outcome."
        ),
        id_column="request_id",
        target_columns=("requester_received_pizza",),
        data_files=("train.json", "test.json"),
        has_data_here=True,
        sample_submission="sampleSubmission.csv",
    ),
    TaskSpec(
        id="tweet-sentiment-extraction",
        paper=(0.027, 0.596),
        metric="jaccard",
        lower_is_better=False,
        statement=(
            "Given a tweet (`text`) and its `sentiment`, extract the part of the tweet (a word or "
            "phrase, `selected_text`) that supports the sentiment. Submissions are evaluated on the "
            "mean word-level Jaccard score between predicted and true phrases."
        ),
        id_column="textID",
        target_columns=("selected_text",),
        data_files=("train.csv", "test.csv"),
        has_data_here=True,
    ),
    TaskSpec(
        id="tabular-playground-series-may-2022",
        paper=(0.787, 0.913),
        metric="auc",
        lower_is_better=False,
        statement=(
            "Predict the binary `target` of simulated manufacturing control data (tabular features "
            "f_00..f_30). Give a probability for each test row. Submissions are evaluated on the area "
            "under the ROC curve."
        ),
        id_column="id",
        target_columns=("target",),
        data_files=("train.csv", "test.csv"),
    ),
    TaskSpec(
        id="tabular-playground-series-dec-2021",
        paper=(0.827, 0.951),
        metric="accuracy",
        lower_is_better=False,
        statement=(
            "Predict the forest cover type (`Cover_Type`, an integer class) from synthetic cartographic "
            "features. Submissions are evaluated on multi-class classification accuracy."
        ),
        id_column="Id",
        target_columns=("Cover_Type",),
        data_files=("train.csv", "test.csv"),
    ),
    TaskSpec(
        id="us-patent-phrase-to-phrase-matching",
        paper=(0.065, 0.527),
        metric="pearson",
        lower_is_better=False,
        statement=(
            "Rate the semantic similarity (`score`, 0 to 1 in steps of 0.25) of an `anchor` and a "
            "`target` phrase from patents, within the patent's CPC `context`. Submissions are evaluated "
            "on the Pearson correlation between predicted and actual scores."
        ),
        id_column="id",
        target_columns=("score",),
        data_files=("train.csv", "test.csv"),
    ),
    TaskSpec(
        id="plant-pathology-2020-fgvc7",
        paper=(0.628, 0.97),
        metric="mean_column_auc",
        lower_is_better=False,
        statement=(
            "Classify apple-leaf photos (images/<image_id>.jpg) into healthy, multiple_diseases, rust "
            "and scab: give one probability per class for each test image. Submissions are evaluated "
            "on the mean column-wise area under the ROC curve."
        ),
        id_column="image_id",
        target_columns=("healthy", "multiple_diseases", "rust", "scab"),
        data_files=("train.csv", "test.csv", "images/"),
        exact_columns=True,
    ),
    TaskSpec(
        id="leaf-classification",
        paper=(0.884, 0.124),
        metric="log_loss",
        lower_is_better=True,
        statement=(
            "Identify the species of a leaf (99 species) from pre-extracted shape, margin and texture "
            "features. Give for each test id a probability for every species, one column per species "
            "as in the sample submission; each row must sum to 1. Submissions are evaluated on the "
            "multi-class log loss."
        ),
        id_column="id",
        target_columns=LEAF_SPECIES,
        data_files=("train.csv", "test.csv"),
        has_data_here=True,
        exact_columns=True,
    ),
    TaskSpec(
        id="nomad2018-predict-transparent-conductors",
        paper=(0.178, 0.059),
        metric="mean_column_rmsle",
        lower_is_better=True,
        statement=(
            "Predict two properties of transparent-conductor materials from their composition and "
            "lattice: `formation_energy_ev_natom` and `bandgap_energy_ev` (geometry files in "
            "train/<id>/geometry.xyz and test/<id>/geometry.xyz). Submissions are evaluated on the "
            "mean of the two columns' root mean squared logarithmic errors."
        ),
        id_column="id",
        target_columns=("formation_energy_ev_natom", "bandgap_energy_ev"),
        data_files=("train.csv", "test.csv"),
        has_data_here=True,
    ),
    TaskSpec(
        id="spooky-author-identification",
        paper=(0.596, 0.404),
        metric="log_loss",
        lower_is_better=True,
        statement=(
            "Identify the author of sentences from horror stories: Edgar Allan Poe (EAP), HP Lovecraft "
            "(HPL) or Mary Shelley (MWS). Give a probability for each author per test sentence; each row "
            "must sum to 1. Submissions are evaluated on the multi-class log loss."
        ),
        id_column="id",
        target_columns=("EAP", "HPL", "MWS"),
        data_files=("train.csv", "test.csv"),
        has_data_here=True,
        exact_columns=True,
        id_first=True,
    ),
    TaskSpec(
        id="lmsys-chatbot-arena",
        paper=(11.48, 1.081),
        metric="log_loss",
        lower_is_better=True,
        statement=(
            "Predict which of two chatbot responses (`response_a`, `response_b`) to a `prompt` a user "
            "preferred: give probabilities for winner_model_a, winner_model_b and winner_tie per test "
            "id; each row must sum to 1. Submissions are evaluated on the multi-class log loss."
        ),
        id_column="id",
        target_columns=("winner_model_a", "winner_model_b", "winner_tie"),
        data_files=("train.csv", "test.csv"),
        answers_file="answers.csv",
        row_sum_rule="round6",
    ),
)

_BY_ID: dict[str, TaskSpec] = {s.id: s for s in _SPECS}  # and the tasks defined elsewhere (`register`)


def all_specs() -> tuple[TaskSpec, ...]:
    """The 12 tasks, in the order of the paper's Table 1."""
    return _SPECS


def register(spec: TaskSpec) -> None:
    """Adds a task defined outside this file (tasks/prepare.define_task); a second task of the same id is an error."""
    if spec.id in _BY_ID:
        raise ValueError(f"task {spec.id!r} is already defined")
    _BY_ID[spec.id] = spec


def get_spec(task_id: str) -> TaskSpec:
    try:
        return _BY_ID[task_id]
    except KeyError:
        known = ", ".join(sorted(_BY_ID))
        raise KeyError(f"unknown task id {task_id!r}; known: {known}") from None


def load_task(task_id: str, prepared_dir: str | Path, require_private: bool = True) -> Task:
    """A Task on an MLE-bench `prepared/` folder (public/ + private/), read as is.

    require_private=False allows a public-only copy (what a sandbox sees); grading then fails.
    """
    spec = get_spec(task_id)
    prepared = Path(prepared_dir)
    public, private = prepared / "public", prepared / "private"
    if not public.is_dir():
        raise FileNotFoundError(
            f"{task_id}: no public/ folder in {prepared}; prepare it with "
            f"`python -m mle_jax.tasks prepare {task_id} --raw RAW --out {prepared}`"
        )
    if not (public / spec.sample_submission).is_file():
        raise FileNotFoundError(f"{task_id}: {public / spec.sample_submission} is missing")
    task = Task(spec=spec, public_dir=public, private_dir=private)
    if require_private and not task.answers_path.is_file():
        raise FileNotFoundError(f"{task_id}: private answers {task.answers_path} are missing")
    return task
