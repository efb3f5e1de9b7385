"""The one reader of the run config: `configs/<task>.py` ConfigDict -> the typed settings of every box.

Nothing else in mle_jax sees the ConfigDict. Each box takes a small frozen dataclass that mirrors its
section of configs/base.py (same field names, so `--config.ppo.clip_ratio=0.1` lands in
`PPOSettings.clip_ratio`), plus the few values it needs from other sections (say, the sampling
temperature for the learner's logprobs). A config field that no setting knows is an error naming it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mle_jax.evaluation import EvalSettings
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.instrument import InstrumentSettings
from mle_jax.models.settings import ModelSettings
from mle_jax.optim import OptimSettings
from mle_jax.report import ReportSettings
from mle_jax.rl.learner import LearnerSettings
from mle_jax.rl.loop import LoopSettings
from mle_jax.rl.ppo_update import PPOSettings
from mle_jax.rl.rollout import RolloutSettings
from mle_jax.sampling.protocol import SamplingSettings
from mle_jax.sharding import MeshSettings
from mle_jax.tasks.prepare import TaskSettings
from mle_jax.tasks.prompts import PromptSettings
from mle_jax.tasks.reward import RewardSettings
from mle_jax.warmstart.stage import WarmStartSettings

SAMPLER_BACKENDS = ("jax", "vllm")


class ConfigError(ValueError):
    """A run config that cannot be turned into settings; the message names the field and the fix."""


@dataclass(frozen=True)
class SamplerSettings:
    """Which sampler serves the policy (the `sampler` section less the sampling knobs)."""

    backend: str = "vllm"  # "jax" (in process) or "vllm" (OpenAI server)
    vllm_url: str = ""  # empty: launch/ starts one
    vllm_gpu_memory_utilization: float = 0.2

    def __post_init__(self) -> None:
        if self.backend not in SAMPLER_BACKENDS:
            raise ValueError(f"sampler.backend must be one of {SAMPLER_BACKENDS}, got {self.backend!r}")


@dataclass(frozen=True)
class RunSettings:
    seed: int
    workdir: str
    resume: bool
    task: TaskSettings
    model: ModelSettings
    rollout: RolloutSettings
    sampler: SamplerSettings
    instrument: InstrumentSettings
    executor: ExecutorSettings
    learner: LearnerSettings
    mesh: MeshSettings
    loop: LoopSettings
    checkpoint_keep: int
    warmstart: WarmStartSettings
    eval: EvalSettings
    report: ReportSettings


def _section(cfg: Any, name: str) -> dict[str, Any]:
    value = cfg[name]
    return dict(value.to_dict() if hasattr(value, "to_dict") else value)


def _build(cls: type, section: str, fields: Mapping[str, Any], **extra: Any) -> Any:
    """cls(**fields, **extra), with unknown fields and bad values reported as one ConfigError line."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(
            f"config field {section}.{unknown[0]} is not a setting of {cls.__name__}; known: {sorted(known)}"
        )
    try:
        return cls(**fields, **extra)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section {section}: {e}") from None


_TOP_LEVEL = (
    "seed", "workdir", "resume", "model", "task", "prompt", "sampler", "instrument", "executor", "reward",
    "ppo", "optim", "mesh", "loop", "checkpoint", "warmstart", "eval", "report", "learner",
)  # fmt: skip
_OPTIONAL = ("learner",)  # absent from the config.json of workdirs written before it existed: its defaults


def from_config(cfg: Any) -> RunSettings:
    """The typed settings of a run config (a ConfigDict from configs/<task>.py, or the dict of its JSON)."""
    unknown = sorted(set(cfg.keys()) - set(_TOP_LEVEL))
    missing = sorted(set(_TOP_LEVEL) - set(cfg.keys()) - set(_OPTIONAL))
    if unknown or missing:
        raise ConfigError(f"run config: unknown sections {unknown}, missing sections {missing}")
    seed = int(cfg["seed"])
    sampler = _section(cfg, "sampler")
    sampling = _build(
        SamplingSettings, "sampler", {k: sampler.pop(k) for k in ("temperature", "top_p", "top_k", "max_tokens")}
    )
    sync_every = sampler.pop("sync_every")
    group_size = sampler.pop("group_size", 1)  # a run config saved before sampler.group_size existed: one
    sync_source = sampler.pop("sync_source")
    if sync_source == "orbax" and sampler.get("backend") != "vllm":
        raise ConfigError("sampler.sync_source=orbax needs sampler.backend=vllm (the JAX sampler shares the weights)")
    executor = _build(ExecutorSettings, "executor", _section(cfg, "executor"))
    mesh = _section(cfg, "mesh")
    reference_on_host = bool(mesh.pop("reference_on_host"))
    checkpoint = _section(cfg, "checkpoint")
    if set(checkpoint) != {"every", "keep"}:
        raise ConfigError(f"config section checkpoint has fields {sorted(checkpoint)}; known: ['every', 'keep']")
    prompt = _build(PromptSettings, "prompt", _section(cfg, "prompt"))
    model = _build(ModelSettings, "model", _section(cfg, "model"))
    instrument = _build(InstrumentSettings, "instrument", _section(cfg, "instrument"))
    warmstart = _section(cfg, "warmstart")
    if not warmstart.get("verify_workers"):
        # the warm start verifies its corpus in this machine's sandbox, one program per core at most: more at once
        # would stretch the slow ones past verify_timeout_s and skew the corpus's run times, which are measured
        cpus = os.cpu_count() or 1
        warmstart["verify_workers"] = min(executor.slots or cpus, cpus)
    return RunSettings(
        seed=seed,
        workdir=str(cfg["workdir"]),
        resume=bool(cfg["resume"]),
        task=_build(TaskSettings, "task", _section(cfg, "task")),
        model=model,
        rollout=RolloutSettings(
            prompt=prompt,
            sampling=sampling,
            limits=executor.limits(),
            reward=_build(RewardSettings, "reward", _section(cfg, "reward")),
        ),
        sampler=_build(SamplerSettings, "sampler", sampler),
        instrument=instrument,
        executor=executor,
        learner=_build(
            LearnerSettings,
            "learner",
            _section(cfg, "learner") if "learner" in cfg.keys() else {},
            ppo=_build(PPOSettings, "ppo", _section(cfg, "ppo"), temperature=sampling.temperature),
            optim=_build(OptimSettings, "optim", _section(cfg, "optim")),
            reference_on_host=reference_on_host,
            seed=seed,
        ),
        mesh=_build(MeshSettings, "mesh", mesh),
        loop=_build(
            LoopSettings,
            "loop",
            _section(cfg, "loop"),
            group_size=group_size,
            sync_every=sync_every,
            sync_source=sync_source,
            checkpoint_every=checkpoint.pop("every"),
            seed=seed,
        ),
        checkpoint_keep=int(checkpoint.pop("keep")),
        warmstart=_build(
            WarmStartSettings,
            "warmstart",
            warmstart,
            seed=seed,
            model=model,
            prompt=prompt,
            limits=executor.limits(),
            instrument=instrument,
        ),
        eval=_build(EvalSettings, "eval", _section(cfg, "eval"), seed=seed),
        report=_build(ReportSettings, "report", _section(cfg, "report")),
    )
