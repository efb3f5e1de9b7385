"""A search evaluation (mle_jax/env/search.py, in evaluation.json) and its protocol tables (mle_jax/env/protocols.py)
for people: markdown tables, and a plot per task of each search's nodes in the order they ran, coloured by operator.

- `search_tables(evaluation)`: per task the summary over seeds, then each seed's tree in a line and its medal
- `protocol_markdown(table)`: a protocol file's table (ml_agent or mlebench), with what it was measured with
- `write_search_plots(evaluation, out_dir)`: plots/search_<task>.png, the grader's score (analysis only) by node
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mle_jax.reporting.markdown import markdown_table, plus_minus
from mle_jax.tasks.medals import LEVELS
from mle_jax.tasks.registry import get_spec

OPERATOR_LETTERS = {"draft": "d", "debug": "b", "improve": "i"}
OPERATOR_COLOURS = {"draft": "tab:blue", "debug": "tab:red", "improve": "tab:green"}


def is_search(evaluation: Mapping[str, Any] | None) -> bool:
    """Whether an evaluation is a search's (evaluate --budget), not the paper's samples."""
    return bool(evaluation) and "search" in evaluation  # type: ignore[operator]


def setting_line(cfg: Mapping[str, Any]) -> str:
    """The search's policy, its settings, budget and seeds in one line."""
    extra = ", ".join(f"{k} {cfg[k]}" for k in ("num_drafts", "debug_prob", "max_debug_depth") if k in cfg)
    line = f"search `{cfg['name']}`" + (f" ({extra})" if extra else "")
    line += f", budget {cfg['budget']} programs per task and seed, {len(cfg['seeds'])} seed(s)"
    if cfg.get("model"):
        line += f"; model: {cfg['model']}"
    if cfg.get("wall_s") is not None:
        line += f"; wall {cfg['wall_s']} s"
    return line


def tree_line(nodes: list[Mapping[str, Any]]) -> str:
    """A search's nodes in the order they ran: d draft, b debug, i improve, each with its parent's id after a
    caret, x before a buggy node: "d d xd b^2 i^0"."""
    out = []
    for n in nodes:
        text = ("x" if n["buggy"] else "") + OPERATOR_LETTERS[n["operator"]]
        out.append(text if n["parent"] is None else f"{text}^{n['parent']}")
    return " ".join(out)


def search_tables(evaluation: Mapping[str, Any]) -> str:
    """The search evaluation: its setting, the summary over seeds per task, each seed's tree and submission."""
    rows, seeds = [], []
    for task, ev in evaluation["tasks"].items():
        s = ev["summary"]
        rows.append([
            task, s["seeds"], plus_minus(s["valid_rate"], s["valid_rate_se"], 3),
            plus_minus(s["mean_score"], s["mean_score_se"], 4), s["best_score"],
            plus_minus(s["any_medal"], s["any_medal_se"], 3), s["node_valid_fraction"], s["metric_printed_fraction"],
            s["mean_wall_s"],
        ])  # fmt: skip
        for rec in ev["searches"]:
            sub = rec["submitted"]
            score, level = (sub["score"], sub["medal"]) if sub["valid"] else (None, "invalid")
            seeds.append([task, rec["seed"], tree_line(rec["nodes"]), sub["node"], sub["metric"], score, level])
    header = ["task", "seeds", "submission valid ± SE", "mean submitted score ± SE", "best submitted",
              "any medal ± SE", "nodes valid", "nodes with a printed metric", "wall s per search"]  # fmt: skip
    per_seed = ["task", "seed", "tree (d draft, b debug, i improve ^parent; x buggy)", "submitted node",
                "printed metric", "score", "medal"]  # fmt: skip
    return "\n\n".join([
        setting_line(evaluation["search"]), markdown_table(header, rows), markdown_table(per_seed, seeds),
    ])  # fmt: skip


def search_medal_line(evaluation: Mapping[str, Any]) -> str:
    """One task's search in a sentence (report.md's summary)."""
    s = evaluation["summary"]
    return (
        f"{s['seeds']} search(es): submission valid {plus_minus(s['valid_rate'], s['valid_rate_se'], 2)}, mean "
        f"submitted score {plus_minus(s['mean_score'], s['mean_score_se'], 4)}, any medal "
        f"{plus_minus(s['any_medal'], s['any_medal_se'], 2)}"
    )


def protocol_markdown(table: Mapping[str, Any]) -> str:
    """A protocol's table (protocols.ml_agent_table or mlebench_table, as evaluate writes it), with its setting."""
    setting = setting_line(table["search"])
    if table["protocol"] == "ml_agent":
        rows = []
        for r in table["rows"]:
            theirs = r.get("ml_agent")
            rows.append([
                r["task"], r["split"], r["direction"], f"{r['valid_runs']} of {r['runs']}", r["average"], r["best"],
                f"{theirs['average']} / {theirs['best']} ({theirs['split']})" if theirs else "—",
            ])  # fmt: skip
        header = ["task", "split (ours)", "metric", "valid runs", "average", "best",
                  "ML-Agent average / best (its split; another model and budget)"]  # fmt: skip
        return f"ML-Agent's protocol, {table['runs_per_task']} runs per task; {setting}\n\n" + markdown_table(
            header, rows
        )
    rows = [
        [t["task"], "yes" if t["lite"] else "no", t["seeds"], *(t["shares"][k] for k in (*LEVELS, "invalid")),
         plus_minus(t["any_medal"], t["any_medal_se"], 3)]
        for t in table["tasks"]
    ]  # fmt: skip
    for name in ("lite", "all"):
        agg = table[name]
        if agg["tasks"]:
            rows.append([f"{name} ({len(agg['tasks'])} tasks)", "", len(table["seeds"]), *([""] * 6),
                         plus_minus(agg["any_medal"], agg["any_medal_se"], 3)])  # fmt: skip
    header = ["task", "Lite", "seeds", *(lv.replace("_", " ") for lv in LEVELS), "invalid", "any medal ± SE"]
    return (
        f"MLE-bench's protocol, {len(table['seeds'])} seeds; {setting}; not the leaderboard's 24-hour setting\n\n"
        + markdown_table(header, rows)
    )


def write_search_plots(evaluation: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """plots/search_<task>.png per task: each search's nodes in the order they ran (x) and the grader's score of the
    valid ones (y; analysis only: the search never saw it), coloured by operator, one marker per seed, the submitted
    node ringed; buggy or invalid nodes as crosses on the worst edge."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    markers = "osD^vP*X"
    written = []
    for task, ev in evaluation["tasks"].items():
        fig = Figure(figsize=(6.5, 3.8), dpi=110)
        ax = fig.subplots()
        scores = [n["score"] for rec in ev["searches"] for n in rec["nodes"] if n["score"] is not None]
        lower = get_spec(task).lower_is_better
        margin = 0.05 * (max(scores) - min(scores) + 1e-9) if scores else 0.0
        floor = (max(scores) + margin if lower else min(scores) - margin) if scores else 0.0  # the worst edge
        for k, rec in enumerate(ev["searches"]):
            m = markers[k % len(markers)]
            for n in rec["nodes"]:
                colour = OPERATOR_COLOURS[n["operator"]]
                if n["score"] is None:
                    ax.scatter([n["id"]], [floor], marker="x", color=colour, s=25, alpha=0.6)
                else:
                    ax.scatter([n["id"]], [n["score"]], marker=m, color=colour, s=30)
            sub = rec["submitted"]
            if sub["valid"]:
                ax.scatter([sub["node"]], [sub["score"]], marker="o", s=140, facecolors="none", edgecolors="black")
        handles = [Line2D([], [], marker="o", ls="", color=c, label=op) for op, c in OPERATOR_COLOURS.items()]
        handles += [Line2D([], [], marker="o", ls="", mfc="none", mec="black", label="submitted")]
        handles += [Line2D([], [], marker="x", ls="", color="grey", label="buggy / invalid")]
        ax.legend(handles=handles, fontsize=7)
        ax.set_xlabel("node (order run)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"score ({'lower' if lower else 'higher'} is better; grader, analysis only)", fontsize=8)
        ax.set_title(f"{task}: {evaluation['search']['name']} search, one marker per seed", fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"search_{task}.png"
        fig.savefig(path)
        written.append(path)
    return written
