"""Does RL on the real loop make the agent better, and do the duration weights matter there?

    python -m mle_jax.experiments.learning --config=configs/pizza.py:cpu --out DIR [--quick] [--config.x=y ...]
        [--warm_start OTHER_DIR]   (start from OTHER_DIR's warm-started policy instead of making one)
        [--algorithms=ppo,grpo --duration_weights=batch_mean,off]   (one arm per pair)
        [--arm=NAME:FIELD=VALUE[,FIELD=VALUE...] ...]   (an arm per --arm: config overrides; NAME: for none)
        [--seeds N]   (every arm N times, seeds cfg.seed + 0..N-1, from the same warm start)
        [--turns=1,3]   (every arm once per K, named ARM_tK, agent.turns=K: does revising beat resampling?)
        [--progress]   (nothing run: DIR/progress.json says how far each arm and repeat got, for runs past a session)
        [--partial]   (nothing run: DIR/partial/ summarises the runs evaluated after RL so far, contrasts included)

The real loop, on real data, from one warm-started policy: the embedded run's sandbox, grader, frozen LM
instrumenter, sampler and learner, in arms with the same seed that differ only in their config overrides.
`--arm=NAME:FIELD=VALUE,...` names one (the paper's other ablations: `--arm=paper:
--arm=no_instrumentation:instrument.mode=off --arm=scratch_only:prompt.improve_fraction=0`); an override of an
unknown field, or of one every arm must share (the warm start's model, tokenizer and task, the seed, the
evaluation, the executor fleet: arms.REFUSED), fails the command in one line before any work. The shorthand
--algorithms x --duration_weights makes one arm per objective (`learner.algorithm`) and weight mode
(`ppo.duration_weights`), named `{algorithm}_{weights}` (say `grpo_batch_mean`); without --arm its default,
PPO with "batch_mean" (the paper's) and "off", keeps the two arms' names from before algorithms were arms:
`duration_weighted` and `unweighted`. The group objectives need `--config.sampler.group_size` > 1, which then
holds for every arm. With --seeds N every arm runs N times (seed cfg.seed + r in repeat r: its sampling, prompt
stream, critic and updates), all from the one warm start. The policy is evaluated before RL (once: every arm
starts from it, with the same seeds) and after RL in each arm and repeat, on `eval_samples` scratch prompts
with the same seeds. With --turns=K1,K2,... (issue 31: episodes of K turns, each program written after reading the
previous one's run) every arm is split into one arm per K, `ARM_tK`, with the override agent.turns=K, and every
evaluation runs the same number of programs per start prompt, K_max = the largest K: a K-turn arm's K_max / K
independent episodes, handing in the best by the agent's own printed held-out metric (env/printed_metric.py, never
the private score), so the one-turn arm hands in the best of K_max independent programs. The before-RL evaluation
runs once per K (before_tK.json). The summary then has `turns_contrasts`: each K-turn arm against the smallest K's,
before and after RL (valid hand-ins, task score, mean score, medals; in SEs). Written to DIR:

    summary.json   the command, the date and the wall time of the processes that measured it (`record_wall`);
                   per arm: before / after (mean_reward, se_reward, valid_fraction, mean_score, the paper's task
                   score ± SE, kinds), the per-step series (reward, score, task score, valid fraction, mean Δt,
                   share of each solution kind), each repeat's (`repeats`), the task scores across repeats
                   (`task_score`: final and curve, mean ± SE across seeds and within; runs never valid),
                   executor utilisation, learner idle fraction, the instrumenter's LM / fallback shares, RL steps
                   per hour, the process's peak resident memory while the arm ran, and the mean of every
                   `stale/*` metric the learner reports; and the corpus's kinds of solution measured on this
                   machine (Δt and score per family); `contrasts`: each arm against the first, in SEs
    plots/*.png    score and reward over RL steps (the paper's Fig. 5), the share of each kind over steps
                   (Fig. 2/8), Δt over steps, the task score over steps per arm and repeat (Fig. 9)
    report.md      the figures above in a page

Everything is resumable: the warm start, each arm's RL (checkpoints) and each evaluation are cached in DIR,
so a killed experiment started again with the same command continues.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from absl import app, flags, logging

from mle_jax.experiments.learning.arms import (
    ALGORITHMS,
    FULL,
    QUICK,
    Scale,
    arm_config,
    parse_turns,
    select_arms,
    split_by_turns,
)
from mle_jax.experiments.learning.progress import experiment_progress, partial_summary
from mle_jax.experiments.learning.report import mean_reward_text, revision_text
from mle_jax.experiments.learning.running import experiment, share_warm_start
from mle_jax.reporting import provenance
from mle_jax.rl.duration import DURATION_MODES
from mle_jax.run.cli import config_flag, parse_flags
from mle_jax.run.settings import from_config

_FLAGS: dict[str, Any] = {}  # defined when run as a program, so that importing this module defines no flags


def _define_flags() -> dict[str, Any]:
    return {
        "config": config_flag(),
        "out": flags.DEFINE_string("out", None, "output folder (resumes what is there)"),
        "quick": flags.DEFINE_bool(
            "quick", False, f"{QUICK.steps} steps and {QUICK.eval_samples} eval samples per arm"
        ),
        "steps": flags.DEFINE_integer("steps", 0, "RL steps per arm (0: the scale's)"),
        "eval": flags.DEFINE_integer("eval_samples", 0, "evaluation samples (0: the scale's)"),
        "warm": flags.DEFINE_string(
            "warm_start", "", "start from this other experiment folder's warm start (its base/)"
        ),
        "algorithms": flags.DEFINE_list(
            "algorithms", ["ppo"], f"objectives (learner.algorithm), one arm each per weight mode: {ALGORITHMS}"
        ),
        "weights": flags.DEFINE_list(
            "duration_weights", ["batch_mean", "off"], f"ppo.duration_weights modes, one arm each: {DURATION_MODES}"
        ),
        "arm": flags.DEFINE_multi_string(
            "arm", [], "an arm: NAME:FIELD=VALUE[,FIELD=VALUE...] (config overrides; NAME: for none), repeatable"
        ),
        "seeds": flags.DEFINE_integer("seeds", 1, "repeats of every arm, seeds cfg.seed + 0..N-1"),
        "before_only": flags.DEFINE_bool(
            "before_only", False, "only the before-RL evaluations (no arm trained); resumable, reused by a later run"
        ),
        "turns": flags.DEFINE_list(
            "turns", [], "episode lengths K (agent.turns), one arm each per arm (ARM_tK); empty: the config's"
        ),
        "progress": flags.DEFINE_bool(
            "progress", False, "only write DIR/progress.json: how far each arm and repeat got (nothing is run)"
        ),
        "partial": flags.DEFINE_bool(
            "partial",
            False,
            "only summarise the runs evaluated after RL so far into DIR/partial/ (summary.json, report.md; nothing "
            "is run)",
        ),
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if _FLAGS["config"].value is None or not _FLAGS["out"].value:
        raise app.UsageError("--config and --out are required")
    scale = QUICK if _FLAGS["quick"].value else FULL
    scale = Scale(_FLAGS["steps"].value or scale.steps, _FLAGS["eval"].value or scale.eval_samples)
    out = Path(_FLAGS["out"].value)
    try:
        if _FLAGS["seeds"].value < 1:
            raise ValueError(f"--seeds must be >= 1, got {_FLAGS['seeds'].value}")
        shorthand = _FLAGS["algorithms"].present or _FLAGS["weights"].present
        arms = select_arms(_FLAGS["arm"].value, _FLAGS["algorithms"].value, _FLAGS["weights"].value, shorthand)
        turns = parse_turns(_FLAGS["turns"].value)
        arms = split_by_turns(arms, turns)
        for arm in arms:
            from_config(arm_config(_FLAGS["config"].value, arm))
    except ValueError as e:  # ConfigError too: one line, before any work
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if _FLAGS["progress"].value:
        report = experiment_progress(out, arms, _FLAGS["seeds"].value, scale.steps, turns)
        provenance.write_json(out / "progress.json", report)
        for name, r in report["runs"].items():
            after = "evaluated" if r["evaluated_after"] else "not evaluated"
            print(f"{name}: {r['steps_logged']} of {r['steps_planned']} RL steps (checkpoint {r['last_checkpoint']}), "
                  f"{r['rl_wall_s'] / 60:.0f} min of RL, after RL {after}")  # fmt: skip
        print(f"progress: {out / 'progress.json'}")
        return
    if _FLAGS["partial"].value:
        seeds = _FLAGS["seeds"].value
        partial = partial_summary(_FLAGS["config"].value, out, arms, seeds, scale, turns)
        finished = sum(len(a["repeats"]) for a in partial["arms"].values())
        print(f"{finished} of {len(arms) * seeds} runs evaluated after RL: {out / 'partial' / 'report.md'}")
        return
    if _FLAGS["warm"].value:
        share_warm_start(Path(_FLAGS["warm"].value), out)
    summary = experiment(
        _FLAGS["config"].value, out, scale, arms, _FLAGS["seeds"].value, turns, _FLAGS["before_only"].value
    )
    if summary.get("before_only"):
        for name, arm in summary["arms"].items():
            b = arm["before"]
            print(f"{name}: before RL, reward {mean_reward_text(b)}, valid {b['valid_fraction']:.2f} of {b['samples']}")
        for c in (summary.get("turns_contrasts") or {}).values():
            print(revision_text(summary, c, "before"))
        print(f"report: {out / 'report.md'}")
        return
    for name, arm in summary["arms"].items():
        final = arm["task_score"]["final"]
        print(f"{name}: reward {mean_reward_text(arm['before'])} -> {mean_reward_text(arm['after'])}, valid "
              f"{arm['before']['valid_fraction']:.2f} -> {arm['after']['valid_fraction']:.2f}, task score "
              f"{final['mean']:.3f} ± {final['se'] or 0:.3f} across {arm['task_score']['runs']} seeds")  # fmt: skip
    for c in (summary.get("turns_contrasts") or {}).values():
        print(revision_text(summary, c, "after"))
    print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    _FLAGS.update(_define_flags())
    app.run(main, flags_parser=parse_flags)
