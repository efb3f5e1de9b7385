"""The stages of one run: prepare the task → build model and tokenizer → warm start → RL → evaluate → report.

Each stage leaves its result in the workdir, so a run that is killed and started again with the
same workdir picks up where it was: the prepared task and tokenizer are reused, a finished warm
start is not redone, RL resumes from its last checkpoint. Under the launcher, Ctrl-C stops the run between
stages, or inside the warm start and RL between their steps (mle_jax/infra/interrupt.py), on the same terms. The run
config is read once, by `mle_jax.run.settings.from_config`; every stage gets typed settings.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from rich.console import Console

from mle_jax.env.evaluation import evaluate
from mle_jax.infra import interrupt, sharding
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import MetricsWriter, read_metrics
from mle_jax.models import hf
from mle_jax.reporting import report
from mle_jax.rl.hosts import BatchChannel, distributed_store, follow
from mle_jax.rl.loop import AsyncRLLoop
from mle_jax.run import builders, environment
from mle_jax.run.settings import RunSettings, from_config

console = Console()


def run(cfg: Any) -> dict:
    """Runs the config (a ConfigDict of configs/<task>.py) end to end; returns the report's summary."""
    return run_settings(from_config(cfg), config_json=cfg.to_json_best_effort(indent=2))


def run_settings(s: RunSettings, config_json: str | None = None) -> dict:
    """Runs the stages; `config_json` (the config the settings came from) is saved for `mle_jax.evaluate`."""
    t_run = time.monotonic()
    workdir = Path(s.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if config_json is not None:
        write_atomically(workdir / "config.json", config_json)
    multi_process = sharding.maybe_initialize_distributed()
    channel = BatchChannel(distributed_store()) if multi_process else None
    if channel is None:
        return _lead(s, None, workdir, t_run)
    if jax.process_index() != 0:
        summary = _follow(s, channel, workdir)
    else:
        try:
            summary = _lead(s, channel, workdir, t_run)
        except BaseException as e:
            channel.abort(f"{type(e).__name__}: {e}")
            raise
    # every process at jax.distributed's shutdown barrier now, not at interpreter exit (after any thread a library
    # left running has been joined)
    jax.distributed.shutdown()
    return summary


def write_atomically(path: Path, text: str) -> None:
    """Writes `text` to a temporary file beside `path`, then renames it over `path`: a full disk (or a kill) leaves
    the old file or the new one, never an empty or truncated one (preflight and `mle_jax.evaluate` read it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _follow(s: RunSettings, channel: BatchChannel, workdir: Path) -> dict:
    """A follower process of a multi-process run: the same model, learner and sampler sync as the leader, the
    leader's batches (rl/hosts.py); no environment, evaluation or report of its own."""
    tasks, packages = environment.prepare_mix(s)
    task = tasks[0]
    model, tokenizer, _ = builders.build_policy(s, tasks if len(tasks) > 1 else task, packages, workdir)
    learner = builders.make_learner(s, model)
    sampler = builders.make_sampler(s.sampler, model, tokenizer, workdir)
    ckpt = Checkpointer(workdir / "checkpoints", keep=s.checkpoint_keep)
    ls = s.loop
    steps = follow(
        channel, learner, sampler, ckpt, ls.steps, ls.sync_every, ls.checkpoint_every, s.resume, ls.sync_source
    )
    ckpt.close()
    nnx.update(model, learner.policy_state())
    hf.save_pretrained(model, workdir / "hf_export")  # its gathers are collective; process 0 writes
    channel.wait_finished()
    return {"task": task.id, "workdir": str(workdir), "process": jax.process_index(), "rl/steps": steps}


def _lead(s: RunSettings, channel: BatchChannel | None, workdir: Path, t_run: float) -> dict:
    """The run of the one process (or of process 0, the leader, of several): every stage."""
    console.rule(f"[bold]mle_jax: {', '.join(t.id for t in s.mix)}")
    tasks, packages = environment.prepare_mix(s)
    task = tasks[0]
    for t in tasks:
        console.print(f"task prepared: public={t.public_dir}")
    mix = tasks if len(tasks) > 1 else task
    interrupt.raise_if_requested("stopped after preparing the task")

    model, tokenizer, ws_metrics = builders.build_policy(s, mix, packages, workdir)
    interrupt.raise_if_requested("stopped before RL")
    summary: dict[str, Any] = {"task": task.id, "workdir": str(workdir)}
    if len(tasks) > 1:
        summary["tasks"] = ",".join(t.id for t in tasks)
    summary.update({f"warmstart/{k}": v for k, v in ws_metrics.items()})
    learner = builders.make_learner(s, model)
    with environment.open_environment(s, mix, packages, model, tokenizer, workdir) as env:
        writer = MetricsWriter(
            workdir,
            tensorboard=s.report.tensorboard,
            samples_mb=s.report.samples_mb,
            steps=s.loop.steps,
            output_chars=s.report.sample_output_chars,
        )
        ckpt = Checkpointer(workdir / "checkpoints", keep=s.checkpoint_keep)
        loop = AsyncRLLoop(s.loop, env, learner, ckpt, writer, channel=channel)
        try:  # on any way out: queued runs cancelled, checkpoint writes in flight finished
            resumed, seeded = builders.start_loop(loop, s, mix, packages, workdir, resume=s.resume)
            if resumed:
                console.print(f"resumed from step {loop.counters.step}")
            if seeded:
                console.print(f"improve buffer: {seeded} corpus programs (prompt.improve_seed)")
            if interrupt.watching():
                console.print(f"RL to step {s.loop.steps}: Ctrl-C stops it cleanly, the same command resumes it")
            t_rl = time.monotonic()
            loop.run(s.loop.steps)
        finally:
            loop.close()
        rl_s = time.monotonic() - t_rl
        interrupt.raise_if_requested(f"stopped after RL step {loop.counters.step}, before the export and evaluation")

        rows = read_metrics(workdir / "metrics.jsonl")
        c = loop.counters
        summary.update(
            {
                "rl/steps": c.step,
                "rl/wall_s": round(rl_s, 1),
                "rl/samples": c.sampled,
                "rl/resampled_stale": c.resampled_stale,
                **{f"rl/instrument_{path}_share": v for path, v in c.instrument_shares().items()},
                "rl/infra_failures": c.infra_failures,
                "rl/learner_idle_fraction": round(1 - c.update_s / max(c.wall_s, 1e-9), 3),
                "rl/executor_utilization": round(min(1.0, c.exec_busy_s / max(c.wall_s * env.fleet.n_slots, 1e-9)), 3),
            }
        )
        if rows:
            summary["valid_fraction/first_step"] = rows[0].get("valid_fraction")
            summary["valid_fraction/last_step"] = rows[-1].get("valid_fraction")
            key, pick = ("score/min", min) if task.lower_is_better else ("score/max", max)  # best, task direction
            best = [r[key] for r in rows if r.get(key) is not None]
            summary["score/best_during_rl"] = pick(best) if best else None

        # the trained policy as an HF folder, before the evaluation: in a multi-process run its gathers are
        # collective, so every process reaches them together; the followers then wait for the leader's report in
        # the key-value store (channel.finish), never inside a collective or the shutdown barrier
        nnx.update(model, learner.policy_state())
        hf.save_pretrained(model, workdir / "hf_export")
        tokenizer.save_pretrained(str(workdir / "hf_export"))

        evaluation = None
        if s.eval.samples > 0:
            evaluation = evaluate(s.eval, env)
            (workdir / "evaluation.json").write_text(json.dumps(evaluation, indent=2))
    summary["wall_s"] = round(time.monotonic() - t_run, 1)
    # kept for `mle_jax.evaluate`, which rewrites report.md with a later evaluation
    write_atomically(workdir / report.RUN_SUMMARY, json.dumps(summary, indent=2, default=report.jsonable))
    path = report.write_report(workdir, summary, evaluation, plots=s.report.plots)
    console.print(f"report: {path}")
    if channel is not None:
        channel.finish()
    return summary
