"""The experiment's plots: score and reward over RL steps (the paper's Fig. 5), the share of each kind over
steps (Fig. 2/8), Δt over steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure


def _smooth(x: np.ndarray, window: int) -> np.ndarray:
    if len(x) < window:
        return x
    kernel = np.ones(window) / window
    return np.convolve(np.pad(x, (window - 1, 0), mode="edge"), kernel, mode="valid")


def write_plots(summary: dict, out_dir: Path) -> list[Path]:
    """score and reward per step (Fig. 5), share of each kind per step (Fig. 2/8), Δt per step."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arms = summary["arms"]
    paths = []
    fig = Figure(figsize=(11, 3.8), dpi=110)
    axes = fig.subplots(1, 3)
    for i, (name, arm) in enumerate(arms.items()):
        steps = [r["step"] for r in arm["steps"]]
        for ax, key, label in zip(
            axes,
            ("reward_mean", "score_mean", "valid_fraction"),
            ("mean reward", "mean score (valid)", "valid"),
            strict=True,
        ):
            ys = np.array([np.nan if r[key] is None else r[key] for r in arm["steps"]], float)
            ax.plot(steps, ys, color=f"C{i}", alpha=0.25)
            ax.plot(steps, _smooth(np.nan_to_num(ys, nan=np.nanmean(ys)), 5), color=f"C{i}", label=name)
            ax.set(xlabel="RL step", title=label)
    for ax, key in zip(axes, ("mean_reward", "mean_score", "valid_fraction"), strict=True):
        for i, arm in enumerate(arms.values()):
            before, after = arm["before"][key], arm["after"][key]
            if before is not None and after is not None:
                ax.axhline(before, color="k", ls=":", lw=1)
                ax.axhline(after, color=f"C{i}", ls="--", lw=1)
    axes[0].legend(fontsize=8)
    fig.suptitle("RL on the real loop (dotted: evaluation before RL, dashed: after RL; lines: 5-step means)")
    fig.tight_layout()
    paths.append(out_dir / "score_reward.png")
    fig.savefig(paths[-1])

    kinds = sorted({k for arm in arms.values() for r in arm["steps"] for k in r["kinds"]})
    fig = Figure(figsize=(5.5 * len(arms), 3.8), dpi=110)
    axes = np.atleast_1d(fig.subplots(1, len(arms)))
    for ax, (name, arm) in zip(axes, arms.items(), strict=True):
        steps = [r["step"] for r in arm["steps"]]
        shares = np.array([[r["kinds"].get(k, 0.0) for k in kinds] for r in arm["steps"]], float)
        if len(steps):
            smooth = np.stack([_smooth(shares[:, j], 5) for j in range(len(kinds))], axis=1)
            ax.stackplot(steps, smooth.T, labels=kinds, colors=colormaps["tab20"](np.arange(len(kinds)) % 20))
        ax.set(xlabel="RL step", ylabel="share of the batch (5-step mean)", title=name, ylim=(0, 1))
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("kinds of solution the learner trained on (model families)")
    fig.tight_layout()
    paths.append(out_dir / "kinds.png")
    fig.savefig(paths[-1])

    fig = Figure(figsize=(6, 3.5), dpi=110)
    ax = fig.subplots()
    for i, (name, arm) in enumerate(arms.items()):
        steps = [r["step"] for r in arm["steps"]]
        dt = np.array([r["duration_s_mean"] for r in arm["steps"]], float)
        ax.plot(steps, dt, color=f"C{i}", alpha=0.25)
        ax.plot(steps, _smooth(dt, 5), color=f"C{i}", label=name)
    ax.set(xlabel="RL step", ylabel="seconds", title="mean run time Δt of the trained-on programs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "duration.png")
    fig.savefig(paths[-1])
    if any(r.get("task_score_mean") is not None for arm in arms.values() for r in arm["steps"]):
        paths.append(task_score_plot({summary.get("task", ""): summary}, out_dir / "task_score.png"))
    return paths


def task_score_plot(summaries: dict[str, dict], path: Path) -> Path:
    """The paper's Fig. 9: the mean task score of the trained-on batches (-10 for an invalid solution, the signed
    score otherwise, no partial credit) over RL steps, one panel per summary (task), per arm the mean over its
    repeats (thin lines: each repeat). summaries: {panel title: summary.json}."""
    fig = Figure(figsize=(5.2 * len(summaries), 3.8), dpi=110)
    axes = np.atleast_1d(fig.subplots(1, len(summaries)))
    for ax, (title, summary) in zip(axes, summaries.items(), strict=True):
        for i, (name, arm) in enumerate(summary["arms"].items()):
            curves = []
            for rep in arm.get("repeats") or [arm]:
                ys = {r["step"]: r.get("task_score_mean") for r in rep["steps"]}
                steps = sorted(k for k, v in ys.items() if v is not None)
                ax.plot(steps, [ys[k] for k in steps], color=f"C{i}", alpha=0.3, lw=1)
                curves.append({k: ys[k] for k in steps})
            common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            mean = [float(np.mean([c[k] for c in curves])) for k in common]
            style = ("-", "--", ":", "-.")[i % 4]  # arms whose curves coincide stay visible
            ax.plot(
                common, mean, color=f"C{i}", lw=2, ls=style, marker="o", ms=3, label=f"{name} ({len(curves)} seeds)"
            )
        ax.set(xlabel="RL step", ylabel="mean task score (invalid: -10)", title=title)
        ax.legend(fontsize=8)
    fig.suptitle("Task score during RL (thin: each seed; thick: their mean)")
    fig.tight_layout()
    fig.savefig(path)
    return path
