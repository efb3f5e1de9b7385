"""The warm-start stage of a run: corpus -> verified corpus -> tokenizer -> model -> SFT -> saved policy.

Called by the launcher before RL when `cfg.warmstart.enabled`. Everything it writes lives under
`workdir` (default `<cfg.workdir>/warmstart`):

    verified.jsonl   one line per corpus program run: sha256 of the code, valid, score, duration_s and
                     output (the terminal output of its instrumented run, as an improve prompt shows
                     it); a resumed stage does not run a program twice
    tokenizer/       the task BPE tokenizer (only for runs without a checkpoint, cfg.model.path == "")
    sft_ckpt/        orbax checkpoints of the SFT (params, optimizer state, grain iterator state)
    sft_metrics.jsonl  the loss curve
    faults.jsonl     the runs of corpus and held-out programs with injected faults (warmstart.debug_fraction,
                     debug_eval): a resumed stage runs none twice
    debug_heldout.jsonl  the warm-started policy's turn 2 after each held-out faulty run (warmstart.debug_eval)
    policy/          the fine-tuned policy in HF safetensors form + tokenizer, and DONE when complete:
                     a later call returns it without redoing anything
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from flax import nnx

from mle_jax.env.improve_buffer import PreviousSolution
from mle_jax.executor.backend import Sandbox
from mle_jax.instrument.tagging import strip_agent_progress
from mle_jax.models.hf import from_pretrained, save_pretrained
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.settings import ModelSettings
from mle_jax.models.tokenizer import load_tokenizer
from mle_jax.sampling.protocol import Sampler
from mle_jax.tasks.prompts import scratch_messages
from mle_jax.tasks.task import Task
from mle_jax.warmstart.corpus import CorpusItem, VerifiedItem, sandbox_run_fn, select_balanced, verify_corpus
from mle_jax.warmstart.debug import debug_count, debug_examples, debug_prompt, fix_metrics, heldout_fixes
from mle_jax.warmstart.faults import FaultyRun, ObserveFn, plan_faults, run_faults, sandbox_observe_fn
from mle_jax.warmstart.improve import improve_count, improve_examples
from mle_jax.warmstart.instrumentation import heldout_instrumentation, instrument_examples, split_programs
from mle_jax.warmstart.programs import full_grid, generate_corpus, solution_kind
from mle_jax.warmstart.settings import WarmStartSettings
from mle_jax.warmstart.sft import (
    Messages,
    copy_pretrain,
    run_sft,
    train_task_tokenizer,
)


@dataclass
class WarmStart:
    model: Qwen2ForCausalLM  # the fine-tuned policy
    tokenizer: Any
    verified: list[VerifiedItem]
    metrics: dict[str, Any]
    policy_dir: Path  # HF folder (config.json, model.safetensors, tokenizer files)


def _sha(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def verify_cached(
    items: Sequence[CorpusItem], task: Any, run_fn: Any, cache_path: Path, workers: int, progress: bool = True
) -> list[VerifiedItem]:
    """verify_corpus with a JSONL cache keyed by the code's sha256 (valid and invalid runs both cached).

    Records without a captured output (written before outputs were kept) are run again, and so are runs that
    timed out (the machine's doing, e.g. too many at once: the next attempt may have other settings)."""
    seen: dict[str, dict] = {}
    if cache_path.is_file():
        for line in cache_path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if "output" in rec and not _timed_out(rec.get("reason", "")):  # a timeout is run again
                    seen[rec["sha256"]] = rec
    todo = [it for it in items if _sha(it.code) not in seen]
    if todo:
        with cache_path.open("a") as f:

            def record(it: CorpusItem, v: VerifiedItem | None, reason: str) -> None:  # as each run ends: kill-safe
                rec = {
                    "sha256": _sha(it.code),
                    "valid": v is not None,
                    "reason": reason,
                    "score": v.score if v else None,
                    "duration_s": v.duration_s if v else None,
                    "output": v.output if v else None,
                    "meta": {**it.meta, "hparams": str(it.meta["hparams"])},
                }
                seen[rec["sha256"]] = rec
                f.write(json.dumps(rec) + "\n")
                f.flush()

            verify_corpus(todo, task, run_fn, workers, progress, on_result=record)
    out = []
    for it in items:
        rec = seen[_sha(it.code)]
        if rec["valid"]:
            out.append(VerifiedItem(it, float(rec["score"]), float(rec["duration_s"]), rec["output"]))
    return out


def _kind(task_id: str, item: CorpusItem) -> str:
    return solution_kind(task_id, item.code)


def _dir(workdir: Path, task: Task, tasks: Sequence[Task]) -> Path:
    """Where a task's runs are cached: the workdir, or its folder of the task's id in a mix."""
    return workdir if len(tasks) == 1 else workdir / task.id


def _timed_out(reason: str) -> bool:
    return "timeout" in reason.lower()


def verified_reasons(cache_path: Path) -> list[str]:
    """The reasons of the invalid runs in a verify_cached cache, the last record of each program deciding
    (records written before reasons were kept: "")."""
    recs = [json.loads(line) for line in cache_path.read_text().splitlines() if line.strip()]
    last = {r["sha256"]: r for r in recs}
    return [r.get("reason", "") for r in last.values() if not r["valid"]]


def corpus_failure_message(
    task_id: str, n_items: int, reasons: Sequence[str], settings: WarmStartSettings, cache_path: Path
) -> str:
    """One message for a corpus that did not all run and grade: how many, why, and what to change.

    Runs that hit the verification timeout are the machine's doing (too many programs at once for its cores,
    or a slow machine), not the generator's, and the message says which settings to change."""
    timeouts = sum(_timed_out(r) for r in reasons)
    msg = f"{len(reasons)} of {n_items} warm-start programs for {task_id} did not run and grade (see {cache_path})"
    if timeouts:
        return (
            f"{msg}: {timeouts} hit the {settings.verify_timeout_s:g} s verification timeout with "
            f"{settings.verify_workers} running at once on {os.cpu_count()} CPUs; lower "
            "--config.warmstart.verify_workers or raise --config.warmstart.verify_timeout_s and run again "
            "(the runs that timed out are run again, the others are kept)"
        )
    first = next((r for r in reasons if r), "")
    return f"{msg}; the corpus generator must write valid ones" + (f" (first reason: {first[:300]})" if first else "")


def sft_examples(
    settings: WarmStartSettings,
    task: Task,
    packages: Sequence[str],
    verified: Sequence[VerifiedItem],
    instrument_programs: Sequence[str] = (),
    debug: Sequence[tuple[Messages, str]] = (),
) -> tuple[list[tuple[Messages, str]], list[Messages]]:
    """The SFT set and its distinct prompt chats (what the task tokenizer is trained on with the responses).

    One example per verified program on the scratch prompt, then `improve_count(...)` examples on the
    improve prompt (`mle_jax.warmstart.improve`), so that `settings.improve_fraction` of the solving examples
    teach the prompt RL uses for that share of its samples; then the `debug` examples (turn 2 after a faulty run,
    `mle_jax.warmstart.debug`); then one instrumentation example (C.3) per program of `instrument_programs`
    (`mle_jax.warmstart.instrumentation`). Scratch examples come first.
    """
    messages = scratch_messages(task, list(packages), settings.prompt.snippet_chars)
    examples = [(messages, v.item.response()) for v in verified]
    n_improve = improve_count(len(verified), settings.improve_fraction)
    kind_of = partial(_kind, task.id) if settings.improve_to_better_kind else None
    examples += improve_examples(task, packages, verified, n_improve, settings.seed, kind_of)
    examples += list(debug)
    examples += instrument_examples(instrument_programs, settings.instrument_redrawn, settings.seed)
    chats = list({json.dumps(m): m for m, _ in examples}.values())
    return examples, chats


def observe_fn(settings: WarmStartSettings, sandbox: Sandbox, task: Task) -> ObserveFn:
    """Runs a program as the corpus verification runs it (its limits and instrumenter), observed as RL observes it."""
    mode = "off" if settings.instrument.mode == "off" else "ast"
    return sandbox_observe_fn(sandbox, task, settings.verify_limits(), mode, settings.prompt.output_tail_chars)


def corpus_faults(
    settings: WarmStartSettings,
    task: Task,
    observe: ObserveFn,
    verified: Sequence[VerifiedItem],
    cache: Path,
    progress: bool = True,
) -> tuple[int, list[FaultyRun]]:
    """(faulty programs run, the runs that failed): `debug_count` faults injected into the verified programs
    (`faults.plan_faults`: programs and kinds in turn), each run in the sandbox (cached in `cache`)."""
    n_solving = len(verified) + improve_count(len(verified), settings.improve_fraction)
    planned = plan_faults([v.item for v in verified], debug_count(n_solving, settings.debug_fraction), settings.seed)
    runs = run_faults(planned, observe, cache, settings.verify_workers, progress, f"{task.id} faulty programs")
    return len(planned), runs


def heldout_faults(
    settings: WarmStartSettings,
    task: Task,
    observe: ObserveFn,
    packages: Sequence[str],
    exclude: set[str],
    n: int,
    cache: Path,
    progress: bool = True,
) -> list[FaultyRun]:
    """Faulty runs of up to n grid programs outside the SFT set (no program of `exclude`, agent prints stripped),
    chosen balanced over model families, one fault each (kinds in turn), kept when they fail."""
    rest = [it for it in full_grid(task.id, packages) if strip_agent_progress(it.code) not in exclude]
    picked = select_balanced(rest, min(n, len(rest)), settings.seed + 2) if rest and n else []
    planned = plan_faults(picked, len(picked), settings.seed + 3)
    return run_faults(planned, observe, cache, settings.verify_workers, progress, f"{task.id} held-out faulty programs")


def sft_programs(
    settings: WarmStartSettings,
    tasks: Sequence[Task],
    packages: Sequence[str],
    verified_by_task: Sequence[Sequence[VerifiedItem]],
) -> list[set[str]]:
    """Each task's programs in the SFT set (corpus and instrumentation programs, agent prints stripped): what the
    held-out turn-2 measurement leaves out."""
    n_instrument = -(-settings.instrument_examples // len(tasks))
    out = []
    for t, vs in zip(tasks, verified_by_task, strict=True):
        programs, _ = split_programs(t.id, packages, n_instrument, settings.seed + 1, [v.item for v in vs])
        out.append({strip_agent_progress(v.item.code) for v in vs} | set(programs[:n_instrument]))
    return out


def measure_turn_two(
    settings: WarmStartSettings,
    tasks: Sequence[Task],
    sandbox: Sandbox,
    packages: Sequence[str],
    in_sft: Sequence[set[str]],
    model: Qwen2ForCausalLM,
    tokenizer: Any,
    workdir: Path,
    local_sampler: Callable[..., Sampler],
    progress: bool = True,
) -> dict[str, Any]:
    """The warm-started policy's turn 2 after faulty runs of held-out grid programs (`warmstart.debug_eval` of them,
    split over the tasks; none of `in_sft`): sampled with the run's sampling settings (one seeded generate call per
    task), run and graded in the sandbox. Writes each try to workdir/debug_heldout.jsonl; returns the
    `debug_heldout_*` metrics (`debug.fix_metrics`)."""
    records: list[dict] = []
    sampler = local_sampler(model, tokenizer, seed=settings.seed)
    n_eval = -(-settings.debug_eval // len(tasks))  # each task's share, rounded up
    for t, exclude in zip(tasks, in_sft, strict=True):
        observe = observe_fn(settings, sandbox, t)
        cache = _dir(workdir, t, tasks) / "faults.jsonl"
        runs = heldout_faults(settings, t, observe, packages, exclude, n_eval, cache, progress)
        prompts = [debug_prompt(settings.debug_context, t, packages, settings.prompt, settings.agent, r) for r in runs]
        recs = heldout_fixes(
            sampler,
            tokenizer,
            prompts,
            runs,
            settings.prompt.max_prompt_tokens,
            settings.sampling,
            observe,
            settings.verify_workers,
            progress,
            kind_of=partial(solution_kind, t.id),
        )
        records += [{"task": t.id, **r} for r in recs]
    (workdir / "debug_heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {f"debug_heldout_{k}" if k != "n" else "debug_heldout": v for k, v in fix_metrics(records).items()}


def fresh_policy(model: ModelSettings, vocab_size: int) -> Qwen2ForCausalLM:
    """A randomly initialised policy of the settings' shape with `vocab_size` rows."""
    config = model.architecture()
    if config.vocab_size < vocab_size:
        raise ValueError(f"model.vocab_size={config.vocab_size} < tokenizer size {vocab_size}; raise it")
    return Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))


def task_tokenizer(
    settings: WarmStartSettings, responses: Sequence[str], chats: Sequence[Messages], out_dir: Path
) -> Any:
    """The task BPE of a run without a checkpoint, trained on `responses` and `chats` (or loaded from
    out_dir when it was trained before)."""
    if (out_dir / "tokenizer.json").is_file():
        return load_tokenizer(out_dir)
    return train_task_tokenizer(
        responses, chats, settings.model.vocab_size, out_dir, settings.tokenizer_max_token_length
    )


def untrained_policy(
    settings: WarmStartSettings, task: Task | Sequence[Task], packages: Sequence[str], workdir: Path
) -> tuple[Qwen2ForCausalLM, Any]:
    """The policy a run starts RL from without a warm start: the checkpoint at `model.path`, or a random
    model with a task BPE trained on the task's corpus programs and scratch prompt (saved in workdir)."""
    if settings.model.path:
        path = settings.model.path
        model = from_pretrained(path, dtype=settings.model.compute_dtype, **settings.model.runtime_options())
        return model, load_tokenizer(path)
    tasks = [task] if isinstance(task, Task) else list(task)  # a mix: the BPE of all its corpora and prompts
    items = [it for t in tasks for it in generate_corpus(t.spec, settings.corpus_size, settings.seed, packages)]
    chats = [scratch_messages(t, list(packages), settings.prompt.snippet_chars) for t in tasks]
    tokenizer = task_tokenizer(settings, [it.response() for it in items], chats, workdir / "tokenizer")
    return fresh_policy(settings.model, len(tokenizer)), tokenizer


def verify_corpora(
    settings: WarmStartSettings,
    tasks: Sequence[Task],
    sandbox: Sandbox,
    packages: Sequence[str],
    workdir: str | Path,
    progress: bool = True,
) -> list[list[VerifiedItem]]:
    """Each task's warm-start corpus (`settings.corpus_size` programs of its grid) run and graded in `sandbox`, as
    the warm start verifies it (cached in workdir/verified.jsonl, or workdir/<task id>/ in a mix: a later call runs
    nothing twice). RuntimeError (what failed, and what to change) when a program of a corpus is not valid."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    out = []
    for t in tasks:
        items = generate_corpus(t.spec, settings.corpus_size, settings.seed, packages)
        run_fn = sandbox_run_fn(
            sandbox,
            t,
            settings.verify_limits(),
            instrument_mode="off" if settings.instrument.mode == "off" else "ast",
            output_chars=settings.prompt.output_tail_chars,
        )
        cache = _dir(workdir, t, tasks) / "verified.jsonl"
        cache.parent.mkdir(parents=True, exist_ok=True)
        verified = verify_cached(items, t, run_fn, cache, settings.verify_workers, progress)
        if len(verified) < len(items):
            raise RuntimeError(corpus_failure_message(t.id, len(items), verified_reasons(cache), settings, cache))
        out.append(verified)
    return out


def corpus_solutions(
    settings: WarmStartSettings,
    task: Task | Sequence[Task],
    sandbox: Sandbox,
    packages: Sequence[str],
    workdir: str | Path,
    progress: bool = True,
) -> list[PreviousSolution]:
    """The verified corpus programs of each task (`verify_corpora`) as earlier solutions an improve prompt shows
    (`prompt.improve_seed="corpus"`): plan, code and the output of its instrumented run, valid, its score, the
    reward RL gives it (the score, negated when lower is better), version 0, its task."""
    tasks = [task] if isinstance(task, Task) else list(task)
    out = []
    for t, vs in zip(tasks, verify_corpora(settings, tasks, sandbox, packages, workdir, progress), strict=True):
        sign = -1.0 if t.lower_is_better else 1.0
        out += [
            PreviousSolution(v.item.plan, v.item.code, v.output, sign * v.score, True, v.score, 0, t.id) for v in vs
        ]
    return out


def warm_start(
    settings: WarmStartSettings,
    task: Task | Sequence[Task],
    sandbox: Sandbox,
    packages: Sequence[str],
    workdir: str | Path,
    local_sampler: Callable[..., Sampler],
    progress: bool = True,
) -> WarmStart:
    """Runs (or resumes, or loads the finished result of) the warm-start stage for `task` in `workdir`.

    The SFT set: one scratch-prompt example per verified program, plus improve-prompt examples
    (`settings.improve_fraction` of the set, see `mle_jax.warmstart.improve`).
    sandbox: `make_sandbox(...)` (programs are verified in it); packages: the sandbox's packages
    (they gate model families in the corpus and appear in the prompt, as in RL). local_sampler: `(model, tokenizer,
    seed=0) -> Sampler` in process, the run's (run/builders.local_sampler), for the stage's evaluations.
    task: one task, or the tasks of a mix: then the SFT set is the union of each task's (each prompt names its
    task), the instrumentation examples are drawn from every task's programs, the tokenizer is trained on all,
    and each task's corpus is verified in workdir/<task id>/.
    """
    workdir = Path(workdir)
    policy_dir = workdir / "policy"
    tasks = [task] if isinstance(task, Task) else list(task)
    verified_by_task = verify_corpora(settings, tasks, sandbox, packages, workdir, progress)
    verified = [v for vs in verified_by_task for v in vs]

    if (policy_dir / "DONE").is_file():
        model = from_pretrained(policy_dir, **settings.model.runtime_options())
        return WarmStart(
            model, load_tokenizer(policy_dir), verified, json.loads((policy_dir / "DONE").read_text()), policy_dir
        )

    examples, chats, instrument_programs, held_out = [], [], [], []
    n_instrument = -(-settings.instrument_examples // len(tasks))  # each task's share, rounded up
    debug_metrics: dict[str, Any] = {}
    for t, vs in zip(tasks, verified_by_task, strict=True):
        programs, held = split_programs(t.id, packages, n_instrument, settings.seed + 1, [v.item for v in vs])
        debug: list[tuple[Messages, str]] = []
        if settings.debug_fraction > 0:
            tried, runs = corpus_faults(
                settings, t, observe_fn(settings, sandbox, t), vs, _dir(workdir, t, tasks) / "faults.jsonl", progress
            )
            debug = debug_examples(settings.debug_context, t, packages, settings.prompt, settings.agent, runs)
            debug_metrics["debug_faults_run"] = debug_metrics.get("debug_faults_run", 0) + tried
            debug_metrics["debug_examples"] = debug_metrics.get("debug_examples", 0) + len(debug)
        ex, ch = sft_examples(settings, t, packages, vs, programs[:n_instrument], debug)
        examples, chats = examples + ex, chats + ch
        instrument_programs += programs[:n_instrument]
        held_out += held
    copy_losses: list[float] = []
    if settings.model.path:
        tokenizer = load_tokenizer(settings.model.path)
        model = from_pretrained(settings.model.path, **settings.model.runtime_options())
    else:
        tokenizer = task_tokenizer(settings, [r for _, r in examples], chats, workdir / "tokenizer")
        model = fresh_policy(settings.model, len(tokenizer))
        if settings.copy_steps and not (workdir / "sft_ckpt").exists():  # a resumed SFT restores its own params
            copy_losses = copy_pretrain(
                model, len(tokenizer), settings.copy_steps, settings.copy_length, seed=settings.seed
            )
    metrics = run_sft(model, tokenizer, examples, settings.sft(), workdir, progress=progress)
    if copy_losses:
        metrics["copy_first_loss"], metrics["copy_final_loss"] = copy_losses[0], copy_losses[-1]
    metrics["corpus"] = len(verified)
    metrics["improve_examples"] = sum(improve_count(len(vs), settings.improve_fraction) for vs in verified_by_task)
    metrics["corpus_score_mean"] = sum(v.score for v in verified) / len(verified)
    metrics["instrument_examples"] = len(instrument_programs) + (
        settings.instrument_redrawn if instrument_programs else 0
    )
    if settings.instrument.mode == "lm" and settings.instrument_examples and settings.instrument_eval and held_out:
        rng = random.Random(settings.seed)
        probe = rng.sample(held_out, min(settings.instrument_eval, len(held_out)))
        metrics["instrument_heldout"] = len(probe)
        held = heldout_instrumentation(local_sampler(model, tokenizer), tokenizer, probe, settings.instrument)
        metrics.update({f"instrument_heldout_{k}": v for k, v in held.items()})
    if settings.debug_fraction > 0 or settings.measures_debug:
        metrics["debug_context"] = settings.debug_context
    metrics.update(debug_metrics)
    if settings.measures_debug:
        in_sft = sft_programs(settings, tasks, packages, verified_by_task)
        metrics.update(
            measure_turn_two(
                settings, tasks, sandbox, packages, in_sft, model, tokenizer, workdir, local_sampler, progress
            )
        )
    save_pretrained(model, policy_dir)
    tokenizer.save_pretrained(str(policy_dir))
    (policy_dir / "DONE").write_text(json.dumps(metrics))
    return WarmStart(model, tokenizer, verified, metrics, policy_dir)
