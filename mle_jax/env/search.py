"""Search at test time: a budget of programs spent on a tree of drafts, debugs and improvements, as ML-engineering
agents spend theirs (AIDE, AIRA-dojo), instead of independent samples.

    python -m mle_jax.evaluate --workdir W --search aide --budget 8 [--seeds 3]

A search grows one tree per task and seed. Each node is one response of the policy and the one program it runs (a
response without code runs nothing and is a failed node): a draft answers the scratch prompt; a debug or an
improvement answers the paper's improve prompt (`Environment.improve_prompt`: the parent's plan, code and terminal
output), so the trained policy needs no new prompt. The budget counts nodes, the same for every policy: policies
compare at equal sandbox cost.

What a policy sees (`Tree`, `PublicNode`) is public: the node's place in the tree, whether its run failed, and the
validation metric the run printed. Never the grader's score, its validity verdict or a medal: those need the private
answers, and they are kept apart (in the driver's records, for analysis) where no policy can read them.

- A node is *buggy* when its run did not exit 0 (error, timeout, memory, killed, executor failure) or wrote no
  submission.csv (or the response had no code). Else it is *good*, AIDE's word.
- Its *printed metric* is the validation metric its run printed, from two sources in this order. First the number
  after the last ``testing loss:`` progress print that carries the run's tag, i.e. the instrumenter's print
  (mle_jax/tasks/progress.py; the instrumenter prints the value when the program assigned the metric to a name). Else
  the number on the last line of the program's own output that reports a validation metric (``validation auc:
  0.61``, ``val_loss = 0.4``, ``cv log loss: 0.52``: a line starting with validation, valid, val, holdout, cv or oof,
  then a colon or an equals sign): AIDE asks its programs to print the metric on a hold-out set and its reviewer
  reads it from the output, and the warm-start corpus, hence the policy, prints ``validation <metric>: <value>``
  (mle_jax/warmstart/programs/), computed inline, so that the instrumenter's ``testing loss:`` beside it has no
  value. The program's own ``testing loss:`` prints never count: they are replaced by ``pass`` before it runs. A
  program can print any number; the search trusts it as AIDE does, and only to choose a node: the reward never reads
  it. The value is read in the task's direction (the task statement says it), as AIDE's reviewer reports it with its
  direction. Each node records which source gave its metric.
- The *best* node: the good node with the best printed metric (the first of equals); when no good node printed one,
  the last good node. It is what `aide` and `greedy` improve and what every search submits; a search without a good
  node submits nothing (an invalid submission).

Policies (`POLICIES`), behind one interface (`SearchPolicy.next_step`):
- `independent`: every node a draft: N independent samples of the scratch prompt.
- `aide`: AIDE's search policy (WecoAI/aideml, aide/agent.py `Agent.search_policy`; its defaults in
  aide/utils/config.yaml `agent.search`: num_drafts 5, debug_prob 0.5, max_debug_depth 3): draft until num_drafts
  drafts exist; then with probability debug_prob debug a random buggy leaf whose debug depth is at most
  max_debug_depth; otherwise improve the best good node, or draft when there is none.
- `greedy`: AIRA-dojo's greedy (facebookresearch/aira-dojo): num_drafts drafts, then always improve the best good
  node (draft when there is none); AIDE without its debug step.

Searches run on the executor fleet in rounds (`run_searches`): every search of the evaluation (each task and seed)
proposes what it can now (drafts at once; a step that needs results waits for them), the proposals are sampled in
one generate call, instrumented in one batch and run together on the fleet (several nodes in flight: the local
sandboxes or a Ray fleet), and the round ends when they have all finished. The rounds make the trees a function
of the seeds, the sampler's stream and what the programs print, not of which program happened to end first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from mle_jax.env import rollout
from mle_jax.env.driver import EpisodeDriver
from mle_jax.env.printed_metric import node_metric
from mle_jax.executor.result import Status
from mle_jax.tasks.medals import medal

OPERATORS: tuple[str, ...] = ("draft", "debug", "improve")
# AIDE's published defaults (WecoAI/aideml, aide/utils/config.yaml, agent.search)
AIDE_NUM_DRAFTS = 5
AIDE_DEBUG_PROB = 0.5
AIDE_MAX_DEBUG_DEPTH = 3


@dataclass(frozen=True)
class PublicNode:
    """A node as a search policy sees it: nothing in it depends on the private answers.

    done: its program has finished (or it had no program); buggy: done, and its run failed or wrote no
    submission.csv; metric: its printed validation metric (None: none printed, or not done)."""

    id: int
    parent: int | None
    operator: str
    done: bool = False
    buggy: bool = False
    metric: float | None = None


@dataclass
class Tree:
    """One search's nodes in the order they were proposed, public facts only, and the task's direction."""

    lower_is_better: bool
    nodes: list[PublicNode] = field(default_factory=list)

    def add(self, operator: str, parent: int | None) -> PublicNode:
        if operator not in OPERATORS:
            raise ValueError(f"unknown operator {operator!r}; one of {OPERATORS}")
        if (parent is None) != (operator == "draft"):
            raise ValueError(f"a {operator} node {'needs' if parent is None else 'has no'} parent")
        node = PublicNode(len(self.nodes), parent, operator)
        self.nodes.append(node)
        return node

    def finish(self, node_id: int, buggy: bool, metric: float | None) -> None:
        old = self.nodes[node_id]
        self.nodes[node_id] = PublicNode(old.id, old.parent, old.operator, True, buggy, None if buggy else metric)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def pending(self) -> list[PublicNode]:
        return [n for n in self.nodes if not n.done]

    @property
    def drafts(self) -> list[PublicNode]:
        return [n for n in self.nodes if n.parent is None]

    @property
    def buggy(self) -> list[PublicNode]:
        return [n for n in self.nodes if n.done and n.buggy]

    @property
    def good(self) -> list[PublicNode]:
        return [n for n in self.nodes if n.done and not n.buggy]

    def is_leaf(self, node_id: int) -> bool:
        return not any(n.parent == node_id for n in self.nodes)

    def debug_depth(self, node_id: int) -> int:
        """AIDE's `Node.debug_depth`: 0 for a node that is not a debug step, else its parent's plus one (the length
        of the chain of debug steps that ends at it)."""
        depth, node = 0, self.nodes[node_id]
        while node.operator == "debug":
            depth += 1
            node = self.nodes[node.parent]  # type: ignore[index]  # a debug node has a parent
        return depth

    def best(self) -> PublicNode | None:
        """The good node with the best printed metric in the task's direction (the first of equals); the last good
        node when none printed one; None without a good node."""
        good = self.good
        scored = [n for n in good if n.metric is not None]
        if scored:
            sign = -1.0 if self.lower_is_better else 1.0
            return max(scored, key=lambda n: (sign * n.metric, -n.id))  # type: ignore[operator]
        return good[-1] if good else None


@dataclass(frozen=True)
class Step:
    """What a policy asks for next: an operator and the node it applies to (None for a draft)."""

    operator: str
    parent: int | None = None


class SearchPolicy(Protocol):
    """A search policy: the next step for a tree, or None to wait for the nodes in flight."""

    name: str

    def next_step(self, tree: Tree, rng: np.random.Generator) -> Step | None: ...


class Independent:
    """Every node a draft of the scratch prompt: N independent samples."""

    name = "independent"

    def next_step(self, tree: Tree, rng: np.random.Generator) -> Step | None:
        return Step("draft")


@dataclass(frozen=True)
class Aide:
    """AIDE's search policy (aide/agent.py `Agent.search_policy`), its published defaults."""

    num_drafts: int = AIDE_NUM_DRAFTS
    debug_prob: float = AIDE_DEBUG_PROB
    max_debug_depth: int = AIDE_MAX_DEBUG_DEPTH
    name: str = "aide"

    def next_step(self, tree: Tree, rng: np.random.Generator) -> Step | None:
        if len(tree.drafts) < self.num_drafts:
            return Step("draft")
        if tree.pending:  # the choice below needs every result
            return None
        if rng.random() < self.debug_prob:
            depth = self.max_debug_depth
            debuggable = [n for n in tree.buggy if tree.is_leaf(n.id) and tree.debug_depth(n.id) <= depth]
            if debuggable:
                return Step("debug", debuggable[int(rng.integers(len(debuggable)))].id)
        best = tree.best()
        return Step("draft") if best is None else Step("improve", best.id)


@dataclass(frozen=True)
class Greedy:
    """AIRA-dojo's greedy: num_drafts drafts, then always improve the best good node (draft when there is none)."""

    num_drafts: int = AIDE_NUM_DRAFTS
    name: str = "greedy"

    def next_step(self, tree: Tree, rng: np.random.Generator) -> Step | None:
        if len(tree.drafts) < self.num_drafts:
            return Step("draft")
        if tree.pending:
            return None
        best = tree.best()
        return Step("draft") if best is None else Step("improve", best.id)


# name -> the policy from AIDE's settings (num_drafts, debug_prob, max_debug_depth), each taking those it has
POLICIES: dict[str, Callable[[int, float, int], SearchPolicy]] = {
    "independent": lambda num_drafts, debug_prob, max_debug_depth: Independent(),
    "aide": Aide,
    "greedy": lambda num_drafts, debug_prob, max_debug_depth: Greedy(num_drafts),
}


def make_policy(
    name: str,
    num_drafts: int = AIDE_NUM_DRAFTS,
    debug_prob: float = AIDE_DEBUG_PROB,
    max_debug_depth: int = AIDE_MAX_DEBUG_DEPTH,
) -> SearchPolicy:
    """The policy `name` (one of POLICIES) with AIDE's settings where it has them; ValueError (one line) otherwise."""
    if name not in POLICIES:
        raise ValueError(f"unknown search policy {name!r}; one of {', '.join(POLICIES)}")
    if num_drafts < 1:
        raise ValueError(f"num_drafts must be >= 1, got {num_drafts}")
    if not 0.0 <= debug_prob <= 1.0:
        raise ValueError(f"debug_prob must be in [0, 1], got {debug_prob}")
    if max_debug_depth < 0:
        raise ValueError(f"max_debug_depth must be >= 0, got {max_debug_depth}")
    return POLICIES[name](num_drafts, debug_prob, max_debug_depth)


def policy_settings(policy: SearchPolicy) -> dict:
    """The policy's name and settings, as evaluation.json records them."""
    out: dict = {"name": policy.name}
    for key in ("num_drafts", "debug_prob", "max_debug_depth"):
        if hasattr(policy, key):
            out[key] = getattr(policy, key)
    return out


# ---- the driver: trees grown on the environment ---------------------------------------------------------------


def is_buggy(sample: rollout.Sample) -> bool:
    """Whether a finished node failed, from public facts only: no code, a run that did not exit 0 (an executor
    failure included) or no submission.csv written. The grader's verdict is not used."""
    r = sample.result
    return sample.code is None or r is None or r.status is not Status.OK or r.submission_path is None


@dataclass
class Search:
    """One search: a task, a seed, its tree, and (apart from the tree, never shown to the policy) the samples of its
    nodes, which hold what the grader said."""

    task_id: str
    seed: int
    policy: SearchPolicy
    budget: int
    tree: Tree
    rng: np.random.Generator
    samples: dict[int, rollout.Sample] = field(default_factory=dict)
    metric_sources: dict[int, str | None] = field(default_factory=dict)
    wall_s: float = 0.0
    _started: float = field(default_factory=time.monotonic)

    @property
    def exhausted(self) -> bool:
        return len(self.tree) >= self.budget

    @property
    def finished(self) -> bool:
        return self.exhausted and not self.tree.pending

    def record(self) -> dict:
        """The search as evaluation.json keeps it: its nodes in the order they ran, what it submitted."""
        nodes = [node_record(n, self.samples.get(n.id), self.task_id) for n in self.tree.nodes]
        for n in nodes:
            n["metric_source"] = self.metric_sources.get(n["id"]) if n["metric"] is not None else None
        best = self.tree.best()
        submitted = nodes[best.id] if best is not None else None
        return {
            "task": self.task_id,
            "seed": self.seed,
            "policy": self.policy.name,
            "budget": self.budget,
            "wall_s": round(self.wall_s, 2),
            "programs_run": sum(1 for n in nodes if n["status"] is not None),
            "nodes": nodes,
            "submitted": {
                "node": None if submitted is None else submitted["id"],
                "metric": None if submitted is None else submitted["metric"],
                "valid": bool(submitted and submitted["valid"]),
                "score": None if submitted is None else submitted["score"],
                "medal": None if submitted is None else submitted["medal"],
            },
        }


def node_record(node: PublicNode, sample: rollout.Sample | None, task_id: str) -> dict:
    """A node of evaluation.json: its place in the tree, status, printed metric and Δt; for analysis only, the
    grader's verdict, score and medal."""
    r = None if sample is None else sample.reward
    valid = bool(r is not None and r.valid)
    score = float(r.score) if valid and r is not None and r.score is not None else None
    return {
        "id": node.id,
        "parent": node.parent,
        "operator": node.operator,
        "status": None if sample is None or sample.result is None else str(sample.result.status),
        "buggy": node.buggy,
        "metric": node.metric,
        "duration_s": None if sample is None else round(sample.duration_s, 3),
        "uid": None if sample is None else sample.uid,
        "prints": None if r is None else r.n_prints,
        "instrument": None if sample is None else sample.instrument_path,
        # analysis only: the grader's (private answers), never seen by the policy
        "valid": valid,
        "score": score,
        "medal": medal(task_id, score) if score is not None else None,
        "code": None if sample is None else sample.code,
    }


def _prompt(env: rollout.Environment, search: Search, step: Step) -> rollout.PromptItem:
    if step.operator == "draft":
        return env.scratch_prompt(search.task_id)
    parent = search.samples[step.parent]  # type: ignore[index]
    return env.improve_prompt(env.previous(parent))


def run_searches(
    env: rollout.Environment,
    searches: Sequence[Search],
    first_uid: int = 0,
    on_round: Callable[[int, int], None] | None = None,
    interrupted: Callable[[], None] | None = None,
) -> list[Search]:
    """Grows every search to its budget in rounds (module doc), on `env`'s sampler and executor fleet.

    on_round(done, total): called as nodes finish (a progress bar). interrupted(): called while waiting; it raises
    to stop (Ctrl-C), the programs in flight being cancelled when the environment closes."""
    uid = first_uid
    total = sum(s.budget for s in searches)
    done = 0
    while not all(s.finished for s in searches):
        proposed: list[tuple[Search, PublicNode, rollout.PromptItem]] = []
        for s in searches:
            while not s.exhausted:
                step = s.policy.next_step(s.tree, s.rng)
                if step is None:
                    break
                if step.operator != "draft" and (step.parent is None or not s.tree.nodes[step.parent].done):
                    raise RuntimeError(f"{s.policy.name} asked to {step.operator} node {step.parent}, not finished")
                node = s.tree.add(step.operator, step.parent)
                proposed.append((s, node, _prompt(env, s, step)))
        if not proposed:
            raise RuntimeError("no search could step, and none has a node in flight")  # a policy that waits forever
        samples = env.sample([p for _, _, p in proposed], uid)
        uid += len(samples)
        for (s, node, _), sample in zip(proposed, samples, strict=True):
            s.samples[node.id] = sample
        driver = EpisodeDriver(env)  # a node is one turn: submitted, run, graded and observed by the driver
        driver.start(samples)
        driver.run_out(interrupted=interrupted)
        for s, node, sample in ((s, node, s.samples[node.id]) for s, node, _ in proposed):
            metric, source = node_metric(sample.raw_output, sample.tag)
            s.tree.finish(node.id, is_buggy(sample), metric)
            s.metric_sources[node.id] = source
            done += 1
            if s.finished:
                s.wall_s = time.monotonic() - s._started
        if on_round is not None:
            on_round(done, total)
    return list(searches)


def new_searches(
    policy: SearchPolicy, budget: int, seeds: Sequence[int], task_ids: Sequence[str], lower_is_better: dict[str, bool]
) -> list[Search]:
    """One search per task and seed (tasks first), each with its own random stream (seed, task index)."""
    if budget < 1:
        raise ValueError(f"the budget must be >= 1 program, got {budget}")
    return [
        Search(t, seed, policy, budget, Tree(lower_is_better[t]), np.random.default_rng([seed, i]))
        for i, t in enumerate(task_ids)
        for seed in seeds
    ]
