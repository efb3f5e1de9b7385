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

from mle_jax.env.settings import AgentSettings, EvalSettings, RolloutSettings
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.infra.optim import OptimSettings
from mle_jax.infra.sharding import MeshSettings
from mle_jax.instrument import InstrumentSettings
from mle_jax.models.settings import ModelSettings
from mle_jax.reporting.report import ReportSettings
from mle_jax.rl import objectives
from mle_jax.rl.settings import LearnerSettings, LoopSettings, PPOSettings
from mle_jax.sampling import registry as samplers
from mle_jax.sampling.protocol import SamplingSettings
from mle_jax.tasks.prepare import PREPARERS, TaskSettings
from mle_jax.tasks.prompts import PromptSettings
from mle_jax.tasks.registry import get_spec
from mle_jax.tasks.reward import RewardSettings
from mle_jax.warmstart.settings import WarmStartSettings


class ConfigError(ValueError):
    """A run config that cannot be turned into settings; the message names the field and the fix."""


@dataclass(frozen=True)
class SamplerSettings:
    """Which sampler serves the policy (the `sampler` section less the sampling knobs)."""

    backend: str = "vllm"  # a name of sampling/registry.py: "jax" (in process) or "vllm" (OpenAI server)
    vllm_url: str = ""  # empty: launch/ starts one
    # several servers (a list, or one string of comma-separated URLs); vllm_url alone is the list of one
    vllm_urls: tuple[str, ...] = ()
    vllm_gpu_memory_utilization: float = 0.2
    jax_cpu_kernels: bool = True  # "jax" on CPU: the decode step on mle_jax.kernels.cpu_decode where it is built
    # "jax": most KV positions one decode holds (prompts at their padded length + max_tokens per row; 0: no bound)
    jax_max_grid_tokens: int = 0
    sync_source: str = "hf"  # how the weights reach the servers (LoopSettings.sync_source, the one check of it)

    def __post_init__(self) -> None:
        samplers.check(self.backend)  # the name only: the sampler's module is loaded where it is built
        given = [self.vllm_urls] if isinstance(self.vllm_urls, str) else self.vllm_urls  # a config's JSON: a list
        urls = tuple(u.strip() for x in given for u in str(x).split(",") if u.strip())  # "url1,url2" is two
        object.__setattr__(self, "vllm_urls", urls)
        if len(set(urls)) != len(urls):
            raise ValueError(f"sampler.vllm_urls lists a server twice: {list(urls)}")
        if self.vllm_url and urls and self.vllm_url not in urls:
            raise ValueError(
                f"sampler.vllm_url={self.vllm_url} is not one of sampler.vllm_urls={list(urls)}: set one of the two"
            )

    @property
    def urls(self) -> tuple[str, ...]:
        """The policy's vLLM servers: sampler.vllm_urls, else (sampler.vllm_url,), else ()."""
        return self.vllm_urls or ((self.vllm_url,) if self.vllm_url else ())


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
    # the mix of tasks one policy trains on (config.tasks, task_weights); empty: the mix of one, `task`
    tasks: tuple[TaskSettings, ...] = ()
    task_weights: tuple[float, ...] = ()
    # each task's run timeout in seconds, in `mix` order (config.task_timeouts_s); empty: executor.timeout_s for all
    task_timeouts_s: tuple[float, ...] = ()

    @property
    def mix(self) -> tuple[TaskSettings, ...]:
        """The tasks of the run, `task` first: the config's `tasks`, or `task` alone."""
        return self.tasks or (self.task,)

    @property
    def mix_weights(self) -> tuple[float, ...]:
        """Each task's sampling weight (normalised to sum 1), in `mix` order."""
        w = self.task_weights or (1.0,) * len(self.mix)
        return tuple(float(x) / sum(w) for x in w)


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
    "ppo", "optim", "mesh", "loop", "checkpoint", "warmstart", "eval", "report", "learner", "tasks", "task_weights",
    "task_timeouts_s", "agent",
)  # fmt: skip
# absent from the config.json of workdirs written before they existed: their defaults
_OPTIONAL = ("learner", "tasks", "task_weights", "task_timeouts_s", "agent")


def task_mix(cfg: Any, task: TaskSettings) -> tuple[tuple[TaskSettings, ...], tuple[float, ...]]:
    """(the tasks of the run, `task` first; their weights) from `config.tasks` and `config.task_weights`.

    Every task but `task` shares its raw_dir and data_root and is prepared from raw data. An unknown id, a repeated
    one, a task without data here or weights that do not match are one ConfigError line."""
    ids = tuple(str(t) for t in (cfg["tasks"] if "tasks" in cfg.keys() else ()) or ())
    weights = tuple(float(w) for w in (cfg["task_weights"] if "task_weights" in cfg.keys() else ()) or ())
    if not ids:
        if weights and len(weights) != 1:
            raise ConfigError(f"task_weights has {len(weights)} weights but the run has one task ({task.id})")
        return (), ()
    for t in ids:
        try:
            get_spec(t)  # the paper's twelve, and those `task.modules` defined
        except KeyError as e:
            raise ConfigError(f"config.tasks: {e.args[0]}") from None
    if len(set(ids)) < len(ids):
        raise ConfigError(f"config.tasks names a task twice: {list(ids)}")
    if weights and (len(weights) != len(ids) or min(weights) < 0 or sum(weights) <= 0):
        raise ConfigError(
            f"config.task_weights={list(weights)} must be one weight >= 0 per task of config.tasks ({len(ids)}), "
            "not all 0 (empty: equal weights)"
        )
    # task.id first (its prepared_dir applies to it); the other tasks keep the order of config.tasks
    first = task.id if task.id in ids else ids[0]
    order = [first, *(t for t in ids if t != first)]
    by_id = dict(zip(ids, weights or (1.0,) * len(ids), strict=True))
    for t in order:
        if not (t == task.id and task.prepared_dir) and t not in PREPARERS:
            raise ConfigError(
                f"config.tasks: {t} has no data in this repository (tasks with data: {', '.join(sorted(PREPARERS))}); "
                f"drop it from the mix, or run it alone with --config.task.prepared_dir=<MLE-bench prepared/ folder>"
            )
    tasks = tuple(task if t == task.id else dataclasses.replace(task, id=t, prepared_dir="") for t in order)
    return tasks, tuple(by_id[t] for t in order)


def task_timeouts(cfg: Any, tasks: tuple[TaskSettings, ...]) -> tuple[float, ...]:
    """Each task's run timeout, in the order of `tasks` (the mix, `task` first), from `config.task_timeouts_s`: one
    per task of config.tasks, in config.tasks' order; empty: the executor's timeout for every task."""
    given = tuple(cfg["task_timeouts_s"] if "task_timeouts_s" in cfg.keys() else ()) or ()
    if not given:
        return ()
    ids = tuple(str(t) for t in (cfg["tasks"] if "tasks" in cfg.keys() else ()) or ())
    if len(given) != len(ids) or min(float(t) for t in given) <= 0:
        raise ConfigError(
            f"config.task_timeouts_s={list(given)} must be one timeout > 0 (seconds) per task of config.tasks "
            f"({len(ids)}), in its order (empty: executor.timeout_s for every task)"
        )
    by_id = dict(zip(ids, (float(t) for t in given), strict=True))
    return tuple(by_id[t.id] for t in tasks)


def episode_length_problem(s: RunSettings) -> str | None:
    """One line when an episode's longest token sequence (agent.turns in a conversation) cannot fit the model's
    context (model.max_position_embeddings), else None."""
    a, need, ctx = s.rollout.agent, s.rollout.max_sequence_tokens, s.model.max_position_embeddings
    if need <= ctx or a.context != "conversation" or a.turns == 1:  # one sample's budgets are the run's own business
        return None
    return (
        f"an episode of agent.turns={a.turns} in a conversation needs up to {need} tokens "
        "(prompt.max_prompt_tokens + turns x sampler.max_tokens + (turns - 1) x agent.observation_tokens), over "
        f'model.max_position_embeddings={ctx}: fewer turns, smaller budgets, or agent.context="state"'
    )


def batch_split_problem(s: RunSettings) -> str | None:
    """One line when the learner's rows (loop.batch_size episodes x agent rows per episode, or loop.batch_size turns
    with "turn" credit) do not split into
    ppo.mini_batch_size mini-batches of ppo.micro_batch_size micro-batches (what the learner would refuse at its first
    update), else None."""
    rows, ppo = s.loop.batch_size * s.rollout.agent.rows_per_batch_item, s.learner.ppo
    mini = min(ppo.mini_batch_size, rows)
    micro = min(ppo.micro_batch_size, mini)
    per = s.rollout.agent.rows_per_batch_item
    each = f" ({s.loop.batch_size} episodes x {per} rows)" if per > 1 else ""
    if rows % mini:
        return f"loop.batch_size: the update's {rows} rows{each} are not a multiple of ppo.mini_batch_size={mini}"
    if mini % micro:
        return f"ppo.mini_batch_size={mini} is not a multiple of ppo.micro_batch_size={micro}"
    return None


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
    if sync_source in ("orbax", "shm") and sampler.get("backend") != "vllm":
        raise ConfigError(
            f"sampler.sync_source={sync_source} needs sampler.backend=vllm (the JAX sampler shares the weights)"
        )
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
    task = _build(TaskSettings, "task", _section(cfg, "task"))
    tasks, task_weights = task_mix(cfg, task)
    agent = _build(AgentSettings, "agent", _section(cfg, "agent") if "agent" in cfg.keys() else {})
    settings = RunSettings(
        seed=seed,
        workdir=str(cfg["workdir"]),
        resume=bool(cfg["resume"]),
        task=tasks[0] if tasks else task,
        tasks=tasks,
        task_weights=task_weights,
        task_timeouts_s=task_timeouts(cfg, tasks),
        model=model,
        rollout=RolloutSettings(
            prompt=prompt,
            sampling=sampling,
            limits=executor.limits(),
            reward=_build(RewardSettings, "reward", _section(cfg, "reward")),
            agent=agent,
        ),
        sampler=_build(SamplerSettings, "sampler", sampler, sync_source=sync_source),
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
            lora=model.lora,
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
            agent=agent,
            sampling=sampling,
        ),
        eval=_build(EvalSettings, "eval", _section(cfg, "eval"), seed=seed),
        report=_build(ReportSettings, "report", _section(cfg, "report")),
    )
    too_long = episode_length_problem(settings) or batch_split_problem(settings)
    if too_long:
        raise ConfigError(too_long)
    groupless = objectives.group_size_problem(settings.learner.algorithm, settings.loop.group_size)
    if groupless:
        raise ConfigError(f"learner.algorithm: {groupless}")
    return settings
