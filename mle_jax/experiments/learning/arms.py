"""The experiment's arms (an objective and a duration-weight mode each, one run config each) and its scale."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ml_collections import ConfigDict

from mle_jax.rl import objectives
from mle_jax.rl.ppo import DURATION_MODES

# the objectives behind config.learner.algorithm (issue 21); "ppo" is the paper's, with its critic
ALGORITHMS = tuple(objectives.OBJECTIVES)
LEGACY_NAMES = {"batch_mean": "duration_weighted", "off": "unweighted"}  # PPO's two arms, as results_tables reads


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    algorithm: str  # config.learner.algorithm
    duration_weights: str  # config.ppo.duration_weights


def make_arms(algorithms: Sequence[str], duration_weights: Sequence[str]) -> list[Arm]:
    """One arm per (algorithm, weight mode) pair, algorithms first, named `{algorithm}_{weights}`. PPO alone with
    modes among batch_mean and off keeps the arms' names from before algorithms were arms (`duration_weighted`,
    `unweighted`), which the results tables and the README's runs read. ValueError (one line) on an unknown,
    repeated or missing algorithm or mode."""
    for flag, given, known in (
        ("--algorithms", algorithms, ALGORITHMS),
        ("--duration_weights", duration_weights, DURATION_MODES),
    ):
        if not given:
            raise ValueError(f"{flag} is empty; known: {','.join(known)}")
        unknown = [x for x in given if x not in known]
        if unknown:
            raise ValueError(f"{flag}: unknown {unknown[0]!r}; known: {','.join(known)}")
        if len(set(given)) < len(given):
            raise ValueError(f"{flag} names {sorted(x for x in set(given) if list(given).count(x) > 1)[0]!r} twice")
    legacy = list(algorithms) == ["ppo"] and set(duration_weights) <= set(LEGACY_NAMES)
    return [Arm(LEGACY_NAMES[w] if legacy else f"{a}_{w}", a, w) for a in algorithms for w in duration_weights]


DEFAULT_ARMS = make_arms(["ppo"], ["batch_mean", "off"])


def arm_config(cfg: ConfigDict, arm: Arm) -> ConfigDict:
    """The run config of an arm: `cfg` with the arm's `learner.algorithm` and `ppo.duration_weights`. ValueError
    (one line) for a group objective without groups, or an algorithm this config cannot take."""
    c = cfg.copy_and_resolve_references()
    c.ppo.duration_weights = arm.duration_weights
    groupless = objectives.group_size_problem(arm.algorithm, c.sampler.get("group_size", 1))
    if groupless:
        raise ValueError(f"arm {arm.name}: {groupless}")
    if "learner" in c and "algorithm" in c.learner:
        c.learner.algorithm = arm.algorithm
    elif arm.algorithm != "ppo":
        raise ValueError(f"arm {arm.name}: this config has no learner.algorithm, so only ppo arms can run")
    return c


@dataclasses.dataclass(frozen=True)
class Scale:
    """How long the experiment runs: RL steps per arm and evaluation samples."""

    steps: int
    eval_samples: int


FULL = Scale(steps=20, eval_samples=64)
QUICK = Scale(steps=4, eval_samples=16)
