"""bench/gpu_step.py (the 3B GPU benchmark) runs its tiny shape on CPU, so that it cannot rot before a GPU is here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.model


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_gpu_step_bench_runs_on_cpu(algorithm, tmp_path):
    """GRPO's run trains LoRA adapters (as `:qwen` does) and appends its measurement to a results file."""
    lora = ["--lora_rank=4", f"--out={tmp_path / 'gpu.jsonl'}"] if algorithm == "grpo" else []
    done = subprocess.run([sys.executable, "bench/gpu_step.py", "--reps=1", f"--algorithm={algorithm}", "--group=4",
                           *lora], cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "model: tiny" in out and "MFU not defined" in out  # no bf16 peak on CPU
    assert f"{algorithm} update ({'with' if algorithm == 'ppo' else 'no'} critic)" in out
    update = float(re.search(r"step [\d.]+ s, (\d+) tokens/s, ([\d.e+]+) FLOPs/step", out).group(2))
    assert update > 1e9
    decode = int(re.search(r"in [\d.]+ s: (\d+) tokens/s", out).group(1))
    assert decode > 0 and "ratio update tokens/s / decode tokens/s" in out
    if lora:
        [record] = [json.loads(line) for line in (tmp_path / "gpu.jsonl").read_text().splitlines()]
        assert record["lora_rank"] == 4 and record["shape"] == "tiny" and record["mfu"] is None  # CPU: no bf16 peak
        # the record keeps one decimal, the line none: 4874.54 is printed 4875 and kept 4874.5
        assert abs(record["decode_tokens_per_s"] - decode) <= 0.55 and "command" in record and "date" in record
