"""Checks, before a run starts any work, that what its settings need exists: a workdir it can write with room for a
checkpoint, the model folder and a config.json it can read, the task's data (and, for the tiny model, its warm-start
corpus), the sandbox backend's and the sampler's own checks (their registered classes' `preflight`: bubblewrap and
the sandbox venv, a Docker daemon; the vLLM servers), and that a run resumed in a workdir with checkpoints trains the
objective they were written by.

Each problem is one line saying what is missing and how to get it; `launch` prints them and exits.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp

from mle_jax.executor.sandbox import sandbox_problems
from mle_jax.infra.checkpoint import TMP_MARK
from mle_jax.models.hf import read_config
from mle_jax.models.qwen2 import Qwen2Config
from mle_jax.run.settings import RunSettings
from mle_jax.sampling import registry as samplers
from mle_jax.tasks.prepare import PREPARERS, TaskSettings
from mle_jax.warmstart.programs import registered_tasks


class PreflightError(RuntimeError):
    """Something the run needs is missing; the message says what and how to get it (one line per problem)."""


def _model(s: RunSettings) -> list[str]:
    if not s.model.path:
        return _random_weights(s)
    path = Path(s.model.path)
    if not (path / "config.json").is_file():
        return [
            f"model.path={s.model.path} is not an HF model folder (no config.json): pass a local folder "
            "(e.g. Qwen2.5-3B-Instruct downloaded elsewhere; `make smol-model` writes "
            "checkpoints/smollm2-135m-instruct for the :smol configs), or " + _without_path(s)
        ]
    try:
        read_config(path)
    except (ValueError, TypeError, OSError) as e:  # read_config's errors name the file and what is wrong
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [f"model.path={s.model.path}: {why}: pass an HF Qwen2 or Llama model folder"]
    return []


def workdir_problems(workdir: str) -> list[str]:
    """The workdir must be a folder this process can write, or one it can create: not a file, not under one, not
    on a read-only filesystem or in a folder it may not write. Nothing is created."""
    path = Path(workdir)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == path and not path.is_dir():
        return [f"workdir={workdir} is a file, not a folder: pass --config.workdir=<a folder>"]
    if not existing.is_dir():
        return [f"workdir={workdir} lies under {existing}, which is a file: pass --config.workdir=<a folder>"]
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        where = "" if existing == path else f" ({existing} is its nearest existing folder)"
        return [
            f"workdir={workdir} is not writable{where}: {e.strerror or e}; pass --config.workdir=<a writable folder>"
        ]
    return []


def size_text(n: float) -> str:
    """Bytes for a person: "16.8 MiB", "74.2 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def architecture(s: RunSettings) -> Qwen2Config:
    """The policy's shape: model.path's config.json, else the config's fresh model (an unreadable config.json is
    `_model`'s problem; its fields restate the shape)."""
    if s.model.path:
        try:
            return read_config(s.model.path)
        except (ValueError, TypeError, OSError):
            pass
    return s.model.architecture()


def checkpoint_bytes(s: RunSettings) -> int:
    """Bytes one RL checkpoint step takes at most: the learner's params and their two Adam moments, of the policy
    and, where learner.algorithm has one, of the critic (the policy's backbone and a value head), at the learner's
    master dtype; plus 1 MiB for the loop state and orbax's metadata (orbax compresses: a step on disk is smaller)."""
    arch = architecture(s)
    d, policy = arch.hidden_size, arch.num_parameters()
    lm_head = 0 if arch.tie_word_embeddings else arch.vocab_size * d
    critic = policy - lm_head + d + 1 if s.learner.objective.critic else 0
    itemsize = jnp.dtype(s.learner.optim.master_dtype or s.model.param_dtype).itemsize
    return 3 * (policy + critic) * itemsize + (1 << 20)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def unfinished_saves_bytes(workdir: Path) -> int:
    """What half-written checkpoint steps of a killed run hold under workdir/checkpoints (orbax removes them before
    the run's first save, so their space counts as free)."""
    tmp_dirs = (workdir / "checkpoints").glob(f"*{TMP_MARK}*")
    return sum(f.stat().st_size for d in tmp_dirs for f in d.rglob("*") if f.is_file())


def disk_problems(s: RunSettings) -> list[str]:
    """The workdir's filesystem must have room for a checkpoint step (`checkpoint_bytes`), the largest thing a run
    writes at once; keeping checkpoint.keep steps takes that many times more as the run goes on."""
    workdir = Path(s.workdir)
    where = _nearest_existing(workdir.absolute())
    free = shutil.disk_usage(where).free + unfinished_saves_bytes(workdir)
    need = checkpoint_bytes(s)
    if free >= need:
        return []
    return [
        f"workdir={s.workdir}: {size_text(free)} free on its disk ({where}) and a checkpoint of this run takes "
        f"{size_text(need)}; make {size_text(need - free)} more room there, or pass --config.workdir=<a folder on a "
        "larger disk>"
    ]


TINY_PARAMETERS = 50e6  # a model without model.path below this size learns from a warm start here (the :cpu model)


def model_shape(s: RunSettings) -> str:
    """The config's model for a person: "36 layers of hidden 2048, ~3,085.9 M parameters"."""
    arch = architecture(s)
    return (
        f"{arch.num_hidden_layers} layers of hidden {arch.hidden_size}, ~{arch.num_parameters() / 1e6:,.1f} M "
        "parameters"
    )


def _random_weights(s: RunSettings) -> list[str]:
    """No model.path for a model larger than the tiny one: random weights of a pretrained model's shape, which
    cannot write programs (the paper's config needs its Qwen2.5-3B-Instruct folder)."""
    if s.model.architecture().num_parameters() < TINY_PARAMETERS:
        return []
    return [
        f"model.path is empty: this config's model ({model_shape(s)}) would start from random weights, which "
        "cannot write programs: pass --config.model.path=<a local HF folder, e.g. Qwen2.5-3B-Instruct> "
        "(launch/gpu_node.sh passes its MODEL), or use the :cpu config (configs/<task>.py:cpu) for the tiny model"
    ]


def _without_path(s: RunSettings) -> str:
    """What leaving model.path out means for this config: the model of its shape with random weights."""
    m, params = s.model, s.model.architecture().num_parameters()
    shape = f"{m.num_hidden_layers} layers of hidden {m.hidden_size}, ~{params / 1e6:,.1f} M parameters"
    if params < TINY_PARAMETERS:
        return f"drop --config.model.path for this config's tiny random model ({shape})"
    return (
        f"use the :cpu config (configs/<task>.py:cpu) for the tiny model: without model.path this config builds "
        f"a model of its shape with random weights ({shape}), which cannot write programs"
    )


def _task(s: RunSettings) -> list[str]:
    return [line for t in s.mix for line in _one_task(t)]


def _one_task(t: TaskSettings) -> list[str]:
    if t.prepared_dir:
        if not (Path(t.prepared_dir) / "public").is_dir():
            return [f"task.prepared_dir={t.prepared_dir} has no public/ folder: pass an MLE-bench prepared/ folder"]
        return []
    if t.id not in PREPARERS:
        return [
            f"{t.id} has no data in this repository: prepare it with MLE-bench (`mlebench prepare -c {t.id}`) and "
            f"pass --config.task.prepared_dir=<MLE-bench data dir>/{t.id}/prepared"
        ]
    if not (Path(t.raw_dir) / t.id).is_dir():
        return [
            f"no data for {t.id} at {Path(t.raw_dir) / t.id}: pass --config.task.prepared_dir=<MLE-bench "
            f"prepared/ folder of {t.id}>"
        ]
    return []


def _corpus(s: RunSettings) -> list[str]:
    """The tiny model (no checkpoint) gets its tokenizer, and with the warm start its first programs, from the
    task's corpus generator."""
    lacking = [t.id for t in s.mix if t.id not in registered_tasks()]
    if s.model.path or not lacking:
        return []
    return [
        f"the tiny model (empty model.path) learns from a warm-start corpus and {lacking[0]} has none "
        f"(mle_jax/warmstart/programs/ has {', '.join(registered_tasks())}): pass --config.model.path=<HF model "
        "folder>, or add a corpus generator for the task"
    ]


def _executor(s: RunSettings) -> list[str]:
    """The sandbox backend's own check (its class's `preflight`: bubblewrap and the venv, a Docker daemon, ...)."""
    return sandbox_problems(s.executor)


def _sampler(s: RunSettings) -> list[str]:
    """The sampler's own check (its class's `preflight`: vLLM's servers answer, ...), for the policy's sampler and
    the instrumenter's when an LM instruments."""
    instrumenter_url = s.instrument.vllm_url if s.instrument.mode == "lm" else None
    return list(samplers.resolve(s.sampler.backend).preflight(s.sampler, instrumenter_url))


def multi_process(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one of several (the env vars sharding.maybe_initialize_distributed reads)."""
    env = os.environ if env is None else env
    return int(env.get("JAX_NUM_PROCESSES") or 1) > 1 or env.get("MLE_JAX_DISTRIBUTED", "").lower() == "auto"


def _hosts(s: RunSettings, env: Mapping[str, str] | None) -> list[str]:
    if not multi_process(env):
        return []
    found = []
    if s.warmstart.enabled:
        found.append(
            "warmstart.enabled with several processes: the warm start runs on one host; start the multi-process "
            "run from its checkpoint (--config.warmstart.enabled=false --config.model.path=<workdir>/hf_export of a "
            "single-host run)"
        )
    if s.loop.sync_source == "shm":
        found.append(
            "sampler.sync_source=shm with several processes: shared memory reaches the servers of one host; sync "
            "a multi-process run by files on shared storage (--config.sampler.sync_source=hf or orbax)"
        )
    return found


def _checkpointed_algorithm(workdir: Path) -> str | None:
    """The learner.algorithm whose checkpoints the workdir holds (from the config.json the run saved beside them;
    a config.json from before the `learner` section is PPO's), or None: no checkpoint step, or no readable config."""
    ckpt = workdir / "checkpoints"
    if not ckpt.is_dir() or not any(p.name.isdigit() for p in ckpt.iterdir()):
        return None
    try:
        saved = json.loads((workdir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    learner = saved.get("learner") if isinstance(saved, dict) else None
    return str(learner.get("algorithm", "ppo")) if isinstance(learner, dict) else "ppo"


def _resumed_objective(s: RunSettings) -> list[str]:
    """A resumed run must train the objective of the checkpoints it resumes: another one holds a critic they lack, or
    lacks one they hold, and the restore would fail inside orbax (or, critic-free to critic-free, switch silently)."""
    if not s.resume:
        return []
    saved = _checkpointed_algorithm(Path(s.workdir))
    if saved is None or saved == s.learner.algorithm:
        return []
    return [
        f"workdir={s.workdir} holds checkpoints of learner.algorithm={saved}, not {s.learner.algorithm}: pass "
        f"--config.learner.algorithm={saved} to resume them, or a new --config.workdir"
    ]


def problems(s: RunSettings, env: Mapping[str, str] | None = None) -> list[str]:
    """Everything the settings need that is missing, one line each (empty: ready to run). env: the process
    environment (default os.environ)."""
    task = _task(s)
    found = workdir_problems(s.workdir)
    found += (disk_problems(s) if not found else []) + _model(s) + task + (_corpus(s) if not task else [])
    return found + _resumed_objective(s) + _executor(s) + _sampler(s) + _hosts(s, env)


def check(s: RunSettings) -> None:
    """Raises PreflightError listing every problem."""
    found = problems(s)
    if found:
        raise PreflightError("\n".join(found))
