"""`python -m mle_jax.launch` under Ctrl-C and a full disk: one workdir, on a tmpfs of its own, goes through both
with the same command each time (the :cpu run without a warm start, steps of two samples, so that a step is
seconds): each stop is one line with nothing half-written left, and the run then resumes and finishes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mle_jax.infra.checkpoint import TMP_MARK
from mle_jax.infra.metrics import read_metrics
from mle_jax.run.stages import write_atomically

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
SMALL = {
    "warmstart.enabled": "false",
    "loop.steps": "3",
    "loop.batch_size": "2",
    "loop.in_flight_multiplier": "1",
    "ppo.mini_batch_size": "2",
    "ppo.micro_batch_size": "2",
    "eval.samples": "0",
    "instrument.mode": "ast",
    "sampler.max_tokens": "32",
}
# a checkpoint of this run is 12.6 MiB on disk (preflight counts 16.0 MiB, compression aside): the disk has room for
# preflight's one when the run starts, and holds two besides the tokenizer and metrics, not three
DISK_MIB = 34
RESUME = "run the same command to resume from its last checkpoint"


def whole(workdir: Path) -> None:
    """Nothing half-written: config.json reads back, no unfinished checkpoint folder, no temporary file."""
    assert json.loads((workdir / "config.json").read_text())["workdir"] == str(workdir)
    assert not list((workdir / "checkpoints").glob(f"*{TMP_MARK}*"))
    assert not list(workdir.glob(".config.json.*"))


def test_ctrl_c_and_a_full_disk_stop_in_one_line_and_the_same_command_resumes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(disk)], check=True)
    try:
        workdir = disk / "run"
        overrides = {**SMALL, "workdir": workdir, "task.data_root": tmp_path / "tasks"}
        cmd = [sys.executable, "-m", "mle_jax.launch", "--config=configs/pizza.py:cpu"]
        cmd += [f"--config.{k}={v}" for k, v in overrides.items()]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        # a fresh run fills the disk with its third checkpoint
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        lines = done.stderr.strip().splitlines() or [done.stdout[-2000:]]
        assert len(lines) == 1, done.stderr[-4000:]
        [line] = lines
        assert done.returncode == 1 and line.startswith(f"error: no space left on device writing {workdir}/checkpoints")
        assert "a checkpoint of this run takes 16.0 MiB" in line and line.endswith(RESUME), line
        whole(workdir)

        # too little room left for a checkpoint: preflight refuses before any work
        refused = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        [line] = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and line.startswith(f"error: workdir={workdir}: "), line
        assert "a checkpoint of this run takes 16.0 MiB; make " in line, line

        # config.json on a disk with no room at all: the old one stays whole
        saved = (workdir / "config.json").read_text()
        with (disk / "filler").open("wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * (1 << 20))
        with pytest.raises(OSError) as full:
            write_atomically(workdir / "config.json", saved + " ")
        assert full.value.errno == errno.ENOSPC
        assert (workdir / "config.json").read_text() == saved
        whole(workdir)
        # what a run killed mid-write leaves (an empty config.json of the old code, an unfinished step): coped with
        (workdir / "config.json").write_text("")
        (disk / "filler").unlink()
        (workdir / "checkpoints" / f"3{TMP_MARK}").mkdir()

        # room again: the same command resumes; Ctrl-C (to the process group, as a terminal sends it) once it has
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "resumed from step 2" in line:
                os.killpg(proc.pid, signal.SIGINT)
                break
        out, err = proc.communicate(timeout=300)
        out = "".join(seen) + out
        assert proc.returncode == 130, out[-2000:] + err[-3000:]
        assert "Traceback" not in err and "Fatal Python error" not in err, err[-3000:]
        *_, last = err.strip().splitlines()
        assert last.startswith("interrupted: stopped ") and last.endswith(RESUME), err
        assert [line for line in err.splitlines() if RESUME in line] == [last], err
        whole(workdir)

        # the same command resumes and finishes
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert "resumed from step" in done.stdout
        assert [r["step"] for r in read_metrics(workdir / "metrics.jsonl")] == [1, 2, 3]
        assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1", "2", "3"]
        assert (workdir / "report.md").is_file()
        whole(workdir)
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)
