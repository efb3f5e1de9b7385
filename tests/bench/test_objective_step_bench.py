"""bench/objective_step.py (the lent GPU's update benchmark) runs its tiny shape on CPU, so that a lease's few minutes
are not spent on a broken script; its two MFU counts are the FLOPs they say they count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.model


def test_objective_step_bench_runs_on_cpu_and_counts_every_pass(tmp_path):
    out = tmp_path / "step.json"
    args = ["--algorithms=ppo,grpo", "--reps=1", "--seq=64", "--micro=8", "--peak_tflops=1", "--remat=true",
            "--remat_policy=dots", "--fused=true", "--scan_layers=false", f"--out={out}"]  # fmt: skip
    done = subprocess.run([sys.executable, "bench/objective_step.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["shape"] == "tiny" and d["remat_policy"] == "dots" and d["fused_logprobs"] and not d["scan_layers"]
    ppo, grpo = d["results"]["ppo"], d["results"]["grpo"]
    assert grpo["critic_matmul_params"] == 0 < ppo["critic_matmul_params"] < ppo["params"]
    for r in (ppo, grpo):
        # the reference's forward (2N) on top of the policy's training (6N), and a critic's forward and training
        every_pass = (8 * r["params"] + 8 * r["critic_matmul_params"]) / (6 * r["params"])
        assert r["model_tflops"] == pytest.approx(r["policy_tflops_6n"] * every_pass, rel=1e-9)
        assert r["mfu_model"] == pytest.approx(r["model_tflops"], rel=1e-9)  # a peak of 1 TFLOP/s
    assert d["step_time_ratio_to_ppo"]["grpo"] == pytest.approx(grpo["step_s"] / ppo["step_s"])
