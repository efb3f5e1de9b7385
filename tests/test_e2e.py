"""End to end: configs/pizza.py:cpu on the real pizza data with the tiny model, through every stage,
then a run killed mid-RL and started again with the same command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from configs import pizza
from mle_jax.executor.result import OUTCOMES
from mle_jax.infra.metrics import read_metrics
from mle_jax.rl.ledger import LEDGER, read_ledger, tally
from tests.launch_forks import forked_runs
from tests.samples_browser import open_page, rows

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]

# The embedded run, made smaller still: a test checks the wiring, `make run` shows learning (a warm start of 4 corpus
# programs and 10 SFT steps, two evaluation samples of each kind).
SMALL = {
    "loop.steps": 2,
    "loop.batch_size": 4,
    "ppo.mini_batch_size": 4,
    "ppo.micro_batch_size": 2,
    "eval.samples": 2,
    "warmstart.corpus_size": 4,
    "warmstart.steps": 10,
    "warmstart.instrument_examples": 8,
    "warmstart.instrument_redrawn": 0,
    "warmstart.instrument_eval": 2,
}


def small_config(workdir: Path):
    cfg = pizza.get_config("cpu")
    cfg.workdir = str(workdir)
    cfg.task.data_root = str(workdir.parent / "tasks")
    for key, value in SMALL.items():
        section, field = key.split(".")
        cfg[section][field] = value
    return cfg


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from mle_jax.run.stages import run

    workdir = tmp_path_factory.mktemp("e2e") / "run"
    summary = run(small_config(workdir))
    return workdir, summary


def test_two_rl_steps_end_to_end(finished_run):
    workdir, summary = finished_run
    rows = read_metrics(workdir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert -10.0 <= r["reward/mean"] <= 1.0
        assert 0.0 <= r["valid_fraction"] <= 1.0
        assert r["learner/actor/pg_loss"] == r["learner/actor/pg_loss"]  # finite, not NaN
        assert 0.0 <= r["learner_idle_fraction"] <= 1.0 and 0.0 <= r["executor_utilization"] <= 1.0
        assert 0.1 < r["process/rss_gib"] <= r["process/peak_rss_gib"] and r["process/compiles"] > 0
    assert summary["rl/steps"] == 2 and summary["rl/samples"] >= 8
    assert summary["warmstart/corpus_verified"] >= 1  # the SFT corpus ran and graded in the sandbox
    assert 0.0 <= summary["warmstart/instrument_heldout_accept"] <= 1.0
    samples = read_metrics(workdir / "samples.jsonl")
    # the frozen copy of the warm-started policy instruments (mode "lm"): every program that parses goes to it
    # (accepted, or the counted AST fallback); one that does not parse is counted apart, and a response without
    # code is never instrumented ("off"). Which paths occur depends on what the 20-step warm start writes (in one
    # CI run no program parsed), so this checks the counting: the run's shares agree with the trained-on paths.
    paths = [s["instrument"] for s in samples]
    assert len(samples) == 2 * 4 and set(paths) <= {"lm", "fallback", "unparsed", "off"}
    assert all((s["code"] is None) == (s["instrument"] == "off") for s in samples)
    lm, fallback = summary["rl/instrument_lm_share"], summary["rl/instrument_fallback_share"]
    if lm is None:  # no sampled program parsed
        assert fallback is None and not {"lm", "fallback"} & set(paths)
    else:
        assert lm + fallback == pytest.approx(1.0)
    for path in {"lm", "fallback", "unparsed"} & set(paths):
        assert summary[f"rl/instrument_{path}_share"] > 0
    ev = json.loads((workdir / "evaluation.json").read_text())
    assert ev["scratch"]["samples"] == 2 and ev["improved"]["samples"] == 2
    assert ev["paper"]["qwen2.5-3b-rl"] == pytest.approx(0.663)
    # MLE-bench's scale: the paper's pizza figures earn nothing (prompted) and above the median (after RL)
    assert ev["paper_medals"] == {"qwen2.5-3b": "none", "qwen2.5-3b-rl": "above_median"}
    assert sum(ev["scratch"]["medals"]["shares"].values()) == pytest.approx(1.0)
    report = (workdir / "report.md").read_text()
    assert report.startswith(
        "# Run report: random-acts-of-pizza\n\n- **Task**: random-acts-of-pizza (higher is better)"
    )
    assert "- **Reward** (mean ± SE of the RL samples, step 1 → step 2): " in report
    assert "## Evaluation" in report and "valid_fraction/first_step" in report
    assert json.loads((workdir / "run_summary.json").read_text())["rl/steps"] == 2  # for mle_jax.evaluate's report
    assert "| random-acts-of-pizza | scratch |" in report and "after RL 0.663 (above_median)" in report
    assert {"medal_shares.png", "outcomes.png"} <= {p.name for p in (workdir / "plots").glob("*.png")}
    assert "- **Samples**: [samples.html](samples.html), the 8 samples" in report.split("\n## ")[0]
    _read_the_samples_page(workdir / "samples.html", samples)
    assert list((workdir / "tb").iterdir())
    assert (workdir / "hf_export" / "config.json").exists() and (workdir / "hf_export" / "tokenizer.json").exists()


def _read_the_samples_page(path: Path, samples: list[dict]) -> None:
    """The run's samples.html in headless Chromium: every sample listed, a filter by the first one's status, and that
    sample read (its program, or that it had none)."""
    assert all(s["outcome"] in OUTCOMES for s in samples)
    first = samples[0]
    with open_page(path) as opened:
        page = opened.page
        assert rows(page, "uid") == [str(s["uid"]) for s in samples]
        shown = first["status"] or "—"
        page.select_option("#filter-status", shown)
        assert rows(page, "status") == [shown] * sum(s["status"] == first["status"] for s in samples)
        page.locator("#samples tr.sample").first.click()
        program = first["program"] or first["code"]
        if program is None:
            assert "no code block" in page.inner_text("#program")
        else:
            assert page.locator("#program span.line").all_inner_texts() == program.split("\n")
    assert opened.errors == [] and opened.requests == []


def test_resume_after_kill_continues_the_same_run(finished_run):
    """A run continued to 4 steps is SIGKILLed once step 3 is checkpointed; the same command resumes."""
    workdir, _ = finished_run
    cfg = small_config(workdir)
    cmd = [
        sys.executable,
        "-m",
        "mle_jax.launch",
        "--config=configs/pizza.py:cpu",
        f"--config.workdir={workdir}",
        f"--config.task.data_root={cfg.task.data_root}",
        f"--config.task.raw_dir={cfg.task.raw_dir}",
        "--config.loop.steps=4",
        "--config.eval.samples=0",
    ]
    cmd += [f"--config.{k}={v}" for k, v in SMALL.items() if k not in ("loop.steps", "eval.samples")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    ckpt3 = workdir / "checkpoints" / "3"
    deadline = time.monotonic() + 600
    while not ckpt3.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    first_out = proc.communicate()[0].decode(errors="replace")
    assert ckpt3.exists(), first_out[-3000:]
    assert "resumed from step 2" in first_out

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "resumed from step 3" in out or "resumed from step 4" in out
    rows = read_metrics(workdir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # no step lost or written twice
    # every sample drawn by the three processes is trained once, discarded with a reason, or redrawn after the kill
    t = tally(read_ledger(workdir / LEDGER))
    assert t["lost"] == 0 and t["trained_twice"] == 0 and t["trained_steps"] == [1, 2, 3, 4], t
    assert t["sampled"] == t["trained"] + t["discarded"] + t["redrawn"] and t["trained"] > 0, t


def evaluate_cli(workdir: Path, *flags: str) -> subprocess.CompletedProcess:
    """`python -m mle_jax.evaluate --workdir=W FLAGS...`, its output captured."""
    cmd = [sys.executable, "-m", "mle_jax.evaluate", f"--workdir={workdir}", *flags]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_evaluate_cli_reloads_the_trained_policy(finished_run):
    """`python -m mle_jax.evaluate` rebuilds the policy from the run's checkpoints and tokenizer, writes a new dated
    evaluation file beside the run's own evaluation.json and rewrites report.md with it, saying so in one line."""
    workdir, _ = finished_run
    done = evaluate_cli(workdir, "--samples=3")  # not the run's 2: the file is the CLI's
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| scratch | 3 |" in done.stdout and "after RL 0.663" in done.stdout
    [dated] = workdir.glob("evaluation-2*.json")  # evaluation-<UTC date and time>.json
    ev = json.loads(dated.read_text())
    assert ev["scratch"]["samples"] == 3 and ev["improved"]["samples"] == 3 and ev["task"] == "random-acts-of-pizza"
    assert json.loads((workdir / "evaluation.json").read_text())["scratch"]["samples"] == 2  # the run's own, kept
    said = f"wrote {dated} (the run's own evaluation.json is kept) and rewrote {workdir / 'report.md'} with it"
    assert done.stdout.strip().splitlines()[-1] == said
    report = (workdir / "report.md").read_text()
    assert f"- **Evaluation** ({dated.name}): best of 3 scratch samples" in report and f"From {dated.name}." in report
    assert "| rl/steps |" in report  # the run's own figures, from run_summary.json


def test_evaluate_cli_evaluates_a_held_out_task(finished_run):
    """`evaluate --task ID` on a task the run never trained on: prepared from its raw data, graded by its grader."""
    workdir, _ = finished_run
    held = "spooky-author-identification"
    done = evaluate_cli(workdir, "--samples=2", f"--task={held}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ev = json.loads((workdir / f"evaluation-{held}.json").read_text())
    assert ev["task"] == held and ev["scratch"]["samples"] == 2
    assert ev["paper"]["qwen2.5-3b-rl"] == pytest.approx(0.404)  # spooky's Table 1 figure, not pizza's
    records = ev["scratch"]["records"]
    assert len(records) == 2 and all(r["task"] == held for r in records)
    bad = evaluate_cli(workdir, "--task=no-such-task")
    assert bad.returncode != 0 and "--task=no-such-task" in bad.stderr and "Traceback" not in bad.stderr


def _search_evaluations(workdir: Path) -> list[Path]:
    return [p for p in sorted(workdir.glob("evaluation-2*.json")) if "search" in json.loads(p.read_text())]


def test_evaluate_cli_searches_with_aide_and_writes_each_seeds_tree_and_medal(finished_run):
    """`evaluate --search aide --budget 6 --seeds 2`: per seed a tree of 6 nodes in the order they ran (AIDE's 5
    drafts first), each with its parent, operator, status, printed metric, Δt and, for analysis, score and medal; what
    each search submitted with its medal; the report draws the trees."""
    workdir, _ = finished_run
    done = evaluate_cli(workdir, "--search=aide", "--budget=6", "--seeds=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [path] = _search_evaluations(workdir)
    ev = json.loads(path.read_text())
    assert ev["search"]["name"] == "aide" and ev["search"]["budget"] == 6 and ev["search"]["seeds"] == [0, 1]
    assert (ev["search"]["num_drafts"], ev["search"]["debug_prob"], ev["search"]["max_debug_depth"]) == (5, 0.5, 3)
    task = ev["tasks"]["random-acts-of-pizza"]
    assert [s["seed"] for s in task["searches"]] == [0, 1] and task["summary"]["seeds"] == 2
    for rec in task["searches"]:
        nodes = rec["nodes"]
        assert [n["id"] for n in nodes] == list(range(6)) and [n["operator"] for n in nodes[:5]] == ["draft"] * 5
        assert all(n["parent"] is None for n in nodes[:5]) and nodes[5]["operator"] in ("draft", "debug", "improve")
        for n in nodes:
            assert {"status", "metric", "duration_s", "score", "medal"} <= set(n)
            assert (n["medal"] is None) == (n["score"] is None)
        sub = rec["submitted"]
        assert set(sub) == {"node", "metric", "valid", "score", "medal"}
        assert sub["valid"] == (sub["medal"] is not None)
        assert f"| random-acts-of-pizza | {rec['seed']} | " in done.stdout  # its tree and medal, printed
    report = (workdir / "report.md").read_text()
    assert "## Evaluation: search at test time" in report and "search `aide`" in report
    assert (workdir / "plots" / "search_random-acts-of-pizza.png").is_file()


def test_evaluate_cli_writes_the_protocols_tables(finished_run):
    """`--protocol mlebench --protocol ml_agent`: 8 runs per task (ML-Agent's), which are at least MLE-bench's 3
    seeds; each protocol's table in its own file with the command and the date."""
    workdir, _ = finished_run
    done = evaluate_cli(workdir, "--protocol=mlebench", "--protocol=ml_agent", "--budget=1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [mle] = workdir.glob("protocol-mlebench-*.json")
    [mla] = workdir.glob("protocol-ml_agent-*.json")
    mle, mla = json.loads(mle.read_text()), json.loads(mla.read_text())
    for table in (mle, mla):
        assert table["command"].startswith("python -m mle_jax.evaluate") and table["date"]
        assert table["search"]["name"] == "independent" and table["search"]["budget"] == 1
    assert mle["seeds"] == list(range(8)) and mle["lite"]["tasks"] == ["random-acts-of-pizza"]
    assert len(mle["lite"]["per_seed"]) == 8 and sum(mle["tasks"][0]["shares"].values()) == pytest.approx(1.0)
    (row,) = mla["rows"]
    assert row["runs"] == 8 and row["split"] == "held-in" and row["direction"] == "higher is better"
    assert "MLE-bench's protocol, 8 seeds" in done.stdout and "ML-Agent's protocol, 8 runs per task" in done.stdout


def test_evaluate_cli_refuses_a_bad_search_in_one_line(finished_run, tmp_path):
    """An unknown policy, a budget below 1, too few seeds for MLE-bench, a workdir without a policy, sizes past what
    one command runs (--seeds 1000000000 once took 24 GB before any check), a 0-byte or empty config.json: one line
    each, before any work."""
    workdir, _ = finished_run
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((workdir / "config.json").read_text())  # a run that never trained
    broken = {text: tmp_path / f"broken{i}" for i, text in enumerate(("", "{}"))}
    for text, where in broken.items():
        (where / "checkpoints" / "1").mkdir(parents=True)
        (where / "config.json").write_text(text)
    cases = [
        (workdir, ["--search=mcts", "--budget=2"], "flag --search=mcts: value should be one of"),
        (workdir, ["--search=aide", "--budget=0"], "--budget must be >= 1 program, got 0"),
        (bare, ["--search=aide", "--budget=2"], "has neither checkpoints/ nor hf_export/"),
        (workdir, ["--search=aide", "--budget=2", "--seeds=1000000000"],
         "--seeds=1,000,000,000 is more than one evaluate command runs (at most 1,000); raise MAX_SEEDS in"),
        (workdir, ["--budget=100000000"], "--budget=100,000,000 is more than one evaluate command runs"),
        (workdir, ["--samples=1000000000"], "--samples=1,000,000,000 is more than one evaluate command runs"),
        *((where, [], f"{where / 'config.json'} is not a run's config (") for where in broken.values()),
    ]  # fmt: skip
    # each case forked from one interpreter that imported the CLI once (tests/launch_forks.py)
    results = forked_runs([[f"--workdir={where}", *flags] for where, flags, _ in cases], "mle_jax.evaluate")
    for (_, _, message), done in zip(cases, results, strict=True):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
            lines
        )
