"""`launch --dry_run`: what a run of these settings would start, one line each, and what it lacks, one line each.

What it lacks is preflight's problems plus one only a dry run can check: an accelerator for a model of billions of
parameters. A real launch cannot look at the devices before the run starts: a multi-process run must join its other
processes (jax.distributed) before JAX's backends come up, so the devices are the run's own first step.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from mle_jax.run import preflight
from mle_jax.run.settings import RunSettings

# a model this large trains on accelerators (the paper's: Qwen2.5-3B on GPUs); smaller ones (SmolLM2-135M) on CPU too
ACCELERATOR_PARAMETERS = 1e9


def plan_lines(s: RunSettings, devices: Sequence[str]) -> list[str]:
    """What the run would start, one line per part. devices: the platform of each device JAX finds ("cpu", "gpu")."""
    arch = preflight.architecture(s)
    ls, ex, ws, ppo = s.loop, s.executor, s.warmstart, s.learner.ppo
    sampling = s.rollout.sampling
    weights = s.model.path or "random weights (model.path is empty), a tokenizer trained on the task"
    urls = s.sampler.urls
    where = "in process" if s.sampler.backend != "vllm" else f"at {urls[0] if urls else '(no sampler.vllm_url)'}"
    if s.sampler.backend == "vllm" and len(urls) > 1:
        where = f"on {len(urls)} servers, each group to the least-loaded ({', '.join(urls)})"
    lm = f", {s.instrument.decoding} decoding by the frozen initial policy" if s.instrument.mode == "lm" else ""
    if lm and s.sampler.backend == "vllm":
        lm += f" at {s.instrument.vllm_url or '(no instrument.vllm_url)'}"
    image = f", image {ex.image}" if ex.backend == "docker" else ""
    slots = f"{ex.slots} slots" if ex.slots else f"{os.cpu_count() or 1} slots (one per core)"
    warm = (
        f"{ws.corpus_size} verified programs a task, {ws.steps} SFT steps of {ws.batch_size}" if ws.enabled else "off"
    )
    if ws.enabled and ws.debug_fraction > 0:
        warm += f", {ws.debug_fraction:.0%} of the solving examples on turn 2 after a faulty run ({ws.debug_context})"
    if ws.enabled and ws.measures_debug:
        warm += f", turn-2 fixes of {ws.debug_eval} held-out faulty programs measured"
    evaluation = f"{s.eval.samples} samples" + (" and an improvement of each" if s.eval.improve else "")
    critic = "with a critic" if s.learner.objective.critic else "no critic"
    return [
        f"model: {arch.model_type}, {preflight.model_shape(s)}, {s.model.param_dtype} weights, from {weights}",
        f"learner: {s.learner.algorithm} ({critic}), {ppo.epochs} epoch(s) a batch, actor lr "
        f"{s.learner.optim.actor_lr:g}, mesh data={s.mesh.data} fsdp={s.mesh.fsdp} tensor={s.mesh.tensor}",
        f"sampler: {s.sampler.backend} {where}, temperature {sampling.temperature:g}, at most {sampling.max_tokens} "
        "tokens a response",
        f"instrumenter: {s.instrument.mode}{lm}",
        f"sandbox backend: {ex.backend}{image}; each program {ex.cpus} CPU(s), {ex.memory_mb} MiB, {ex.timeout_s:g} s",
        f"fleet: {ex.fleet}, {slots}",
        "tasks: " + ", ".join(f"{t.id} (weight {w:.2f})" for t, w in zip(s.mix, s.mix_weights, strict=True)),
        f"batch: B={ls.batch_size} samples an update ({ls.batch_size // ls.group_size} prompts x n={ls.group_size}), "
        f"{ls.in_flight_multiplier * ls.batch_size} in flight (m={ls.in_flight_multiplier}), mini-batch "
        f"{ppo.mini_batch_size}, micro-batch {ppo.micro_batch_size}; {ls.steps} RL steps",
        f"warm start: {warm}",
        f"checkpoint: {preflight.size_text(preflight.checkpoint_bytes(s))} a step, every {ls.checkpoint_every} "
        f"step(s), the newest {s.checkpoint_keep} kept in {Path(s.workdir) / 'checkpoints'}",
        f"evaluation: {evaluation if s.eval.samples else 'off'}",
        "devices: " + ", ".join(f"{n} {platform}" for platform, n in Counter(devices).items()),
    ]


def device_problems(s: RunSettings, devices: Sequence[str]) -> list[str]:
    """A model of billions of parameters with no accelerator: one line."""
    params = preflight.architecture(s).num_parameters()
    if params < ACCELERATOR_PARAMETERS or any(d != "cpu" for d in devices):
        return []
    return [
        f"no accelerator: JAX finds only CPU devices ({len(devices)}) and this config trains a "
        f"{params / 1e9:.1f} B-parameter model: run it on GPUs (launch/gpu_node.sh) or TPUs (launch/tpu_pod.sh), or "
        "use the :cpu or :smol config here"
    ]


def problems(s: RunSettings, devices: Sequence[str]) -> list[str]:
    """Everything the run lacks, one line each: preflight's, then the devices'."""
    return preflight.problems(s) + device_problems(s, devices)
