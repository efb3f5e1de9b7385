"""`python -m mle_jax.launch`: a user's mistake or a missing piece ends in one line saying what and how to fix
it, before any work starts (no traceback, exit 2)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from mle_jax import preflight
from mle_jax.settings import from_config
from mle_jax.tasks.registry import get_spec

REPO = Path(__file__).resolve().parents[1]


def launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mle_jax.launch", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--config=configs/pizza.py:gpu-typo"],
            "unknown config arg 'gpu-typo' for random-acts-of-pizza; use 'paper', 'cpu' or 'smol'",
        ),
        (
            ["--config=configs/doesnotexist.py"],
            "--config=configs/doesnotexist.py: no config file configs/doesnotexist.py",
        ),
        (
            ["--config=configs/pizza.py:cpu", "--config.loop.stepz=3"],
            "--config.loop.stepz: no such config field (did you mean --config.loop.steps?)",
        ),
        (
            ["--config=configs/pizza.py:cpu", "--config.ppo.clip=0.1"],
            "--config.ppo.clip: no such config field (did you mean --config.ppo.clip_ratio?)",
        ),
        (["--config=configs/pizza.py:cpu", "--config.ppo.clip_ratio=abc"], "could not convert string to float: 'abc'"),
        (["--config=configs/pizza.py:cpu", "--config.ppo.loss_agg=sum"], "ppo.loss_agg must be one of"),
        (
            ["--config=configs/pizza.py:cpu", "--config.model.path=/no/such/model"],
            "model.path=/no/such/model is not an HF model folder",
        ),
        (
            ["--config=configs/pizza.py:cpu", "--config.sampler.backend=vllm"],
            "sampler.vllm_url is empty but sampler.backend=vllm",
        ),
        (
            [
                "--config=configs/pizza.py:cpu",
                "--config.executor.backend=docker",
                "--config.executor.docker_url=unix:///tmp/no-such-docker.sock",
            ],
            "no Docker daemon answers at unix:///tmp/no-such-docker.sock",
        ),
        (
            ["--config=configs/pizza.py:cpu", "--config.task.raw_dir=/no/such/data"],
            "no data for random-acts-of-pizza at /no/such/data",
        ),
    ],
)
def test_user_errors_are_one_line(args, says, tmp_path):
    done = launch(*args, f"--config.workdir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    err = done.stderr.strip()
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert err.startswith("error: ") and says in err, err
    assert len(err.splitlines()) == 1, err  # (a message quoting a value keeps its closing quote: in `says`)
    assert not (tmp_path / "run").exists()  # nothing started


DATA_LESS = {  # config -> task id: the six tasks whose data does not ship in data/raw/
    "essay_scoring": "learning-agency-lab-automated-essay-scoring-2",
    "tabular_may2022": "tabular-playground-series-may-2022",
    "tabular_dec2021": "tabular-playground-series-dec-2021",
    "us_patent": "us-patent-phrase-to-phrase-matching",
    "plant_pathology": "plant-pathology-2020-fgvc7",
    "lmsys_arena": "lmsys-chatbot-arena",
}


@pytest.mark.parametrize("name", sorted(DATA_LESS))
def test_a_task_without_data_names_the_prepared_folder_to_pass(name):
    task_id = DATA_LESS[name]
    assert not get_spec(task_id).has_data_here
    settings = from_config(importlib.import_module(f"configs.{name}").get_config("cpu"))
    assert preflight.problems(settings) == [
        f"{task_id} has no data in this repository: prepare it with MLE-bench (`mlebench prepare -c {task_id}`) "
        f"and pass --config.task.prepared_dir=<MLE-bench data dir>/{task_id}/prepared"
    ]


def test_a_task_without_a_corpus_needs_a_checkpoint_for_the_cpu_run(tmp_path):
    """Given its prepared/ folder, a data-less task's :cpu run still has no warm-start corpus for the tiny model."""
    (tmp_path / "public").mkdir()
    cfg = importlib.import_module("configs.lmsys_arena").get_config("cpu")
    cfg.task.prepared_dir = str(tmp_path)
    [problem] = preflight.problems(from_config(cfg))
    assert "lmsys-chatbot-arena has none" in problem and "--config.model.path" in problem
    cfg.model.path = "/no/such/model"
    assert not any("corpus" in p for p in preflight.problems(from_config(cfg)))


def test_a_multi_process_run_starts_from_a_checkpoint_not_a_warm_start():
    s = from_config(importlib.import_module("configs.pizza").get_config("cpu"))
    assert s.warmstart.enabled
    for env in ({"JAX_NUM_PROCESSES": "2"}, {"MLE_JAX_DISTRIBUTED": "auto"}):
        [problem] = [p for p in preflight.problems(s, env) if "several processes" in p]
        assert "--config.warmstart.enabled=false --config.model.path=" in problem
    assert not any("several processes" in p for p in preflight.problems(s, {"JAX_NUM_PROCESSES": "1"}))


@pytest.mark.parametrize("args", [["--config=configs/us_patent.py:cpu"], ["--config=configs/us_patent.py:gpu"]])
def test_a_task_without_data_fails_in_one_line(args, tmp_path):
    done = launch(*args, f"--config.workdir={tmp_path / 'run'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and ("prepared_dir" in line or "unknown config arg 'gpu'" in line), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arg, says", [("cpu", "drop --config.model.path"), ("paper", "use the :cpu config")])
def test_a_missing_model_folder_says_what_no_path_would_build(arg, says):
    """Without model.path the :cpu config builds its tiny model, the paper config a random 3B-shaped one: the hint
    to drop the path is given only where that gives a model that can learn here."""
    cfg = importlib.import_module("configs.pizza").get_config(arg)
    cfg.model.path = "/no/such/model"
    [problem] = [p for p in preflight.problems(from_config(cfg)) if "model.path" in p]
    assert says in problem, problem
    if arg == "paper":
        assert "drop --config.model.path" not in problem and "36 layers of hidden 2048" in problem
