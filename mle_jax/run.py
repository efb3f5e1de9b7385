"""The stages of one run: prepare the task → build model and tokenizer → warm start → RL → evaluate → report.

Each stage leaves its result in the workdir, so a run that is killed and started again with the
same workdir picks up where it was: the prepared task and tokenizer are reused, a finished warm
start is not redone, RL resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

from flax import nnx
from rich.console import Console

from mle_jax import checkpoint, evaluate, report, sharding
from mle_jax.executor.fleet import make_fleet
from mle_jax.executor.runtime import sandbox_packages
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.instrument import instrument_batch
from mle_jax.models import hf
from mle_jax.models import tokenizer as tok_lib
from mle_jax.models.value import Qwen2ValueModel
from mle_jax.rl.learner import Learner
from mle_jax.rl.loop import AsyncRLLoop
from mle_jax.tasks import prepare as prepare_lib
from mle_jax.tasks import registry
from mle_jax.tasks.task import Task

console = Console()


def prepare_task(cfg: Any) -> Task:
    """The task's prepared/ folder: given, or made from the raw Kaggle files (idempotent)."""
    if cfg.task.prepared_dir:
        return registry.load_task(cfg.task.id, Path(cfg.task.prepared_dir))
    raw = Path(cfg.task.raw_dir) / cfg.task.id
    if not raw.is_dir():
        raise FileNotFoundError(
            f"no raw data for {cfg.task.id} at {raw}; pass --config.task.prepared_dir=<MLE-bench prepared/ folder> "
            f"or --config.task.raw_dir=<folder with {cfg.task.id}/>"
        )
    return prepare_lib.prepare(cfg.task.id, raw, Path(cfg.task.data_root) / cfg.task.id / "prepared")


def build_policy(cfg: Any, task: Task, packages: list[str], workdir: Path) -> tuple[Any, Any, dict]:
    """(policy model, tokenizer, warm-start metrics).

    With `warmstart.enabled`, the policy is the warm-start stage's fine-tuned model (a finished stage
    is loaded, not redone). Else a checkpoint at `model.path`, or a tiny random model with a task BPE
    tokenizer trained on the task's program corpus.
    """
    if cfg.warmstart.enabled:
        from mle_jax.executor.sandbox import make_sandbox
        from mle_jax.warmstart.stage import warm_start

        sandbox = make_sandbox(ExecutorSettings(**cfg.executor.to_dict()))
        ws = warm_start(cfg, task, sandbox, packages, workdir / "warmstart")
        metrics = {
            "corpus_verified": len(ws.verified),
            **{k: v for k, v in ws.metrics.items() if isinstance(v, int | float | str)},
        }
        return ws.model, ws.tokenizer, metrics
    if cfg.model.path:
        return (
            hf.from_pretrained(cfg.model.path, dtype=model_dtype(cfg), **hf.runtime_options(cfg.model)),
            tok_lib.load_tokenizer(cfg.model.path),
            {},
        )
    from mle_jax.tasks.prompts import scratch_messages
    from mle_jax.warmstart import corpus as corpus_lib
    from mle_jax.warmstart.sft import train_task_tokenizer
    from mle_jax.warmstart.stage import build_policy as random_policy

    tok_dir = workdir / "tokenizer"
    if (tok_dir / "tokenizer.json").exists():
        tokenizer = tok_lib.load_tokenizer(tok_dir)
    else:
        items = corpus_lib.generate_corpus(task.spec, cfg.warmstart.corpus_size, cfg.seed, packages)
        tokenizer = train_task_tokenizer(
            [it.response() for it in items],
            [scratch_messages(task, packages, cfg.prompt.snippet_chars)],
            cfg.model.vocab_size,
            tok_dir,
            cfg.warmstart.tokenizer_max_token_length,
        )
    return random_policy(cfg.model, len(tokenizer)), tokenizer, {}


def load_trained_policy(cfg: Any, task: Task, workdir: Path) -> tuple[Any, Any]:
    """The latest policy of a run: its last RL checkpoint, else its HF export."""
    model, tokenizer, _ = build_policy(cfg, task, sandbox_packages(), workdir)
    ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=cfg.checkpoint.keep)
    step = ckpt.latest_step()
    if step is not None:
        value = Qwen2ValueModel.from_policy(model, rngs=nnx.Rngs(cfg.seed + 1))
        learner = Learner(cfg, model, value, sharding.make_mesh(cfg.mesh))
        items = ckpt.restore(step, {"learner": learner.state_dict(), "loop": None})
        learner.load_state_dict(items["learner"])
        nnx.update(model, learner.policy_state())
        return model, tokenizer
    export = workdir / "hf_export"
    if (export / "config.json").exists():
        return hf.from_pretrained(
            export, dtype=model_dtype(cfg), **hf.runtime_options(cfg.model)
        ), tok_lib.load_tokenizer(export)
    raise FileNotFoundError(f"{workdir} has neither checkpoints/ nor hf_export/: nothing to evaluate")


def model_dtype(cfg: Any) -> Any:
    import jax.numpy as jnp

    return jnp.dtype(cfg.model.dtype)


def make_sampler(cfg: Any, model: Any, tokenizer: Any, workdir: Path, frozen: bool = False):
    if cfg.sampler.backend == "jax":
        from mle_jax.sampling.jax_sampler import JaxSampler

        return JaxSampler(model, tokenizer)
    if cfg.sampler.backend == "vllm":
        from mle_jax.sampling import vllm

        url = cfg.instrument.vllm_url if frozen else cfg.sampler.vllm_url
        if not url:
            raise ValueError(
                "sampler.backend='vllm' needs --config.sampler.vllm_url (and instrument.vllm_url for the "
                "frozen instrumenter); launch/gpu_node.sh starts both servers"
            )
        return vllm.VLLMSampler(url, tokenizer, export_dir=workdir / "vllm_export")
    raise ValueError(f"unknown sampler.backend {cfg.sampler.backend!r}: use 'jax' or 'vllm'")


def run(cfg: Any) -> dict:
    t_run = time.monotonic()
    workdir = Path(cfg.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(cfg.to_json_best_effort(indent=2))
    sharding.maybe_initialize_distributed()

    console.rule(f"[bold]mle_jax: {cfg.task.id}")
    task = prepare_task(cfg)
    console.print(f"task prepared: public={task.public_dir}")

    packages = sandbox_packages()
    model, tokenizer, ws_metrics = build_policy(cfg, task, packages, workdir)
    summary: dict[str, Any] = {"task": task.id, "workdir": str(workdir)}
    summary.update({f"warmstart/{k}": v for k, v in ws_metrics.items()})
    fleet = make_fleet(ExecutorSettings(**cfg.executor.to_dict()))
    try:
        mesh = sharding.make_mesh(cfg.mesh)
        value = Qwen2ValueModel.from_policy(model, rngs=nnx.Rngs(cfg.seed + 1))
        learner = Learner(cfg, model, value, mesh)
        sampler = make_sampler(cfg, model, tokenizer, workdir)
        frozen = None
        if cfg.instrument.mode == "lm":  # a frozen copy of the initial model inserts the progress prints
            frozen = make_sampler(cfg, nnx.clone(model), tokenizer, workdir, frozen=True)
        instrument_fn = partial(
            instrument_batch,
            mode=cfg.instrument.mode,
            sampler=frozen,
            tokenizer=tokenizer,
            max_tokens=cfg.instrument.max_tokens,
            max_prompt_tokens=cfg.instrument.max_prompt_tokens,
            temperature=cfg.instrument.temperature,
        )
        writer = report.MetricsWriter(workdir, tensorboard=cfg.report.tensorboard)
        ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=cfg.checkpoint.keep)
        loop = AsyncRLLoop(cfg, task, tokenizer, packages, sampler, instrument_fn, fleet, learner, ckpt, writer)
        if cfg.resume and loop.restore():
            console.print(f"resumed from step {loop.counters.step}")
        t_rl = time.monotonic()
        loop.run(cfg.loop.steps)
        loop.close()
        rl_s = time.monotonic() - t_rl

        rows = report.read_metrics(workdir / "metrics.jsonl")
        c = loop.counters
        summary.update(
            {
                "rl/steps": c.step,
                "rl/wall_s": round(rl_s, 1),
                "rl/samples": c.sampled,
                "rl/dropped_stale": c.dropped_stale,
                "rl/infra_failures": c.infra_failures,
                "rl/learner_idle_fraction": round(1 - c.update_s / max(c.wall_s, 1e-9), 3),
                "rl/executor_utilization": round(min(1.0, c.exec_busy_s / max(c.wall_s * fleet.n_slots, 1e-9)), 3),
            }
        )
        if rows:
            summary["valid_fraction/first_step"] = rows[0].get("valid_fraction")
            summary["valid_fraction/last_step"] = rows[-1].get("valid_fraction")
            best = [r["score/max"] for r in rows if r.get("score/max") is not None]
            summary["score/best_during_rl"] = (min if task.lower_is_better else max)(best) if best else None

        evaluation = None
        if cfg.eval.samples > 0:
            evaluation = evaluate.evaluate(
                cfg,
                task,
                tokenizer,
                packages,
                sampler,
                instrument_fn,
                fleet,
                n=cfg.eval.samples,
                improve=cfg.eval.improve,
            )
            (workdir / "evaluation.json").write_text(json.dumps(evaluation, indent=2))
        nnx.update(model, learner.policy_state())
        hf.save_pretrained(model, workdir / "hf_export")
        tokenizer.save_pretrained(str(workdir / "hf_export"))
    finally:
        fleet.close()
    summary["wall_s"] = round(time.monotonic() - t_run, 1)
    path = report.write_report(workdir, summary, evaluation)
    console.print(f"report: {path}")
    return summary
