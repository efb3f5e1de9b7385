"""The experiment's arms (named sets of config overrides, one run config each) and its scale.

An arm comes from `--arm=NAME:FIELD=VALUE[,FIELD=VALUE...]` (`parse_arm`; `--arm=paper:` overrides nothing) or
from the shorthand `--algorithms` x `--duration_weights` (`make_arms`). Every arm starts RL from the one warm start
the base config makes, so an arm may not override what that warm start is made of, nor what all arms share by
construction (`REFUSED`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from typing import Any

from ml_collections import ConfigDict

from mle_jax.rl import objectives
from mle_jax.rl.duration import DURATION_MODES

# the objectives behind config.learner.algorithm (issue 21); "ppo" is the paper's, with its critic
ALGORITHMS = tuple(objectives.OBJECTIVES)
LEGACY_NAMES = {"batch_mean": "duration_weighted", "off": "unweighted"}  # PPO's two arms, as results_tables reads


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    algorithm: str | None = None  # config.learner.algorithm (None: the config's)
    duration_weights: str | None = None  # config.ppo.duration_weights (None: the config's)
    overrides: tuple[tuple[str, str], ...] = ()  # (dotted field, value as written), applied after the two above


# What an arm may not override, by dotted prefix, and why: the warm start every arm starts from is made once, from
# the base config (its model and tokenizer, its task, its SFT), and the arms share one executor fleet, one seed per
# repeat and one evaluation. Fields the warm start reads but RL also uses (prompt.*, instrument.*) are the arm's
# to set: they change the arm's RL, never the warm start it starts from.
_WARM_START = "would change the warm start every arm shares (model, tokenizer, task)"
REFUSED: dict[str, str] = {
    "model.": _WARM_START,
    "task.": _WARM_START,
    "tasks": _WARM_START,
    "task_weights": _WARM_START,
    "task_timeouts_s": _WARM_START,
    "warmstart.": _WARM_START,
    "seed": "is the experiment's: each repeat's seed (--seeds), the same in every arm",
    "workdir": "is the experiment's (--out)",
    "resume": "is the experiment's (it always resumes)",
    "eval.": "is the evaluation every arm shares (--eval_samples)",
    "loop.steps": "is the experiment's scale (--steps, --quick)",
    **{
        f"executor.{k}": "is the executor fleet every arm shares"
        for k in (
            "backend",
            "fleet",
            "slots",
            "queue_size",
            "ray_address",
            "image",
            "sandbox_python",
            "docker_url",
            "ray_actor_cpus",
        )  # fmt: skip
    },
}
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def parse_arm(spec: str) -> Arm:
    """An arm from `NAME:FIELD=VALUE[,FIELD=VALUE...]` (the value of one --arm; `NAME:` overrides nothing). Only
    the syntax is checked here; `arm_config` checks the fields against the config. ValueError (one line) on a
    spec without a name, a colon or `=`, or one that names a field twice."""
    name, colon, rest = spec.partition(":")
    if not colon:
        raise ValueError(f"--arm={spec}: expected NAME:FIELD=VALUE[,FIELD=VALUE...] (NAME: for no override)")
    if not _NAME.match(name):
        raise ValueError(f"--arm={spec}: the arm's name must be letters, digits, _ or - (got {name!r})")
    overrides = []
    for part in filter(None, (p.strip() for p in rest.split(","))):
        field, eq, value = part.partition("=")
        if not eq or not field.strip():
            raise ValueError(f"--arm={spec}: {part!r} is not FIELD=VALUE")
        overrides.append((field.strip(), value.strip()))
    fields = [f for f, _ in overrides]
    twice = next((f for f in fields if fields.count(f) > 1), None)
    if twice:
        raise ValueError(f"--arm={spec}: {twice} is set twice")
    return Arm(name, overrides=tuple(overrides))


def select_arms(
    specs: Sequence[str], algorithms: Sequence[str], duration_weights: Sequence[str], shorthand: bool
) -> list[Arm]:
    """The experiment's arms: the --arm specs; with `shorthand` (--algorithms or --duration_weights given) or no
    --arm at all, the shorthand's arms (`make_arms`) first. ValueError (one line) on a bad spec or a name used
    twice."""
    arms = [parse_arm(s) for s in specs]
    if shorthand or not arms:
        arms = make_arms(algorithms, duration_weights) + arms
    names = [a.name for a in arms]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ValueError(f"two arms are named {twice!r}")
    return arms


def make_arms(algorithms: Sequence[str], duration_weights: Sequence[str]) -> list[Arm]:
    """One arm per (algorithm, weight mode) pair, algorithms first, named `{algorithm}_{weights}`. PPO alone with
    modes among batch_mean and off keeps the arms' names from before algorithms were arms (`duration_weighted`,
    `unweighted`), which the results tables and the runs in docs/results.md read. ValueError (one line) on an unknown,
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


def parse_turns(values: Sequence[str]) -> tuple[int, ...]:
    """The --turns list (as absl gives it: strings) as ints, in the order given; () for none (today's experiment).
    ValueError (one line) on a value that is no integer >= 1, a repeated one, or a value that does not divide the
    largest (its arm could not run the same number of programs per start prompt as the largest's)."""
    out = []
    for v in values:
        try:
            k = int(str(v).strip())
        except ValueError:
            raise ValueError(f"--turns: {v!r} is not an integer") from None
        if k < 1:
            raise ValueError(f"--turns: {k} is not >= 1 (1: the paper's one-turn agent)")
        if k in out:
            raise ValueError(f"--turns names {k} twice")
        out.append(k)
    if out and any(max(out) % k for k in out):
        bad = next(k for k in out if max(out) % k)
        raise ValueError(f"--turns: {bad} does not divide {max(out)}, so its arm cannot run {max(out)} programs per "
                         f"start prompt as the {max(out)}-turn arm does")  # fmt: skip
    return tuple(out)


def split_by_turns(arms: Sequence[Arm], turns: Sequence[int]) -> list[Arm]:
    """Every arm once per turns value K, named `<arm>_t<K>`, with the override agent.turns=K (arm by arm, turns
    inner: `a_t1, a_t3, b_t1, b_t3`); the arms unchanged when `turns` is empty. A shorthand arm is named by its pair,
    `{algorithm}_{weights}` (`ppo_batch_mean_t3`): the legacy names are for the runs from before --turns. ValueError
    (one line) for an arm that sets agent.turns itself."""
    if not turns:
        return list(arms)
    out = []
    for arm in arms:
        if any(f == "agent.turns" for f, _ in arm.overrides):
            raise ValueError(f"arm {arm.name} sets agent.turns itself; --turns sets it for every arm")
        shorthand = arm.algorithm is not None and arm.duration_weights is not None
        name = f"{arm.algorithm}_{arm.duration_weights}" if shorthand else arm.name
        out += [dataclasses.replace(arm, name=f"{name}_t{k}", overrides=(*arm.overrides, ("agent.turns", str(k))))
                for k in turns]  # fmt: skip
    names = [a.name for a in out]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ValueError(f"two arms are named {twice!r}")
    return out


def eval_draws(turns: int, all_turns: Sequence[int]) -> int:
    """Independent episodes per start prompt in the evaluation of an arm of `turns` turns, so that every arm runs
    max(all_turns) programs per start prompt: max // turns (1 without --turns)."""
    return max(all_turns) // turns if all_turns else 1


def arm_config(cfg: ConfigDict, arm: Arm) -> ConfigDict:
    """The run config of an arm: `cfg` with the arm's `learner.algorithm`, `ppo.duration_weights` and overrides
    (each value read as the type of the field it replaces). ValueError (one line) for a group objective without
    groups, an algorithm this config cannot take, an unknown field, a field an arm may not set (`REFUSED`) or a
    value of the wrong type."""
    c = cfg.copy_and_resolve_references()
    if arm.duration_weights is not None:
        c.ppo.duration_weights = arm.duration_weights
    if arm.algorithm is not None:
        if "learner" in c and "algorithm" in c.learner:
            c.learner.algorithm = arm.algorithm
        elif arm.algorithm != "ppo":
            raise ValueError(f"arm {arm.name}: this config has no learner.algorithm, so only ppo arms can run")
    for field, text in arm.overrides:
        _set(c, field, text, arm.name)
    algorithm = c.learner.algorithm if "learner" in c and "algorithm" in c.learner else "ppo"
    groupless = objectives.group_size_problem(algorithm, c.sampler.get("group_size", 1))
    if groupless:
        raise ValueError(f"arm {arm.name}: {groupless}")
    return c


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, ConfigDict):
        return [prefix]
    return [leaf for k in node.keys() for leaf in _leaves(node[k], f"{prefix}{k}" if not prefix else f"{prefix}.{k}")]


def _set(c: ConfigDict, field: str, text: str, arm: str) -> None:
    """Sets the dotted `field` of `c` to `text` read as the field's type (bool, int, float or str)."""
    why = next(
        (why for p, why in REFUSED.items() if field == p.rstrip(".") or p.endswith(".") and field.startswith(p)), None
    )
    if why:
        raise ValueError(f"arm {arm}: {field} {why}; an arm cannot set it")
    *path, last = field.split(".")
    node = c
    for part in path:
        node = node[part] if isinstance(node, ConfigDict) and part in node else None
    if not isinstance(node, ConfigDict) or last not in node or isinstance(node[last], ConfigDict):
        near = difflib.get_close_matches(field, _leaves(c), n=1, cutoff=0.6)
        raise ValueError(f"arm {arm}: {field} is no config field" + (f" (did you mean {near[0]}?)" if near else ""))
    current = node[last]
    try:
        if isinstance(current, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError("expected true or false")
            value: Any = text.lower() == "true"
        elif isinstance(current, int | float | str):
            value = type(current)(text)
        else:
            raise ValueError(f"it is a {type(current).__name__}; an arm sets only numbers, strings and booleans")
    except ValueError as e:
        raise ValueError(f"arm {arm}: {field}={text}: {e}") from None
    node[last] = value


@dataclasses.dataclass(frozen=True)
class Scale:
    """How long the experiment runs: RL steps per arm and evaluation samples."""

    steps: int
    eval_samples: int


FULL = Scale(steps=20, eval_samples=64)
QUICK = Scale(steps=4, eval_samples=16)
