"""`python -m mle_jax.launch`: a user's mistake or a missing piece ends in one line saying what and how to fix
it, before any work starts (no traceback, exit 2)."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import pytest

from mle_jax.rl.objectives import OBJECTIVES
from mle_jax.run import config_docs, preflight
from mle_jax.run.settings import from_config
from mle_jax.tasks.registry import get_spec
from tests.launch_forks import forked_runs

REPO = Path(__file__).resolve().parents[1]


USER_ERRORS = [
    (
        ["--config=configs/pizza.py:gpu-typo"],
        "unknown config arg 'gpu-typo' for random-acts-of-pizza; use 'paper', 'cpu', 'smol' or 'qwen'",
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
        ["--config=configs/pizza.py:cpu", "--config.sampler.group_size=3"],
        "loop.batch_size B=8 is not a multiple of sampler.group_size n=3",
    ),
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
    (["--config=configs/pizza.py:cpu", "--config.loop.steps=-1"], "loop.steps must be >= 0"),
    (  # a group objective over groups of one sample: every advantage 0, nothing learnt
        ["--config=configs/pizza.py:cpu", "--config.learner.algorithm=grpo"],
        "learner.algorithm: grpo needs --config.sampler.group_size >= 2, e.g. --config.sampler.group_size=4",
    ),
    (
        ["--config=configs/pizza.py:cpu", "--config.learner.algorithm=ppo2"],
        f"learner.algorithm must be one of {tuple(OBJECTIVES)}, got 'ppo2'",  # a fifth objective: one registry line
    ),
    (
        ["--config=configs/pizza.py:cpu", "--config.ppo.behaviour_weight_cap=0.5"],
        "behaviour_weight_cap must be >= 1",
    ),
    (  # a mix naming a task id that does not exist
        ["--config=configs/multitask.py:cpu", "--config.tasks=('random-acts-of-pizza','no-such-task')"],
        "config.tasks: unknown task id 'no-such-task'; known:",
    ),
    (  # a mix with a task whose data does not ship here
        ["--config=configs/multitask.py:cpu", "--config.tasks=('random-acts-of-pizza','lmsys-chatbot-arena')"],
        "config.tasks: lmsys-chatbot-arena has no data in this repository",
    ),
    (
        ["--config=configs/multitask.py:cpu", "--config.task_weights=(1.0,2.0)"],
        "config.task_weights=[1.0, 2.0] must be one weight >= 0 per task of config.tasks (6)",
    ),
]


INSPECT = {  # --print_config and --dry_run: what they print, and that nothing starts
    "print_config": ["--config=configs/pizza.py:smol", "--config.loop.steps=7", "--print_config"],
    "dry_run_paper": ["--config=configs/pizza.py", "--config.executor.docker_url=unix:///tmp/no-such-docker.sock",
                      "--dry_run"],
    "dry_run_cpu": ["--config=configs/pizza.py:cpu", "--dry_run"],
    "help": ["--help"],
}  # fmt: skip


Launched = tuple[subprocess.CompletedProcess, Path]


# refusals the tests below read one by one (each with a folder of its own under which its workdir would be `run`)
REFUSED = {
    "us_patent_cpu": ["--config=configs/us_patent.py:cpu"],
    "us_patent_gpu": ["--config=configs/us_patent.py:gpu"],
    "broken_model": ["--config=configs/pizza.py:cpu"],  # model.path: a folder whose config.json is no JSON
}


@pytest.fixture(scope="module")
def launched_all(tmp_path_factory) -> tuple[dict[int, Launched], dict[str, Launched], dict[str, Launched]]:
    """Every USER_ERRORS, INSPECT and REFUSED case launched once (one forking interpreter for all), each with a
    workdir of its own: (USER_ERRORS' by index, INSPECT's by name, REFUSED's by name)."""
    root = tmp_path_factory.mktemp("launch")
    errors = [[*args, f"--config.workdir={root / str(i) / 'run'}"] for i, (args, _) in enumerate(USER_ERRORS)]
    inspect = [[*args, f"--config.workdir={root / name}"] if name != "help" else args for name, args in INSPECT.items()]
    (root / "broken_model" / "model").mkdir(parents=True)
    (root / "broken_model" / "model" / "config.json").write_text("{not json")
    refused = [[*args, f"--config.workdir={root / name / 'run'}"] for name, args in REFUSED.items()]
    refused[-1].append(f"--config.model.path={root / 'broken_model' / 'model'}")
    done = forked_runs(errors + inspect + refused)  # one interpreter imports the launcher, a child per case
    n, m = len(errors), len(errors) + len(inspect)
    return (
        {i: (d, root / str(i)) for i, d in enumerate(done[:n])},
        {name: (d, root / name) for name, d in zip(INSPECT, done[n:m], strict=True)},
        {name: (d, root / name) for name, d in zip(REFUSED, done[m:], strict=True)},
    )


@pytest.fixture(scope="module")
def launched(launched_all) -> dict[int, Launched]:
    return launched_all[0]


@pytest.fixture(scope="module")
def inspected(launched_all) -> dict[str, Launched]:
    """--print_config, --dry_run and --help (INSPECT), each launched once."""
    return launched_all[1]


@pytest.mark.parametrize("case", range(len(USER_ERRORS)), ids=[says[:40] for _, says in USER_ERRORS])
def test_user_errors_are_one_line(case, launched):
    says = USER_ERRORS[case][1]
    done, tmp_path = launched[case]
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    err = done.stderr.strip()
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert err.startswith("error: ") and says in err, err
    assert all(line.startswith("error: ") for line in err.splitlines()), err  # one line per problem
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


def test_a_multi_process_run_syncs_by_files_not_shared_memory():
    cfg = importlib.import_module("configs.pizza").get_config("cpu")
    cfg.warmstart.enabled = False
    cfg.sampler.backend, cfg.sampler.sync_source = "vllm", "shm"
    s = from_config(cfg)
    [problem] = [p for p in preflight.problems(s, {"JAX_NUM_PROCESSES": "2"}) if "several processes" in p]
    assert "sampler.sync_source=shm" in problem and "sync_source=hf" in problem
    assert not any("several processes" in p for p in preflight.problems(s, {"JAX_NUM_PROCESSES": "1"}))


@pytest.mark.parametrize("case", ["us_patent_cpu", "us_patent_gpu"])
def test_a_task_without_data_fails_in_one_line(case, launched_all):
    done, tmp_path = launched_all[2][case]
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


def _cpu_settings(**overrides: str):
    cfg = importlib.import_module("configs.pizza").get_config("cpu")
    for key, value in overrides.items():
        section, field = key.split("__")
        cfg[section][field] = value
    return from_config(cfg)


def test_a_workdir_that_is_or_lies_under_a_file_is_one_line_each(tmp_path):
    (tmp_path / "file").write_text("x")
    assert preflight.workdir_problems(str(tmp_path / "file")) == [
        f"workdir={tmp_path / 'file'} is a file, not a folder: pass --config.workdir=<a folder>"
    ]
    under = tmp_path / "file" / "run" / "deeper"
    assert preflight.workdir_problems(str(under)) == [
        f"workdir={under} lies under {tmp_path / 'file'}, which is a file: pass --config.workdir=<a folder>"
    ]
    assert preflight.workdir_problems(str(tmp_path / "new" / "run")) == []  # to be made: fine
    assert not (tmp_path / "new").exists()  # the check creates nothing


def test_a_read_only_workdir_is_one_line(tmp_path):
    """Checked as an unprivileged user (root writes through a read-only mode): a folder of mode 0555."""
    ro = Path(tempfile.mkdtemp(prefix="mle_jax_ro_"))
    try:
        ro.chmod(0o555)
        probe = f"from mle_jax.run import preflight; print(preflight.workdir_problems({str(ro / 'run')!r}))"
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        done = subprocess.run([*as_nobody, sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "HOME": str(ro)})  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        problems = ast.literal_eval(done.stdout.strip().splitlines()[-1])
        assert problems == [
            f"workdir={ro / 'run'} is not writable ({ro} is its nearest existing folder): Permission denied; "
            "pass --config.workdir=<a writable folder>"
        ]
    finally:
        ro.chmod(0o755)
        ro.rmdir()


@pytest.mark.parametrize(
    "config_json, says",
    [
        ('{"model_type": "qwen2", "hidden_size": ', "config.json: not valid JSON"),
        ('{"model_type": "qwen2", "num_attention_heads": 2, "hidden_size": 32}', "lacks the field 'vocab_size'"),
        ("[1, 2]", "config.json: not a JSON object"),
    ],
)
def test_a_model_config_that_does_not_read_is_caught_before_any_work(tmp_path, config_json, says):
    (tmp_path / "config.json").write_text(config_json)
    [problem] = preflight.problems(_cpu_settings(model__path=str(tmp_path)))
    assert problem.startswith(f"model.path={tmp_path}: ") and says in problem, problem


def test_a_broken_model_config_fails_launch_in_one_line(launched_all):
    done, tmp_path = launched_all[2]["broken_model"]
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: model.path={tmp_path / 'model'}: ") and "not valid JSON" in line, line
    assert not (tmp_path / "run").exists()


def test_print_config_prints_every_resolved_field_and_starts_nothing(inspected):
    done, workdir = inspected["print_config"]
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-2000:]
    printed = dict(line.split(" = ", 1) for line in done.stdout.strip().splitlines())
    cfg = importlib.import_module("configs.pizza").get_config("smol")
    assert list(printed) == list(config_docs.flat_config(cfg))  # every field, in configs/base.py's order
    assert printed["loop.steps"] == "7"  # the override
    assert printed["model.path"] == "'checkpoints/smollm2-135m-instruct'" and printed["sampler.backend"] == "'jax'"
    assert printed["workdir"] == repr(str(workdir)) and not workdir.exists()


def test_dry_run_of_the_paper_config_here_names_each_missing_piece_in_one_line(inspected):
    done, workdir = inspected["dry_run_paper"]
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    out = done.stdout.splitlines()
    for part in ("model", "learner", "sampler", "instrumenter", "sandbox backend", "fleet", "tasks", "batch",
                 "warm start", "checkpoint", "evaluation", "devices"):  # fmt: skip
        assert sum(line.startswith(f"{part}: ") for line in out) == 1, (part, out)
    assert "model: qwen2, 36 layers of hidden 2048, ~3,085.9 M parameters" in done.stdout
    assert "checkpoint: 69.0 GiB a step" in done.stdout and "batch: B=128 samples an update" in done.stdout
    errors = done.stderr.strip().splitlines()
    assert all(line.startswith("error: ") for line in errors), errors
    for missing in ("model.path is empty", "no Docker daemon answers", "sampler.vllm_url is empty",
                    "instrument.vllm_url is empty"):  # fmt: skip
        assert sum(missing in line for line in errors) == 1, (missing, errors)
    only_cpu = all(d.platform == "cpu" for d in jax.devices())
    assert any(line.startswith("error: no accelerator: JAX finds only CPU") for line in errors) == only_cpu
    assert not workdir.exists()


def test_dry_run_of_the_cpu_config_is_ready_and_runs_no_step(inspected):
    done, workdir = inspected["dry_run_cpu"]
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-2000:]
    assert "sandbox backend: bwrap" in done.stdout and "sampler: jax in process" in done.stdout
    assert "checkpoint: 16.0 MiB a step" in done.stdout and "warm start: 64 verified programs" in done.stdout
    assert done.stdout.strip().endswith("dry run: nothing started; ready to run")
    assert not workdir.exists()


def test_help_lists_the_launchers_flags(inspected):
    done, _ = inspected["help"]
    text = done.stdout + done.stderr
    assert all(f"--{flag}" in text or f"--[no]{flag}" in text for flag in ("config", "print_config", "dry_run")), text
