"""Evaluation as in the paper (§4.1): N samples from scratch, each also improved once; graded; mean and max.

At test time the agent both solves from scratch and improves its own solution, and keeps the
better of the two. `python -m mle_jax.evaluate --workdir W [--samples N]` evaluates a run's
latest policy and prints our numbers beside the paper's Table 1.
"""

from __future__ import annotations

import json
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress

from mle_jax.executor.settings import ExecutorSettings
from mle_jax.report import markdown_table
from mle_jax.rl import rollout

# Paper Table 1: Qwen2.5-3B prompted with AIDE, and Qwen2.5-3B after RL (best of 128 samples).
PAPER_TABLE1: dict[str, dict[str, float]] = {
    "detecting-insults-in-social-commentary": {"qwen2.5-3b": 0.870, "qwen2.5-3b-rl": 0.895},
    "learning-agency-lab-automated-essay-scoring-2": {"qwen2.5-3b": 0.331, "qwen2.5-3b-rl": 0.746},
    "random-acts-of-pizza": {"qwen2.5-3b": 0.589, "qwen2.5-3b-rl": 0.663},
    "tweet-sentiment-extraction": {"qwen2.5-3b": 0.027, "qwen2.5-3b-rl": 0.596},
    "tabular-playground-series-may-2022": {"qwen2.5-3b": 0.787, "qwen2.5-3b-rl": 0.913},
    "tabular-playground-series-dec-2021": {"qwen2.5-3b": 0.827, "qwen2.5-3b-rl": 0.951},
    "us-patent-phrase-to-phrase-matching": {"qwen2.5-3b": 0.065, "qwen2.5-3b-rl": 0.527},
    "plant-pathology-2020-fgvc7": {"qwen2.5-3b": 0.628, "qwen2.5-3b-rl": 0.970},
    "leaf-classification": {"qwen2.5-3b": 0.884, "qwen2.5-3b-rl": 0.124},
    "nomad2018-predict-transparent-conductors": {"qwen2.5-3b": 0.178, "qwen2.5-3b-rl": 0.059},
    "spooky-author-identification": {"qwen2.5-3b": 0.596, "qwen2.5-3b-rl": 0.404},
    "lmsys-chatbot-arena": {"qwen2.5-3b": 11.48, "qwen2.5-3b-rl": 1.081},
}


def _run_all(samples: list[rollout.Sample], cfg: Any, task: Any, progress: Progress, label: str) -> None:
    job = progress.add_task(label, total=len(samples))
    progress.update(job, advance=sum(s.done for s in samples))
    futures = {s.future: s for s in samples if s.future is not None}
    while futures:
        done, _ = wait(list(futures), return_when="FIRST_COMPLETED")
        for f in done:
            rollout.finish(futures.pop(f), f.result(), task, cfg.reward)
            progress.advance(job)


def _summary(scores: list[float | None], lower_is_better: bool) -> dict:
    valid = [s for s in scores if s is not None]
    best = (min if lower_is_better else max)(valid) if valid else None
    return {
        "samples": len(scores),
        "valid_fraction": len(valid) / max(len(scores), 1),
        "mean": float(np.mean(valid)) if valid else None,
        "max": best,  # "max" = best in the task's direction, as the paper reports it
    }


def _score(s: rollout.Sample) -> float | None:
    return None if s.reward is None or not s.reward.valid else float(s.reward.score)


def evaluate(
    cfg: Any,
    task: Any,
    tokenizer: Any,
    packages: list[str],
    sampler: Any,
    instrument_fn: Any,
    fleet: Any,
    n: int,
    improve: bool = True,
) -> dict:
    """Scratch samples, then (if improve) one improvement of each; per pair the better is kept."""
    rng = np.random.default_rng(cfg.seed + 10_000)
    sampling = dict(
        temperature=cfg.sampler.temperature,
        top_p=cfg.sampler.top_p,
        top_k=cfg.sampler.top_k,
        max_tokens=cfg.sampler.max_tokens,
    )
    limits = ExecutorSettings(**cfg.executor.to_dict()).limits()
    lower = task.lower_is_better
    with Progress() as progress:
        prompts = rollout.make_prompts(
            task, tokenizer, packages, n, 0.0, None, rng, cfg.prompt.max_prompt_tokens, cfg.prompt.snippet_chars
        )
        scratch = rollout.sample_responses(sampler, prompts, sampling, 0)
        rollout.submit(scratch, instrument_fn, fleet, task, limits, cfg.reward)
        _run_all(scratch, cfg, task, progress, "eval: from scratch")
        out = {"task": task.id, "scratch": _summary([_score(s) for s in scratch], lower)}
        if improve:
            parents = [rollout.to_previous(s, cfg.prompt.output_tail_chars) for s in scratch]
            from mle_jax.tasks import prompts as prompt_lib

            items = []
            for p in parents:
                msgs = prompt_lib.improve_messages(task, packages, p.plan, p.code, p.output)
                ids = prompt_lib.render_prompt(msgs, tokenizer, cfg.prompt.max_prompt_tokens)
                items.append(rollout.PromptItem("improve", ids, p))
            improved = rollout.sample_responses(sampler, items, sampling, n)
            rollout.submit(improved, instrument_fn, fleet, task, limits, cfg.reward)
            _run_all(improved, cfg, task, progress, "eval: improve")
            out["improved"] = _summary([_score(s) for s in improved], lower)
            better = []
            for a, b in zip(scratch, improved, strict=True):
                sa, sb = _score(a), _score(b)
                cands = [x for x in (sa, sb) if x is not None]
                better.append((min if lower else max)(cands) if cands else None)
            out["best_of_both"] = _summary(better, lower)
    paper = PAPER_TABLE1.get(task.id)
    if paper:
        out["paper"] = paper
    return out


def format_table(result: dict) -> str:
    paper = result.get("paper", {})
    rows = []
    for name in ("scratch", "improved", "best_of_both"):
        if name in result:
            r = result[name]
            rows.append([name, r["samples"], r["valid_fraction"], r["mean"], r["max"]])
    table = markdown_table(["", "samples", "valid fraction", "mean", "best"], rows)
    if paper:
        table += (
            f"\n\nPaper, Table 1 ({result['task']}, best of 128): Qwen2.5-3B prompted {paper['qwen2.5-3b']}, "
            f"after RL {paper['qwen2.5-3b-rl']}"
        )
    return table


def main(argv: list[str]) -> None:
    del argv
    import ml_collections

    from mle_jax import run as run_lib
    from mle_jax.executor.fleet import make_fleet
    from mle_jax.executor.runtime import sandbox_packages
    from mle_jax.instrument import instrument_batch

    workdir = Path(_WORKDIR.value)
    cfg_path = workdir / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found: --workdir must be a run's workdir")
    cfg = ml_collections.ConfigDict(json.loads(cfg_path.read_text()))
    cfg.workdir = str(workdir)
    task = run_lib.prepare_task(cfg)
    model, tokenizer = run_lib.load_trained_policy(cfg, task, workdir)
    sampler = run_lib.make_sampler(cfg, model, tokenizer, workdir)
    fleet = make_fleet(ExecutorSettings(**cfg.executor.to_dict()))
    try:
        from functools import partial

        instrument_fn = partial(instrument_batch, mode="ast" if cfg.instrument.mode == "lm" else cfg.instrument.mode)
        result = evaluate(
            cfg,
            task,
            tokenizer,
            sandbox_packages(),
            sampler,
            instrument_fn,
            fleet,
            n=_SAMPLES.value or cfg.eval.samples,
            improve=cfg.eval.improve,
        )
    finally:
        fleet.close()
    (workdir / "evaluation.json").write_text(json.dumps(result, indent=2))
    print(format_table(result))


if __name__ == "__main__":
    from absl import app, flags

    _WORKDIR = flags.DEFINE_string("workdir", None, "a run's workdir", required=True)
    _SAMPLES = flags.DEFINE_integer("samples", 0, "samples (0: the run's eval.samples, default 128)")
    app.run(main)
