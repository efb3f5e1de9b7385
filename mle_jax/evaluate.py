"""python -m mle_jax.evaluate --workdir W [--samples N] [--task ID]: evaluates a finished run's latest policy as the
paper does (mle_jax/env/evaluation.py) and prints our numbers beside the paper's Table 1.

    python -m mle_jax.evaluate --workdir W --search POLICY --budget N [--seeds S] [--task ID]
        [--protocol ml_agent,mlebench] [--policy latest|initial] [--num_drafts 5 --debug_prob 0.5 --max_debug_depth 3]

With --budget it runs a search at test time instead (mle_jax/env/search.py): per task and seed, POLICY spends N
programs on a tree of drafts, debugs and improvements (`independent`: N drafts; `aide`: AIDE's policy, its published
defaults as flags; `greedy`: always improve the best node) and submits its best node by the metric the programs
print. --protocol reports the searches as the field does (mle_jax/env/protocols.py): `ml_agent` (8 runs per task,
average and best) and `mlebench` (at least 3 seeds, medal shares, the any-medal rate ± SE, the Lite aggregate), each
to W/protocol-<name>-<UTC date and time>.json with the command and the date. --policy initial evaluates the policy
RL started from (the warm start) instead of the latest.

The evaluation goes to a new file, W/evaluation-<UTC date and time>.json (the run's own evaluation.json is kept), and
W/report.md is rewritten with it; one line says so. With --task it goes to W/evaluation-<ID>.json and report.md,
which is about the run's tasks, is left as it was. A bad flag or a workdir without a run's policy ends in one line.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from absl import app, flags, logging
from rich.progress import Progress

from mle_jax.env import protocols, search
from mle_jax.env.evaluation import evaluate
from mle_jax.infra import interrupt
from mle_jax.reporting import provenance, report, search_report
from mle_jax.reporting.report import evaluation_printout
from mle_jax.run import builders, environment
from mle_jax.run.cli import fail, parse_flags
from mle_jax.run.settings import from_config
from mle_jax.tasks.registry import get_spec

_WORKDIR = flags.DEFINE_string("workdir", None, "a run's workdir", required=True)
_SAMPLES = flags.DEFINE_integer("samples", 0, "samples (0: the run's eval.samples, default 128)")
_TASK = flags.DEFINE_string(
    "task", None, "evaluate this task only: any task with data, one the run never trained on included (held out)"
)
_SEARCH = flags.DEFINE_enum(
    "search", "independent", list(search.POLICIES), "search policy at test time (with --budget)"
)
_BUDGET = flags.DEFINE_integer("budget", None, "programs per task and seed for the search (>= 1)")
_SEEDS = flags.DEFINE_integer(
    "seeds", None, "searches per task, seeds 0..S-1 (default 1; ml_agent: 8; mlebench: 3, at least 3)"
)
_PROTOCOL = flags.DEFINE_multi_enum("protocol", [], list(protocols.PROTOCOLS), "report as: ml_agent, mlebench")
_POLICY = flags.DEFINE_enum(
    "policy", "latest", ["latest", "initial"], "latest: the run's last policy; initial: what RL started from"
)
_NUM_DRAFTS = flags.DEFINE_integer("num_drafts", search.AIDE_NUM_DRAFTS, "aide, greedy: drafts before any other step")
_DEBUG_PROB = flags.DEFINE_float("debug_prob", search.AIDE_DEBUG_PROB, "aide: probability of a debug step")
_MAX_DEBUG_DEPTH = flags.DEFINE_integer(
    "max_debug_depth", search.AIDE_MAX_DEBUG_DEPTH, "aide: deepest chain of debug steps a buggy leaf may end"
)


# what one evaluate command runs at most: a larger number is a typo, and range(10**9) alone takes GBs. Raise them here
# to run more (each seed is a whole search of --budget programs; each sample a program run in the sandbox)
MAX_SEEDS = 1_000
MAX_BUDGET = 10_000
MAX_SAMPLES = 100_000


def check_size(flag: str, value: int | None, bound: int) -> None:
    """ValueError (one line naming the bound and where to raise it) when --flag exceeds what the command runs."""
    if value is not None and value > bound:
        name = f"MAX_{flag.upper()}"
        raise ValueError(f"--{flag}={value:,} is more than one evaluate command runs (at most {bound:,}); "
                         f"raise {name} in mle_jax/evaluate.py to run more")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """A search evaluation as the flags ask for it (checked before any work)."""

    policy: search.SearchPolicy
    budget: int
    seeds: tuple[int, ...]
    protocols: tuple[str, ...]


def search_request() -> SearchRequest | None:
    """The search the flags ask for, None for the paper's evaluation; ValueError (one line) for a bad combination."""
    asked = _BUDGET.value is not None or _SEARCH.present or _SEEDS.value is not None or _PROTOCOL.value
    if not asked:
        return None
    check_size("seeds", _SEEDS.value, MAX_SEEDS)  # before anything is built from them
    check_size("budget", _BUDGET.value, MAX_BUDGET)
    if _BUDGET.value is None:
        raise ValueError("--budget N (programs per task and seed) is needed with --search, --seeds or --protocol")
    if _BUDGET.value < 1:
        raise ValueError(f"--budget must be >= 1 program, got {_BUDGET.value}")
    chosen = tuple(dict.fromkeys(_PROTOCOL.value))
    seeds = _SEEDS.value
    if "ml_agent" in chosen:
        if seeds is not None and seeds != protocols.ML_AGENT_RUNS:
            runs = protocols.ML_AGENT_RUNS
            raise ValueError(f"--protocol ml_agent reports {runs} runs per task, not --seeds={seeds}")
        seeds = protocols.ML_AGENT_RUNS
    if "mlebench" in chosen:
        seeds = protocols.MLEBENCH_MIN_SEEDS if seeds is None else seeds
        if seeds < protocols.MLEBENCH_MIN_SEEDS:
            raise ValueError(f"--protocol mlebench needs at least {protocols.MLEBENCH_MIN_SEEDS} seeds, got {seeds}")
    seeds = 1 if seeds is None else seeds
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    policy = search.make_policy(_SEARCH.value, _NUM_DRAFTS.value, _DEBUG_PROB.value, _MAX_DEBUG_DEPTH.value)
    return SearchRequest(policy, _BUDGET.value, tuple(range(seeds)), chosen)


def has_policy(workdir: Path) -> bool:
    """Whether a workdir holds a trained policy to evaluate: RL checkpoints, or an HF export."""
    ckpts = workdir / "checkpoints"
    return (ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())) or (
        workdir / "hf_export" / "config.json"
    ).is_file()


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # not the checkpoint library's INFO lines
    workdir = Path(_WORKDIR.value)
    cfg_path = workdir / "config.json"
    if not cfg_path.exists():
        fail(f"{cfg_path} not found: --workdir must be a run's workdir")
    try:
        check_size("samples", _SAMPLES.value, MAX_SAMPLES)
        request = search_request()
    except ValueError as e:
        fail(str(e))
    try:
        saved = json.loads(cfg_path.read_text())
        if not isinstance(saved, dict) or not saved:
            raise ValueError("it holds no config")
        s = from_config({**saved, "workdir": str(workdir)})
    except (ValueError, KeyError, TypeError) as e:  # a JSONDecodeError or ConfigError is a ValueError
        fail(f"{cfg_path} is not a run's config ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
             "--workdir must be a run's workdir, as the run wrote it")  # fmt: skip
    # the prompted model (no warm start) is the initial policy of its run before any step; every other policy is
    # what the run wrote (a warm start is never trained here)
    if not (_POLICY.value == "initial" and not s.warmstart.enabled) and not has_policy(workdir):
        fail(f"{workdir} has neither checkpoints/ nor hf_export/: no policy to evaluate (has the run finished?)")
    if _SAMPLES.value:
        s = dataclasses.replace(s, eval=dataclasses.replace(s.eval, samples=_SAMPLES.value))
    tasks, packages = environment.prepare_mix(s)
    trained_on = [t.id for t in tasks]
    run_tasks = tasks if len(tasks) > 1 else tasks[0]
    if _POLICY.value == "initial":  # what RL started from, as the run built it: its latest policy is never loaded
        initial, tokenizer, _ = builders.build_policy(s, run_tasks, packages, workdir)
        model = initial
    else:
        model, initial, tokenizer = builders.load_trained_policy(s, run_tasks, packages, workdir)
    if _TASK.value:  # one task, of the mix or held out
        try:
            mix = {t.id: t for t in tasks}
            held = dataclasses.replace(s.task, id=_TASK.value, prepared_dir="")
            tasks = (
                [mix[_TASK.value]]
                if _TASK.value in mix
                else environment.prepare_mix(dataclasses.replace(s, task=held, tasks=(), task_weights=()))[0]
            )
        except (KeyError, ValueError, FileNotFoundError) as e:
            fail(f"--task={_TASK.value}: {str(e).strip(chr(39))}")
    # the run's instrumenter: its mode, its frozen initial model
    env_tasks = tasks if len(tasks) > 1 else tasks[0]
    with environment.open_environment(s, env_tasks, packages, model, tokenizer, workdir, initial=initial) as env:
        if request is None:
            result = evaluate(s.eval, env)
        else:
            result = evaluate_search(env, request, [t.id for t in tasks])
            result["search"]["model"] = model_label(s, _POLICY.value, workdir)
            result["search"]["policy_checkpoint"] = _POLICY.value
    now = datetime.now(UTC)
    path = workdir / f"evaluation-{_TASK.value}.json" if _TASK.value else dated_path(workdir, "evaluation", now)
    path.write_text(json.dumps(result, indent=2))
    if request is None:
        print(evaluation_printout(result))
    else:
        print(search_report.search_tables(result))
        for name in request.protocols:
            table = protocol_table(name, result, trained_on)
            out = provenance.write_json(dated_path(workdir, f"protocol-{name}", now), table)
            print(f"\n{search_report.protocol_markdown(table)}\nwrote {out}")
    if _TASK.value:
        print(f"wrote {path}; report.md (about the run's tasks) is left as it was")
        return
    summary_file = workdir / report.RUN_SUMMARY
    # a workdir from before run_summary.json: the report's Run table has only the task
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {"task": tasks[0].id}
    report_path = report.write_report(workdir, summary, result, plots=s.report.plots, evaluation_file=path.name)
    print(f"wrote {path} (the run's own evaluation.json is kept) and rewrote {report_path} with it")


def evaluate_search(env, request: SearchRequest, task_ids: list[str]) -> dict:
    """Every task's searches (one per seed) grown on `env`; evaluation.json's content: the settings, and per task the
    searches' trees and their summary over the seeds."""
    lower = {t: env.tasks[t].lower_is_better for t in task_ids}
    runs = search.new_searches(request.policy, request.budget, request.seeds, task_ids, lower)
    t0 = time.monotonic()
    with Progress() as progress:
        bar = progress.add_task(f"search: {request.policy.name}", total=sum(r.budget for r in runs))
        search.run_searches(
            env,
            runs,
            on_round=lambda done, total: progress.update(bar, completed=done),
            interrupted=lambda: interrupt.raise_if_requested(f"stopped during the {request.policy.name} search"),
        )
    per_task = {t: [r.record() for r in runs if r.task_id == t] for t in task_ids}
    return {
        "task": task_ids[0],
        "search": {
            **search.policy_settings(request.policy),
            "budget": request.budget,
            "seeds": list(request.seeds),
            "wall_s": round(time.monotonic() - t0, 1),
        },
        "tasks": {
            t: {"summary": protocols.search_summary(per_task[t], lower[t]), "searches": per_task[t]} for t in task_ids
        },  # fmt: skip
    }


def protocol_table(name: str, result: dict, trained_on: list[str]) -> dict:
    """The protocol `name`'s table of a search evaluation, with what it was measured with (policy, budget, model)."""
    per_task = {t: ev["searches"] for t, ev in result["tasks"].items()}
    lower = {t: get_spec(t).lower_is_better for t in per_task}
    if name == "ml_agent":
        table = protocols.ml_agent_table(per_task, lower, trained_on)
    else:
        table = protocols.mlebench_table(per_task, result["search"]["seeds"])
    return {**table, "search": result["search"], "summaries": {t: ev["summary"] for t, ev in result["tasks"].items()}}


def model_label(s, which: str, workdir: Path) -> str:
    """The evaluated model in words: its checkpoint folder's name, or the tiny model's size; which policy of which
    run."""
    m = s.model
    name = Path(m.path).name if m.path else f"tiny Qwen2 ({m.num_hidden_layers} layers, hidden {m.hidden_size})"
    start = "warm-started" if s.warmstart.enabled else "prompted (no warm start)"
    return f"{name}, {start if which == 'initial' else 'latest'} policy of run {workdir.name}"


def dated_path(workdir: Path, stem: str, now: datetime) -> Path:
    """workdir/<stem>-<UTC date and time>.json, a name no file there has yet."""
    stem = f"{stem}-{now.astimezone(UTC):%Y%m%dT%H%M%SZ}"
    path, n = workdir / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = workdir / f"{stem}-{n}.json"
    return path


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
