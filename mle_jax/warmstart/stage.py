"""The warm-start stage of a run: corpus -> verified corpus -> tokenizer -> model -> SFT -> saved policy.

Called by the launcher before RL when `cfg.warmstart.enabled`. Everything it writes lives under
`workdir` (default `<cfg.workdir>/warmstart`):

    verified.jsonl   one line per corpus program run: sha256 of the code, valid, score, duration_s and
                     output (the terminal output of its instrumented run, as an improve prompt shows
                     it); a resumed stage does not run a program twice
    tokenizer/       the task BPE tokenizer (only for runs without a checkpoint, cfg.model.path == "")
    sft_ckpt/        orbax checkpoints of the SFT (params, optimizer state, grain iterator state)
    sft_metrics.jsonl  the loss curve
    policy/          the fine-tuned policy in HF safetensors form + tokenizer, and DONE when complete:
                     a later call returns it without redoing anything
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flax import nnx

from mle_jax.executor.result import Limits
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.warmstart.corpus import CorpusItem, VerifiedItem, generate_corpus, sandbox_run_fn, verify_corpus
from mle_jax.warmstart.improve import improve_count, improve_examples
from mle_jax.warmstart.sft import run_sft, train_task_tokenizer


@dataclass
class WarmStart:
    model: nnx.Module  # the fine-tuned policy (Qwen2ForCausalLM)
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

    Records without a captured output (written before outputs were kept) are run again."""
    seen: dict[str, dict] = {}
    if cache_path.is_file():
        for line in cache_path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if "output" in rec:
                    seen[rec["sha256"]] = rec
    todo = [it for it in items if _sha(it.code) not in seen]
    if todo:
        with cache_path.open("a") as f:

            def record(it: CorpusItem, v: VerifiedItem | None) -> None:  # as each run ends: kill-safe
                rec = {
                    "sha256": _sha(it.code),
                    "valid": v is not None,
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


def sft_examples(
    cfg: Any, task: Any, packages: Sequence[str], verified: Sequence[VerifiedItem]
) -> tuple[list[tuple[list[dict[str, str]], str]], list[list[dict[str, str]]]]:
    """The SFT set and its distinct prompt chats (what the task tokenizer is trained on with the responses).

    One example per verified program on the scratch prompt, then `improve_count(...)` examples on the
    improve prompt (`mle_jax.warmstart.improve`), so that `cfg.warmstart.improve_fraction` of the set
    teaches the prompt RL uses for that share of its samples. Scratch examples come first.
    """
    from mle_jax.tasks.prompts import scratch_messages

    messages = scratch_messages(task, list(packages), int(cfg.prompt.snippet_chars))
    examples = [(messages, v.item.response()) for v in verified]
    n_improve = improve_count(len(verified), float(cfg.warmstart.get("improve_fraction", 0.0)))
    examples += improve_examples(task, packages, verified, n_improve, int(cfg.seed))
    chats = list({json.dumps(m): m for m, _ in examples}.values())
    return examples, chats


def build_policy(cfg_model: Any, vocab_size: int) -> nnx.Module:
    """A randomly initialised Qwen2ForCausalLM of the config's shape with `vocab_size` rows."""
    from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config.from_model_config(cfg_model)
    if config.vocab_size < vocab_size:
        raise ValueError(f"cfg.model.vocab_size={config.vocab_size} < tokenizer size {vocab_size}; raise it")
    return Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))


def warm_start(
    cfg: Any, task: Any, sandbox: Any, packages: Sequence[str], workdir: str | Path | None = None, progress: bool = True
) -> WarmStart:
    """Runs (or resumes, or loads the finished result of) the warm-start stage for `task`.

    cfg: the full run config (uses cfg.seed, cfg.model, cfg.prompt, cfg.instrument, cfg.executor,
    cfg.warmstart). The SFT set: one scratch-prompt example per verified program, plus improve-prompt
    examples (`warmstart.improve_fraction` of the set, see `mle_jax.warmstart.improve`).
    sandbox: `make_sandbox(...)` (programs are verified in it); packages: the sandbox's packages
    (they gate model families in the corpus and appear in the prompt, as in RL).
    """
    from mle_jax.models.hf import from_pretrained, runtime_options, save_pretrained
    from mle_jax.models.tokenizer import load_tokenizer

    ws = cfg.warmstart
    workdir = Path(workdir or Path(cfg.workdir) / "warmstart")
    workdir.mkdir(parents=True, exist_ok=True)
    policy_dir = workdir / "policy"
    items = generate_corpus(task.spec, int(ws.corpus_size), int(cfg.seed), packages)
    executor = ExecutorSettings(**cfg.executor.to_dict())
    limits = Limits(
        timeout_s=float(ws.get("verify_timeout_s", 120.0)), memory_mb=executor.memory_mb, cpus=executor.cpus
    )
    workers = int(ws.get("verify_workers", 0)) or executor.slots or 1
    run_fn = sandbox_run_fn(
        sandbox,
        task,
        limits,
        instrument_mode="off" if cfg.instrument.mode == "off" else "ast",
        output_chars=int(cfg.prompt.output_tail_chars),
    )
    verified = verify_cached(items, task, run_fn, workdir / "verified.jsonl", workers, progress)
    if len(verified) < len(items):
        bad = len(items) - len(verified)
        raise RuntimeError(
            f"{bad} of {len(items)} warm-start programs for {task.id} did not run and grade "
            f"(see {workdir / 'verified.jsonl'}); the corpus generator must write valid ones"
        )

    if (policy_dir / "DONE").is_file():
        model = from_pretrained(policy_dir, **runtime_options(cfg.model))
        return WarmStart(
            model, load_tokenizer(policy_dir), verified, json.loads((policy_dir / "DONE").read_text()), policy_dir
        )

    examples, chats = sft_examples(cfg, task, packages, verified)
    if cfg.model.path:
        tokenizer = load_tokenizer(cfg.model.path)
        model = from_pretrained(cfg.model.path, **runtime_options(cfg.model))
    else:
        tok_dir = workdir / "tokenizer"
        tokenizer = (
            load_tokenizer(tok_dir)
            if (tok_dir / "tokenizer.json").is_file()
            else train_task_tokenizer(
                [r for _, r in examples],
                chats,
                int(cfg.model.vocab_size),
                tok_dir,
                ws.get("tokenizer_max_token_length", 16),
            )
        )
        model = build_policy(cfg.model, len(tokenizer))
    sft_cfg = dict(ws.to_dict()) if hasattr(ws, "to_dict") else dict(ws)
    sft_cfg.setdefault("seed", int(cfg.seed))
    sft_cfg["max_prompt_tokens"] = int(cfg.prompt.max_prompt_tokens)
    sft_cfg.setdefault("max_response_tokens", int(cfg.sampler.max_tokens))
    metrics = run_sft(model, tokenizer, examples, sft_cfg, workdir, progress=progress)
    metrics["corpus"] = len(verified)
    metrics["improve_examples"] = len(examples) - len(verified)
    metrics["corpus_score_mean"] = sum(v.score for v in verified) / len(verified)
    save_pretrained(model, policy_dir)
    tokenizer.save_pretrained(str(policy_dir))
    (policy_dir / "DONE").write_text(json.dumps(metrics))
    return WarmStart(model, tokenizer, verified, metrics, policy_dir)
