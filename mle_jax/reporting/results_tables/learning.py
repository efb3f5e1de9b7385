"""The tables and figures of the learning experiment's summaries (mle_jax.experiments.learning: docs/results/RUN/
summary.json), and of the task mix's evidence file beside them (mle_jax.experiments.mix_evidence)."""

from __future__ import annotations

from collections.abc import Callable

from mle_jax.reporting.markdown import markdown_table, minutes, number, plus_minus, signed
from mle_jax.reporting.results_tables.ablations import arm_contrasts, tested_text
from mle_jax.reporting.results_tables.sources import RESULTS
from mle_jax.reporting.statistics import ALPHA, share_contrast, welch_from_stats

# every learning run in docs/results: the utilisation table has a row per arm of each
LEARNING_RUNS = ("learning-spooky", "learning-spooky-sft300", "learning-spooky-sft300-concurrent",
                 "learning-spooky-concurrent-40", "learning-spooky-quick", "learning-pizza", "learning-pizza-quick",
                 "learning-pizza-2026-11-23", "learning-pizza-quick-2026-11-23")  # fmt: skip

TESTS_HEADER = "before against after (one run: the programs the unit)"
ARM_LABELS = {"batch_mean": "Δt-weighted (`batch_mean`)", "off": "unweighted (`off`)"}


def _arms(summary: dict) -> list[tuple[str, dict]]:
    return [(ARM_LABELS[a["stats"]["duration_weights"]], a) for a in summary["arms"].values()]


def before_after_tests(before: dict, after: dict) -> str:
    """Before against after RL in one arm (one run: the programs are the unit, n samples each): the valid fraction
    by Fisher's exact test, the mean reward by Welch's test, each with its p-value and verdict word."""
    n_b, n_a = before["samples"], after["samples"]
    valid = share_contrast(round(after["valid_fraction"] * n_a), n_a, round(before["valid_fraction"] * n_b), n_b)
    reward = welch_from_stats(after["mean_reward"], after["se_reward"], n_a, before["mean_reward"],
                              before["se_reward"], n_b)  # fmt: skip

    def said(c, test: str) -> str:
        return (
            "not tested" if c.p is None else f"{test} p = {c.p:.2g}, {'beyond' if c.beyond_noise else 'within'} noise"
        )

    return f"n = {n_b} → {n_a}; valid: {said(valid, 'Fisher')}; reward: {said(reward, 'Welch')}"


def paired_text(paired: dict | None) -> str:
    """One run's after-against-before test paired by start prompt (`outcomes.paired_by_prompt`), as a cell."""
    if paired is None:
        return "—"

    def said(t: dict) -> str:
        if t["p"] is None:
            return "not tested (no prompt's figure changed)"
        verdict = "beyond" if t["p"] < ALPHA else "within"
        return f"{signed(t['diff'], 3)} (paired permutation p = {t['p']:.2g}, {verdict} noise)"

    return f"n = {paired['n']} prompts; reward {said(paired['reward'])}; valid {said(paired['valid'])}"


def render_spooky_learning(*summaries: dict) -> str:
    """Before → after RL per arm (reward, valid fraction, log loss of the valid programs, best of N)."""
    rows = []
    for s in summaries:
        for i, (label, a) in enumerate(_arms(s)):
            b, f = a["before"], a["after"]
            rows.append([
                f"{s['warmstart']['steps']} SFT steps" if i == 0 else "", label,
                f"{plus_minus(b['mean_reward'], b['se_reward'])} → {plus_minus(f['mean_reward'], f['se_reward'])}",
                f"{number(b['valid_fraction'])} → {number(f['valid_fraction'])}",
                f"{plus_minus(b['mean_score'], b['se_score'], 3)} → {plus_minus(f['mean_score'], f['se_score'], 3)}",
                f"{number(b['best_score'], 3)} → {number(f['best_score'], 3)}", before_after_tests(b, f),
            ])  # fmt: skip
    n = summaries[0]["scale"]
    header = ["warm start", f"arm ({n['steps']} steps × B={summaries[0]['batch_size']})",
              "mean reward ± SE, before → after", "valid fraction, before → after",
              "mean log loss of valid ± SE, before → after",
              f"best of {n['eval_samples']}, before → after"]  # fmt: skip
    return markdown_table(header, rows)


PIZZA_RUNS = {"learning-pizza": "2026-11-24 (copy-decoding instrumenter)",
              "learning-pizza-2026-11-23": "2026-11-23 (free-decoding instrumenter)"}  # fmt: skip


def render_pizza_learning(*summaries: dict) -> str:
    rows = []
    for label, s in zip(PIZZA_RUNS.values(), summaries, strict=True):
        for i, (arm, a) in enumerate(_arms(s)):
            b, f = a["before"], a["after"]
            rows.append([
                label if i == 0 else "", arm,
                f"{plus_minus(b['mean_reward'], b['se_reward'])} → {plus_minus(f['mean_reward'], f['se_reward'])}",
                f"{number(b['valid_fraction'])} → {number(f['valid_fraction'])}",
                f"{number(b['mean_score'], 3)} → {number(f['mean_score'], 3)}",
                f"{number(b['best_score'], 3)} → {number(f['best_score'], 3)}", before_after_tests(b, f),
            ])  # fmt: skip
    n = summaries[0]["scale"]
    header = ["run", f"arm ({n['steps']} steps × B={summaries[0]['batch_size']})",
              "mean reward ± SE, before → after", "valid fraction, before → after",
              "mean AUC of valid, before → after", f"best of {n['eval_samples']}, before → after",
              TESTS_HEADER]  # fmt: skip
    return markdown_table(header, rows)


def render_learning_utilisation(*summaries: dict) -> str:
    """Executor utilisation, learner idle fraction, the LM instrumenter's share and the RL wall time per arm."""
    rows = []
    for path, s in zip(LEARNING_RUNS, summaries, strict=True):
        for label, a in _arms(s):
            st = a["stats"]
            rows.append([f"[{path}]({RESULTS}/{path}/report.md)", label, number(st["executor_utilization"]),
                         number(st["learner_idle_fraction"]), number(st["instrument_lm_share"], 3),
                         minutes(st["rl_wall_s"])])  # fmt: skip
    header = ["run", "arm", "executor utilisation", "learner idle", "LM-instrumented share of parsing programs",
              "RL wall time"]  # fmt: skip
    return markdown_table(header, rows)


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
        rows.append([label, f"{round(w['instrument_heldout_accept'] * n)} of {n}", number(precision), number(recall)])
    return markdown_table(
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
            loss = number(k["score_median"], 3)
            row += [
                f"{name}, {rep_name}",
                number(k["duration_s_median"], 1),
                f"**{loss}**" if f"{fam} {rep}" in slow else loss,
            ]
        rows.append(row[:3] + [""] + row[3:])
    header = ["kind", "median Δt (s)", "median log loss", "", "kind", "median Δt (s)", "median log loss"]
    return markdown_table(header, rows)


def reward_change_figure(summary: dict) -> str:
    """Each arm's mean reward after RL less before, and the before-RL mean they share: "+0.69 (Δt-weighted) and
    +1.34 (unweighted) from its before-RL mean of −3.96 ± 1.35"."""
    changes = [f"{signed(a['after']['mean_reward'] - a['before']['mean_reward'])} ({label.split(' (')[0]})"
               for label, a in _arms(summary)]  # fmt: skip
    before = next(iter(summary["arms"].values()))["before"]
    mean = plus_minus(before["mean_reward"], before["se_reward"])
    return f"{' and '.join(changes)} from its before-RL mean of {mean}"


CLASSIFIERS = {"linear_svm": "linear SVM", "naive_bayes": "naive Bayes", "sgd": "SGD", "logreg": "logistic regression"}


def slow_kinds_figure(summary: dict) -> str:
    """What the warm-started policy wrote of the corpus's slower and better kinds (word + character features)
    against the same classifiers on words alone, before RL: how many were valid, and their mean rewards."""
    kinds = summary["slow_and_better"]["kinds"]
    outcomes = next(iter(summary["arms"].values()))["before"]["kind_outcomes"]
    slow = [outcomes[k] for k in kinds]
    word = [outcomes[k.replace("word+char", "word")] for k in kinds]
    valid = ", ".join(
        f"{round(o['valid_fraction'] * o['samples'])} of {o['samples']} ({CLASSIFIERS[k.split()[0]]})"
        for k, o in zip(kinds, slow, strict=True)
    )
    shares = sorted(o["valid_fraction"] for o in word)
    rewards = [number(o["reward_mean"]) for o in slow]
    word_rewards = sorted((o["reward_mean"] for o in word), reverse=True)
    return (
        f"valid {valid}, against {shares[0]:.0%} to {shares[-1]:.0%} for the word-only kinds, so their mean reward was "
        f"{', '.join(rewards[:-1])} and {rewards[-1]} against {number(word_rewards[0])} to {number(word_rewards[-1])}"
    )


def best_before_rl_figure(summary: dict) -> str:
    """The warm-started policy's best score before RL (the arms share it), and the mean score of the verified corpus
    it was fine-tuned on."""
    before = next(iter(summary["arms"].values()))["before"]
    n = summary["scale"]["eval_samples"]
    return (
        f"the warm-started policy's best of {n} before RL was already {number(before['best_score'], 3)}, and the "
        f"grid's verified programs score {number(summary['warmstart']['corpus_score_mean'], 3)} on average"
    )


def corpus_median_figure(summary: dict) -> str:
    m = summary["corpus_medians"]
    return f"median program {number(m['duration_s'], 1)} s, log loss {number(m['score'], 3)}"


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
        lags = [f"{number(g['kinds']['version_lag_mean'], 1)} vs {number(g['others']['version_lag_mean'], 1)}"
                for g in (lag["duration_weighted"], lag["unweighted"])]  # fmt: skip
        rows.append([
            f"{label}; {s['warmstart']['steps']} SFT steps, {s['scale']['steps']} RL steps",
            plus_minus(*before), plus_minus(*after_w), plus_minus(*after_u),
            f"{signed(c['difference'])} ({signed(c['z'], 1)})",
            *lags,
        ])  # fmt: skip
    header = ["run", "before RL", "after, Δt-weighted", "after, unweighted", "difference (SE)",
              "lag, weighted arm", "lag, unweighted arm"]  # fmt: skip
    return markdown_table(header, rows)


def change_text(before: dict, after: dict, key: str, se_key: str, valid_only: bool = False, digits: int = 2) -> str:
    """after − before of an evaluation figure (mean and its SE over the evaluation's samples, `summarize`) by Welch's
    test (reporting/statistics.py): "+0.34 (p = 0.21)". valid_only: a mean over the valid samples only (its n)."""
    na, nb = before.get("samples"), after.get("samples")
    if valid_only and na and nb:
        na, nb = round(before["valid_fraction"] * na), round(after["valid_fraction"] * nb)
    if None in (before.get(key), after.get(key), before.get(se_key), after.get(se_key)) or not na or not nb:
        return "—"
    if na < 2 or nb < 2:
        return f"{signed(after[key] - before[key], digits)} (no test)"
    x = welch_from_stats(after[key], after[se_key], nb, before[key], before[se_key], na)
    return f"{signed(x.diff, digits)} (no test)" if x.p is None else f"{signed(x.diff, digits)} (p = {x.p:.2g})"


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
            sb = slow.get(name)
            share = f"{plus_minus(*sb['before'])} → {plus_minus(*sb['after'])}" if sb else "—"
            lag = f"{number(stale.get('stale/version_lag_slow'))} / {number(stale.get('stale/version_lag_fast'))}"
            clip = f"{number(stale.get('stale/clipfrac_slow'), 3)} / {number(stale.get('stale/clipfrac_fast'), 3)}"
            rows.append([
                f"`{name}`",
                f"{plus_minus(b['mean_reward'], b['se_reward'])} → {plus_minus(f['mean_reward'], f['se_reward'])}",
                change_text(b, f, "mean_reward", "se_reward"),
                f"{number(b['valid_fraction'])} → {number(f['valid_fraction'])}",
                f"{plus_minus(b['mean_score'], b['se_score'], 3)} → {plus_minus(f['mean_score'], f['se_score'], 3)}",
                change_text(b, f, "mean_score", "se_score", valid_only=True, digits=3), share,
                number(st.get("steps_per_hour"), 0), number(st.get("peak_rss_gib"), 1), lag, clip,
            ])  # fmt: skip
    n = summaries[0]["scale"]
    header = [f"arm ({n['steps']} steps × B={summaries[0]['batch_size']}, groups of "
              f"{summaries[0].get('group_size', 1)})", "mean reward ± SE, before → after",
              "change (Welch p)", "valid fraction, before → after", "mean score of valid ± SE, before → after",
              "change (Welch p)", "slow-and-better share ± SE, before → after", "steps / hour",
              "peak GiB", "version lag slow / fast", "clipped share slow / fast"]  # fmt: skip
    return markdown_table(header, rows)


def render_mix_evidence(d: dict) -> str:
    """mle_jax.experiments.mix_evidence's file: per task of the mix (and the held-out task), the evaluation before
    and after RL, and beside it the same task's single-task learning run where docs/results has one."""

    def best(f: dict) -> str:
        return f"{number(f['best_score'], 3)} ({f['best_medal'] or '—'})"

    def arrow(b: dict, a: dict | None, fmt: Callable[[dict], str]) -> str:
        return f"{fmt(b)} → {fmt(a)}" if a else f"{fmt(b)} → —"

    def reward(f: dict) -> str:
        return plus_minus(f["mean_reward"], f["se_reward"])

    def valid(f: dict) -> str:
        return number(f["valid_fraction"])

    def z(b: dict, a: dict | None) -> str:
        return change_text(b, a, "mean_reward", "se_reward") if a else "—"

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
              "eval samples", "mean reward ± SE, before → after", "change (Welch p)", "valid fraction, before → after",
              "best score (medal), before → after", "single-task run of the task (duration-weighted arm)"]  # fmt: skip
    return markdown_table(header, rows)


def render_learning_progress(progress: dict) -> str:
    """How far a learning experiment got (its progress.json: `python -m mle_jax.experiments.learning ... --progress`):
    per arm and repeat, the RL steps logged of those planned, the last whole checkpoint, the RL time so far (its
    update and sampling parts), the valid fraction of each step's trained samples, the trained improve share, and
    whether the after-RL evaluation is done."""
    rows = []
    for name, r in progress["runs"].items():
        valid = " ".join(number(v, 2) for v in r["valid_fraction_by_step"]) or "—"
        rows.append([
            f"`{name}`", f"{r['steps_logged']} of {r['steps_planned']}", r["last_checkpoint"] or "—",
            minutes(r["rl_wall_s"]), f"{minutes(r['update_s'])} / {minutes(r['sample_s'])}", valid,
            number(r["improve_share_trained"], 2), "yes" if r["evaluated_after"] else "no",
        ])  # fmt: skip
    header = ["run (arm, repeat)", "RL steps done", "last checkpoint", "RL time", "of it: update / sampling",
              "valid fraction of the trained samples, per step", "improve share trained",
              "evaluated after RL"]  # fmt: skip
    return markdown_table(header, rows)


def learning_progress_figure(progress: dict) -> str:
    """The progress file in a sentence: RL steps done of those planned over every run, the runs begun, the
    evaluations after RL done, and the date it was read."""
    runs = progress["runs"].values()
    begun = sum(r["steps_logged"] > 0 for r in runs)
    return (
        f"{progress['steps_done']} of {progress['steps_planned']} RL steps done ({begun} of {len(runs)} runs begun, "
        f"{progress['evaluations_after_done']} evaluated after RL; {progress['date'][:10]})"
    )


def render_rl_before_after(summary: dict) -> str:
    """A learning summary's runs, one row per arm and seed: the valid fraction and the mean reward ± SE before and
    after RL on the same start prompts, the after-against-before test paired by start prompt (`paired_text`), the
    share of improve prompts among the samples trained on, and in how many of the steps that trained on scratch
    samples one of them was valid ("—" for a summary from before the split was logged)."""
    rows = []
    for name, arm in summary["arms"].items():
        b = arm["before"]
        for r in arm["repeats"]:
            f = r["after"]
            shares = [s["improve_fraction"] for s in r["steps"] if s.get("improve_fraction") is not None]
            scratch = [s["valid_fraction_scratch"] for s in r["steps"] if s.get("valid_fraction_scratch") is not None]
            reward = [plus_minus(e["mean_reward"], e["se_reward"], 3) for e in (b, f)]
            rows.append([
                f"`{name}`", r["seed"], len(r["steps"]),
                f"{number(b['valid_fraction'], 2)} → {number(f['valid_fraction'], 2)}", " → ".join(reward),
                paired_text(r.get("paired_before_after")), number(sum(shares) / len(shares), 2) if shares else "—",
                f"{sum(v > 0 for v in scratch)} of {len(scratch)}" if scratch else "—",
            ])  # fmt: skip
    header = ["arm", "seed", "RL steps", "valid fraction, before → after", "mean reward ± SE, before → after",
              "after − before, paired by start prompt", "improve share trained",
              "steps with a valid scratch sample trained on"]  # fmt: skip
    return markdown_table(header, rows)


def render_rl_arm_contrasts(summary: dict) -> str:
    """A learning summary's arms against its first (`ablations.arm_contrasts`), the seed the unit (Welch's test over
    each arm's per-seed values): the after-RL evaluation's mean reward and valid fraction, the final task score, and
    the mean over RL steps of the trained-on batches' task score, one row per contrast arm, each arm's per-seed
    after-RL mean rewards beside it."""
    arms = summary["arms"]
    rows = []
    for name, c in arm_contrasts(arms).items():
        seeds = [arms[n]["task_score"].get("reward") for n in (c["reference"], name)]
        per_seed = " vs ".join(", ".join(number(v, 3) for v in s["values"]) if s else "—" for s in seeds)
        rows.append([f"`{c['reference']}` − `{name}`", tested_text(c.get("reward")), tested_text(c.get("valid"), 2),
                     tested_text(c["final"]), tested_text(c["curve"], 2), per_seed])  # fmt: skip
    header = ["contrast", "after-RL mean reward", "after-RL valid fraction", "final task score",
              "task score over RL steps", "after-RL mean reward per seed"]  # fmt: skip
    return markdown_table(header, rows)


def rl_contrast_figure(summary: dict) -> str:
    """Each arm against the first in one line (`render_rl_arm_contrasts`' first two columns): the after-RL mean
    reward and valid fraction by Welch's test over the seeds, with the runs it rests on."""
    arms = summary["arms"]
    parts = []
    for name, c in arm_contrasts(arms).items():
        runs = " and ".join(str(arms[n]["task_score"]["runs"]) for n in (c["reference"], name))
        parts.append(f"`{c['reference']}` − `{name}` ({runs} runs): after-RL mean reward "
                     f"{tested_text(c.get('reward'))}, valid fraction {tested_text(c.get('valid'), 2)}")  # fmt: skip
    return "; ".join(parts) if parts else "no two arms evaluated after RL yet"
