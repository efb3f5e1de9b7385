"""The mix run's evidence file: per task before and after RL, the held-out task, the single-task runs beside."""

from __future__ import annotations

import json
from pathlib import Path

from mle_jax.experiments import mix_evidence

PIZZA, LEAF = "random-acts-of-pizza", "leaf-classification"


def evaluation(task: str, reward: float, valid: float) -> dict:
    medals = {"best": "none", "shares": {}, "any_medal": 0.0}
    scratch = {"samples": 4, "mean_reward": reward, "se_reward": 0.5, "valid_fraction": valid, "mean": 0.6,
               "max": 0.7, "medals": medals}  # fmt: skip
    return {"task": task, "scratch": scratch}


def test_gather_reads_both_evaluations_the_held_out_task_and_the_single_task_run(tmp_path: Path):
    w = tmp_path / "run"
    w.mkdir()
    (w / "evaluation-before.json").write_text(json.dumps({"task": PIZZA, "tasks": {PIZZA: evaluation(PIZZA, -5, 0.5)}}))
    (w / "evaluation.json").write_text(json.dumps({"task": PIZZA, "tasks": {PIZZA: evaluation(PIZZA, -3, 0.75)}}))
    (w / f"evaluation-{LEAF}-before.json").write_text(json.dumps(evaluation(LEAF, -10, 0.0)))
    (w / f"evaluation-{LEAF}.json").write_text(json.dumps(evaluation(LEAF, -9.9, 0.0)))
    (w / "samples.jsonl").write_text("".join(json.dumps({"task": PIZZA, "reward": -1}) + "\n" for _ in range(3)))
    (w / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    (w / "config.json").write_text(
        json.dumps({"loop": {"batch_size": 8}, "warmstart": {"steps": 600, "corpus_size": 64}})
    )
    (w / "report-before.md").write_text("| wall_s | 120.5 |\n| warmstart/wall_s | 60 |\n")
    (w / "report.md").write_text("| wall_s | 300 |\n| rl/wall_s | 200 |\n")
    script = tmp_path / "evidence.sh"
    script.write_text('set -x\n$PY -m mle_jax.launch "${COMMON[@]}" --config.loop.steps=0\necho done\n')
    d = mix_evidence.gather(w, LEAF, script, Path("docs/results"))
    t = d["tasks"][PIZZA]
    assert (t["before"]["mean_reward"], t["after"]["mean_reward"], t["rl_samples"]) == (-5, -3, 3)
    assert t["before"]["best_score"] == 0.7 and t["after"]["valid_fraction"] == 0.75
    assert t["single_task"]["folder"] == "learning-pizza" and t["single_task"]["rl_samples"] == 160
    assert d["held_out"]["task"] == LEAF and d["held_out"]["after"]["mean_reward"] == -9.9
    assert (d["wall_s_before"], d["warmstart_wall_s"], d["rl_wall_s"]) == (120.5, 60.0, 200.0)
    assert d["script"] == ['$PY -m mle_jax.launch "${COMMON[@]}" --config.loop.steps=0']
    assert d["command"] and d["date"]
