from __future__ import annotations

import shutil

import pandas as pd
import pytest

from mle_jax.tasks.graders import METRIC_GRADERS
from mle_jax.tasks.leaf_species import LEAF_SPECIES
from mle_jax.tasks.registry import all_specs, get_spec, load_task

PAPER_TASKS = {  # id -> (metric, lower is better), Table 1 of the paper and MLE-bench's graders
    "detecting-insults-in-social-commentary": ("auc", False),
    "learning-agency-lab-automated-essay-scoring-2": ("qwk", False),
    "random-acts-of-pizza": ("auc", False),
    "tweet-sentiment-extraction": ("jaccard", False),
    "tabular-playground-series-may-2022": ("auc", False),
    "tabular-playground-series-dec-2021": ("accuracy", False),
    "us-patent-phrase-to-phrase-matching": ("pearson", False),
    "plant-pathology-2020-fgvc7": ("mean_column_auc", False),
    "leaf-classification": ("log_loss", True),
    "nomad2018-predict-transparent-conductors": ("mean_column_rmsle", True),
    "spooky-author-identification": ("log_loss", True),
    "lmsys-chatbot-arena": ("log_loss", True),
}


def test_the_twelve_tasks_with_their_metric_and_direction():
    specs = {s.id: (s.metric, s.lower_is_better) for s in all_specs()}
    assert specs == PAPER_TASKS
    assert all(s.metric in METRIC_GRADERS for s in all_specs())
    assert {s.id for s in all_specs() if s.has_data_here} == {
        "random-acts-of-pizza",
        "detecting-insults-in-social-commentary",
        "leaf-classification",
        "spooky-author-identification",
        "nomad2018-predict-transparent-conductors",
        "tweet-sentiment-extraction",
    }


def test_mle_bench_file_names_and_columns():
    assert get_spec("random-acts-of-pizza").sample_submission == "sampleSubmission.csv"
    insults = get_spec("detecting-insults-in-social-commentary")
    assert insults.sample_submission == "sample_submission_null.csv"
    assert get_spec("lmsys-chatbot-arena").answers_file == "answers.csv"
    assert get_spec("learning-agency-lab-automated-essay-scoring-2").answers_file == "answers.csv"
    assert get_spec("detecting-insults-in-social-commentary").id_column == "Comment"
    assert get_spec("tabular-playground-series-dec-2021").target_columns == ("Cover_Type",)


def test_leaf_species_are_the_sorted_species_of_the_data(raw_data_dir):
    species = pd.read_csv(raw_data_dir / "leaf-classification" / "train.csv")["species"]
    assert LEAF_SPECIES == tuple(sorted(species.unique()))
    assert len(LEAF_SPECIES) == 99


def test_unknown_task_and_missing_folders(tmp_path):
    with pytest.raises(KeyError, match="unknown task id"):
        get_spec("titanic")
    with pytest.raises(FileNotFoundError, match="prepare"):
        load_task("random-acts-of-pizza", tmp_path)


def test_load_task_reads_a_prepared_folder_as_is(prepared, tmp_path):
    pizza = prepared["random-acts-of-pizza"]
    task = load_task("random-acts-of-pizza", pizza.public_dir.parent)
    assert task.answers_path.is_file() and task.sample_submission_path.is_file()
    assert task.public_dir == pizza.public_dir and task.lower_is_better is False
    shutil.copytree(pizza.public_dir, tmp_path / "public")  # what a sandbox sees: no private/
    with pytest.raises(FileNotFoundError, match="answers"):
        load_task("random-acts-of-pizza", tmp_path)
    public_only = load_task("random-acts-of-pizza", tmp_path, require_private=False)
    assert public_only.public_dir == tmp_path / "public"
