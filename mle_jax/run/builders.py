"""What a run and the evaluate CLI both build from the settings: the policy, its samplers, the instrumenter.

`run.py` wires these into the stages of a run; `evaluate.py` into an evaluation of a finished run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from flax import nnx

from mle_jax.env.improve_buffer import PreviousSolution
from mle_jax.env.rollout import InstrumentFn
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.infra import sharding
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.instrument import Instrumenter
from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.value import Qwen2ValueModel
from mle_jax.rl.learner import Learner
from mle_jax.rl.loop import AsyncRLLoop
from mle_jax.run.settings import RunSettings, SamplerSettings
from mle_jax.sampling import registry as samplers
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.protocol import Sampler
from mle_jax.tasks.task import Task
from mle_jax.warmstart.stage import corpus_solutions, untrained_policy, warm_start


def build_policy(
    s: RunSettings, task: Task | Sequence[Task], packages: list[str], workdir: Path
) -> tuple[Qwen2ForCausalLM, Any, dict]:
    """(policy model, tokenizer, warm-start metrics). task: the run's task, or the tasks of its mix (the warm
    start and the tokenizer then cover them all).

    With `warmstart.enabled`, the policy is the warm-start stage's fine-tuned model (a finished stage
    is loaded, not redone). Else a checkpoint at `model.path`, or a random model of the configured shape
    with a task BPE tokenizer trained on the task's program corpus.
    """
    if s.warmstart.enabled:
        sandbox = make_sandbox(s.executor)
        ws = warm_start(s.warmstart, task, sandbox, packages, workdir / "warmstart", local_sampler(s.sampler))
        metrics = {
            "corpus_verified": len(ws.verified),
            **{k: v for k, v in ws.metrics.items() if isinstance(v, int | float | str)},
        }
        return ws.model, ws.tokenizer, metrics
    model, tokenizer = untrained_policy(s.warmstart, task, packages, workdir)
    return model, tokenizer, {}


def improve_seeds(
    s: RunSettings, task: Task | Sequence[Task], packages: list[str], workdir: Path
) -> list[PreviousSolution]:
    """What a run's improve buffer starts with (`prompt.improve_seed`): nothing, or with "corpus" every task's
    verified warm-start corpus programs with their output (verified in this run's sandbox, cached beside the warm
    start's in workdir/warmstart: a warm-started run verifies nothing twice)."""
    if s.rollout.prompt.improve_seed != "corpus":
        return []
    return corpus_solutions(s.warmstart, task, make_sandbox(s.executor), packages, workdir / "warmstart")


def start_loop(
    loop: AsyncRLLoop, s: RunSettings, task: Task | Sequence[Task], packages: list[str], corpus_dir: Path, resume: bool
) -> tuple[bool, int]:
    """A run's loop at its start: resumed from its latest checkpoint when `resume` and there is one (its improve buffer
    is the checkpoint's), else a fresh run whose improve buffer starts with `improve_seeds` (the corpus verified in
    corpus_dir/warmstart, once). Returns (resumed, solutions seeded)."""
    if resume and loop.restore():
        return True, 0
    seeds = improve_seeds(s, task, packages, corpus_dir)
    for solution in seeds:
        loop.buffer.add(solution, n_prints=1)
    return False, len(seeds)


def make_learner(s: RunSettings, policy: Qwen2ForCausalLM) -> Learner:
    """The learner of `policy` (its frozen reference) for `learner.algorithm`, with a critic initialised from the
    policy only when the objective has one."""
    value = Qwen2ValueModel.from_policy(policy, rngs=nnx.Rngs(s.seed + 1)) if s.learner.objective.critic else None
    return Learner(s.learner, policy, value, sharding.make_mesh(s.mesh))


def load_trained_policy(
    s: RunSettings, task: Task | Sequence[Task], packages: list[str], workdir: Path
) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM, Any]:
    """(latest policy, initial policy, tokenizer) of a run: the latest from its last RL checkpoint, else its
    HF export; the initial one (what RL started from, the frozen instrumenter) as the run built it."""
    initial, tokenizer, _ = build_policy(s, task, packages, workdir)
    # read-only: the run may still be training and writing its next checkpoint into this folder
    ckpt = Checkpointer(workdir / "checkpoints", read_only=True)
    if ckpt.latest_step() is not None:
        learner = make_learner(s, initial)
        learner.restore_latest(ckpt)
        ckpt.close()
        return learner.policy_model(), initial, tokenizer
    export = workdir / "hf_export"
    if (export / "config.json").exists():
        model = hf.from_pretrained(export, dtype=s.model.compute_dtype, **s.model.runtime_options())
        return model, initial, tokenizer
    raise FileNotFoundError(f"{workdir} has neither checkpoints/ nor hf_export/: nothing to evaluate")


def make_sampler(
    s: SamplerSettings,
    model: Qwen2ForCausalLM,
    tokenizer: Any,
    workdir: Path,
    url: str | None = None,
    frozen: bool = False,
) -> Sampler:
    """The sampler of `model` of the registered class `s.backend` (sampling/registry.py): in process (JAX) or a
    vLLM server at `url` (default `s.vllm_url`). frozen: of a frozen copy of `model` (the instrumenter's)."""
    cls = samplers.resolve(s.backend)
    return cls.from_settings(s, model, tokenizer, workdir, url=url, frozen=frozen)


def local_sampler(s: SamplerSettings) -> Callable[..., JaxSampler]:
    """How every in-process sampler outside the RL loop is made (the warm start's, the experiments', a bench's
    evaluation of a model it holds): `(model, tokenizer, seed=0, **options) -> JaxSampler` with this run's sampler
    settings (`jax_cpu_kernels`), whatever `s.backend` serves the loop; options are JaxSampler's own."""
    return partial(JaxSampler.for_run, s)


def make_instrumenter(s: RunSettings, initial_policy: Qwen2ForCausalLM, tokenizer: Any, workdir: Path) -> InstrumentFn:
    """The instrumenter of the run: in mode "lm" a frozen copy of the initial policy inserts the progress
    prints (verified, else the AST fallback); "ast" and "off" need no model."""
    frozen = None
    if s.instrument.mode == "lm":
        # frozen: the policy's weights change under it (in process it samples a clone; a vLLM server holds its own)
        frozen = make_sampler(s.sampler, initial_policy, tokenizer, workdir, url=s.instrument.vllm_url, frozen=True)
    return Instrumenter(
        mode=s.instrument.mode,
        sampler=frozen,
        tokenizer=tokenizer,
        max_tokens=s.instrument.max_tokens,
        max_prompt_tokens=s.instrument.max_prompt_tokens,
        temperature=s.instrument.temperature,
        decoding=s.instrument.decoding,
        copy_window=s.instrument.copy_window,
    )
