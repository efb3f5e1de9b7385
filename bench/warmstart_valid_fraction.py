"""Warm start on the embedded config: how many sampled programs run and grade, before vs after SFT.

    PYTHONPATH=. .venv/bin/python bench/warmstart_valid_fraction.py [--config configs/pizza.py:cpu] [--samples 32]
        [--workdir DIR] [--steps N] [--sandbox-python PATH] [--packages a,b,c]

Prepares the task, runs the warm-start stage (corpus -> verify in the sandbox -> task tokenizer -> SFT),
then samples `--samples` responses from each of the two RL prompts at the config's temperature with the
JAX sampler and runs each through the same sandbox and grader as RL (instrumented as RL does):
  scratch: the RL scratch prompt;
  improve: RL improve prompts about verified corpus programs (plan, code and the captured terminal
           output of their instrumented run), one source program per sample, drawn by --seed.
The peer in the same run is the same model before SFT (random init). Prints wall times of each stage,
prompt lengths and the valid fractions per prompt kind.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mle_jax.executor.runtime import sandbox_packages
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.instrument import instrument_batch
from mle_jax.run.builders import local_sampler
from mle_jax.run.settings import RunSettings, from_config
from mle_jax.tasks.graders import grade
from mle_jax.tasks.prepare import prepare
from mle_jax.tasks.prompts import parse_response, render_prompt, scratch_messages
from mle_jax.warmstart.improve import improve_prompt
from mle_jax.warmstart.stage import fresh_policy, warm_start


def load_config(spec: str):
    path, _, arg = spec.partition(":")
    mod_spec = importlib.util.spec_from_file_location("bench_cfg", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


def build_prompts(kind: str, tokenizer, task, s: RunSettings, packages, verified, n: int, seed: int) -> list[list[int]]:
    """n prompt token lists of one kind: the scratch prompt n times, or improve prompts about n verified
    programs (each once while they last, drawn by seed), rendered with the RL budget."""
    budget = s.rollout.prompt.max_prompt_tokens
    if kind == "scratch":
        return [render_prompt(scratch_messages(task, packages, s.rollout.prompt.snippet_chars), tokenizer, budget)] * n
    rng = random.Random(seed)
    sources = []
    while len(sources) < n:
        sources += rng.sample(list(verified), min(len(verified), n - len(sources)))
    return [render_prompt(improve_prompt(task, packages, v), tokenizer, budget) for v in sources]


def evaluate(
    model, tokenizer, prompts: list[list[int]], task, sandbox, limits, s: RunSettings, seed: int, workers: int
) -> dict:
    """Samples one response per prompt; counts those with code, that exit ok, that grade valid."""
    sampler = local_sampler(s.sampler)(model, tokenizer)
    t0 = time.perf_counter()
    comps = sampler.generate(prompts, n=1, seed=seed, **s.rollout.sampling.generate_kwargs())
    sample_s = time.perf_counter() - t0
    mode = "off" if s.instrument.mode == "off" else "ast"

    def one(text: str):
        code = parse_response(text).code
        if code is None:
            return "no code", None
        res = sandbox.run(instrument_batch([code], mode)[0].code, task, limits)
        if str(res.status) != "ok":
            return f"{res.status}: {(res.stderr_tail.strip().splitlines() or [''])[-1][:100]}", None
        g = grade(task, res.submission_path)
        return ("valid" if g.valid else f"invalid: {g.reason[:100]}"), (g.score if g.valid else None)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(one, [c.text for c in comps]))
    scores = [s for _, s in outcomes if s is not None]
    kinds: dict[str, int] = {}
    for o, _ in outcomes:
        kinds[o] = kinds.get(o, 0) + 1
    n = len(prompts)
    return {
        "valid_fraction": len(scores) / n,
        "n": n,
        "mean_score": statistics.mean(scores) if scores else None,
        "max_score": max(scores) if scores else None,
        "sample_s": sample_s,
        "run_s": time.perf_counter() - t0,
        "mean_response_tokens": statistics.mean(len(c.token_ids) for c in comps),
        "outcomes": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/pizza.py:cpu")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--steps", type=int, default=0, help="override cfg.warmstart.steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sandbox-python", default="", help="override cfg.executor.sandbox_python")
    ap.add_argument("--packages", default="", help="comma list; default: probe the sandbox venv")
    args = ap.parse_args()
    cfg = load_config(args.config)
    if args.steps:
        cfg.warmstart.steps = args.steps
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mle-jax-warmstart-bench-"))
    t0 = time.perf_counter()
    task = prepare(
        cfg.task.id, Path(cfg.task.raw_dir) / cfg.task.id, Path(cfg.task.data_root) / cfg.task.id / "prepared"
    )
    prep_s = time.perf_counter() - t0
    if args.sandbox_python:
        cfg.executor.sandbox_python = args.sandbox_python
    s = from_config(cfg)
    sandbox = make_sandbox(s.executor)
    packages = (
        args.packages.split(",")
        if args.packages
        else sandbox_packages(Path(cfg.executor.sandbox_python).parent.parent if cfg.executor.sandbox_python else None)
    )
    limits = s.rollout.limits
    workers = s.executor.slots or 2

    t0 = time.perf_counter()
    ws = warm_start(s.warmstart, task, sandbox, packages, workdir / "warmstart", local_sampler(s.sampler))
    stage_s = time.perf_counter() - t0
    prompts = {
        kind: build_prompts(kind, ws.tokenizer, task, s, packages, ws.verified, args.samples, args.seed)
        for kind in ("scratch", "improve")
    }
    untrained = fresh_policy(s.model, len(ws.tokenizer))
    results = {}
    for kind, ids in prompts.items():
        results[kind] = {
            "after SFT": evaluate(ws.model, ws.tokenizer, ids, task, sandbox, limits, s, args.seed, workers),
            "before SFT": evaluate(untrained, ws.tokenizer, ids, task, sandbox, limits, s, args.seed, workers),
        }
    m = ws.metrics
    print(
        f"config {args.config}: model layers={cfg.model.num_hidden_layers} hidden={cfg.model.hidden_size} "
        f"vocab={cfg.model.vocab_size} (tokenizer {len(ws.tokenizer)})"
    )
    print(
        f"prepare {prep_s:.1f}s | warm-start stage {stage_s:.1f}s (SFT {m['wall_s']:.1f}s, "
        f"{m['steps']} steps, loss {m['first_loss']:.3f} -> {m['final_loss']:.3f}; corpus {m['corpus']} "
        f"programs, mean AUC {m['corpus_score_mean']:.3f}; prompt {m['prompt_len']} + response "
        f"{m['response_len']} tokens; {m.get('improve_examples', 0)} of {m['examples']} examples on the "
        f"improve prompt)"
    )
    budget = int(cfg.prompt.max_prompt_tokens)
    for kind, ids in prompts.items():
        lens = [len(p) for p in ids]
        print(f"{kind} prompt: {min(lens)}-{max(lens)} tokens (budget {budget})")
    for kind, by_model in results.items():
        for name, r in by_model.items():
            print(
                f"{kind:>8} {name:>10}: valid {r['valid_fraction']:.0%} of {r['n']} (mean score "
                f"{r['mean_score']}, max {r['max_score']}); sampling {r['sample_s']:.1f}s, running "
                f"{r['run_s']:.1f}s, {r['mean_response_tokens']:.0f} tokens/response; {r['outcomes']}"
            )
    for kind, by_model in results.items():
        print(
            f"{kind} valid fraction after/before: {by_model['after SFT']['valid_fraction']:.2f} / "
            f"{by_model['before SFT']['valid_fraction']:.2f}"
        )


if __name__ == "__main__":
    main()
