"""Which results files each block of README.md, BUILD.md and docs/*.md reads, and the renderer that writes it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from mle_jax.reporting.results_tables.ablations import (
    ABLATION_RUNS,
    improve_trained_figure,
    never_valid_figure,
    render_ablation_contrasts,
    render_ablation_table,
)
from mle_jax.reporting.results_tables.benchmarks import (
    render_benchmarks,
    render_hostile_inputs,
    render_mfu_sweep,
    render_micro_sweep,
    render_objective_step,
    render_step_profile,
)
from mle_jax.reporting.results_tables.chaos import CHAOS, render_chaos
from mle_jax.reporting.results_tables.duration_bias import render_duration_bias
from mle_jax.reporting.results_tables.learning import (
    HELDOUT_RUNS,
    LEARNING_RUNS,
    PIZZA_RUNS,
    SPOOKY_RUNS,
    best_before_rl_figure,
    corpus_median_figure,
    learning_progress_figure,
    render_instrument_heldout,
    render_learning_progress,
    render_learning_utilisation,
    render_mix_evidence,
    render_objective_arms,
    render_pizza_learning,
    render_rl_arm_contrasts,
    render_rl_before_after,
    render_slow_and_better,
    render_spooky_corpus_kinds,
    render_spooky_learning,
    reward_change_figure,
    rl_contrast_figure,
    slow_kinds_figure,
    wall_figure,
)
from mle_jax.reporting.results_tables.plans import render_objective_plans, render_plans
from mle_jax.reporting.results_tables.qwen import (
    QWEN,
    QWEN_PLANS,
    qwen_runs_figure,
    qwen_samplers,
    render_qwen_before_rl,
    render_qwen_improve,
    render_qwen_instrument,
    render_qwen_plans,
    render_qwen_runs,
)
from mle_jax.reporting.results_tables.search import (
    EVIDENCE,
    ML_AGENT,
    QWEN_SEARCH,
    render_search_contrasts,
    render_search_evidence,
    render_search_lite,
    render_search_ml_agent,
    render_search_operators,
    search_wall_figure,
)
from mle_jax.reporting.results_tables.smollm2 import (
    SMOL,
    render_compile_counts,
    render_smollm2_instrument,
    render_smollm2_memory,
    render_smollm2_profile,
    render_smollm2_rlstep,
    render_smollm2_roofline,
    render_smollm2_samplers_history,
    render_smollm2_samples,
    smollm2_memory,
    smollm2_resume,
    smollm2_rlstep_walls,
    smollm2_samplers,
    smollm2_samplers_before,
    smollm2_sft_step,
)
from mle_jax.reporting.results_tables.sources import RESULTS, summary_path
from mle_jax.reporting.results_tables.tiers import render_test_tiers, test_tiers_wall
from mle_jax.reporting.results_tables.turns import (
    TURNS_RUNS,
    WARMSTART_DEBUG,
    render_turns_contrasts,
    render_turns_table,
    render_warmstart_debug,
)
from mle_jax.reporting.results_tables.weight_sync import WEIGHT_SYNC, render_weight_sync


@dataclass(frozen=True)
class Entry:
    """One rendered block: the results files it reads (paths from the repository root) and its renderer."""

    sources: tuple[str, ...]
    render: Callable[..., str]  # one argument per source: a dict (JSON) or a list of dicts (JSONL)
    inline: bool = False  # a figure inside a sentence (`figure:` markers), not a table


QWEN_TURNS_RUNS = ("qwen-turns-pizza", "qwen-turns-spooky")  # revising against resampling on Qwen (issue 46)
QWEN_RL_PROGRESS = f"{RESULTS}/qwen-rl-pizza/progress.json"  # how far RL on Qwen got (issue 46)
QWEN_RL_PARTIAL = f"{RESULTS}/qwen-rl-pizza/partial.json"  # its runs finished so far, summarised (--partial)
OBJECTIVE_PLANS = tuple(f"{RESULTS}/objective_plans_{a}_{n}.json" for a in ("ppo", "grpo") for n in (8, 4, 2))

# bench/objective_step.py's files of issue 37 on an H100, and the code each measured
STEP_PROFILE_VARIANTS = {
    "1_blocked": "our blocked attention (float32 scores), float32 head backward",
    "2_cudnn": "`model.attention=dot_product` (cuDNN flash attention), float32 head backward",
    "3_cudnn_bf16_head": "cuDNN attention, bf16 head backward (`ops.head_matmul`)",
    "4_cudnn_bf16_head_noremat_micro4": "the same, remat off (micro-batch 8 ran out of memory)",
    "5_chunk2048": "cuDNN attention, bf16 head backward, logits of 2,048 positions at a time (`ppo.logits_chunk`)",
    "6_chunk0": "the same, the logits of every position at once (`ppo.logits_chunk=0`)",
    "7_chunk128": "the same, 128 positions at a time (512 in the rows above)",
    "ppo_cudnn_bf16_head": "cuDNN attention, bf16 head backward",
}

# bench/objective_step.py's files of issue 37's H200 lease (2026-11-27): the lease call each ran in, and what changed
STEP_MFU_VARIANTS = {
    "1_autodiff_full": (1, "the code before this lease (the H100 table's best row)"),
    "2_fused_full": (1, "the logprobs' hand-written backward (`ppo.fused_logprobs`)"),
    "3_fused_dots": (1, "and remat keeps the projections' outputs (`model.remat_policy=dots`)"),
    "4_fused_noremat": (1, "the same, remat off"),
    "6_fused_dots_chunk512": (1, "fused, dots, 512 positions per logits chunk (the configs' default)"),
    "7_profile_fused_dots": (1, "fused, dots (again, traced)"),
    "5_ppo_fused_dots": (1, "fused, dots"),
    "3b_fused_dots_scan_rerun": (2, "fused, dots, scanned layers (this call's peer)"),
    "8_fused_dots_unrolled": (2, "and the layers unrolled (`model.scan_layers=false`)"),
    "9_fused_dots_unrolled_chunk512": (2, "the same, 512 positions per logits chunk"),
    "11_profile_fused_dots_unrolled": (2, "the same, 2,048 positions (again, traced)"),
    "10_ppo_fused_dots_unrolled": (2, "fused, dots, unrolled"),
    "12_whole_3b_full": (3, "the whole 3b (36 layers): fused, full remat, scanned"),
    "13_whole_3b_dots": (3, "the same, dots"),
}

REGISTRY: dict[str, Entry] = {
    "qwen_runs": Entry((QWEN,), render_qwen_runs),
    "qwen_runs_figure": Entry((QWEN,), qwen_runs_figure, inline=True),
    "qwen_before_rl": Entry((QWEN,), render_qwen_before_rl),
    "qwen_samplers": Entry((QWEN,), qwen_samplers, inline=True),
    "qwen_instrument": Entry((QWEN,), render_qwen_instrument),
    "qwen_improve": Entry((QWEN,), render_qwen_improve),
    "chaos": Entry(CHAOS, render_chaos),
    "weight_sync": Entry((WEIGHT_SYNC,), render_weight_sync),
    "qwen_plans": Entry(QWEN_PLANS, render_qwen_plans),
    "spooky_learning": Entry(
        (summary_path("learning-spooky"), summary_path("learning-spooky-sft300")), render_spooky_learning
    ),
    "pizza_learning": Entry(tuple(summary_path(p) for p in PIZZA_RUNS), render_pizza_learning),
    "learning_utilisation": Entry(tuple(summary_path(p) for p in LEARNING_RUNS), render_learning_utilisation),
    "spooky_corpus_kinds": Entry((summary_path("learning-spooky-sft300"),), render_spooky_corpus_kinds),
    "spooky_corpus_median": Entry((summary_path("learning-spooky-sft300"),), corpus_median_figure, inline=True),
    "instrument_heldout": Entry(tuple(summary_path(p) for p in HELDOUT_RUNS), render_instrument_heldout),
    "slow_and_better": Entry(tuple(summary_path(p) for p in SPOOKY_RUNS), render_slow_and_better),
    "wall_pizza": Entry((summary_path("learning-pizza"),), wall_figure, inline=True),
    "wall_pizza_quick": Entry((summary_path("learning-pizza-quick"),), wall_figure, inline=True),
    "wall_spooky": Entry((summary_path("learning-spooky"),), wall_figure, inline=True),
    "wall_spooky_sft300": Entry((summary_path("learning-spooky-sft300"),), wall_figure, inline=True),
    "wall_spooky_quick": Entry((summary_path("learning-spooky-quick"),), wall_figure, inline=True),
    "wall_spooky_40": Entry((summary_path("learning-spooky-concurrent-40"),), wall_figure, inline=True),
    "pizza_quick_earlier_change": Entry(
        (summary_path("learning-pizza-quick-2026-11-23"),), reward_change_figure, inline=True
    ),
    "pizza_best_before_rl": Entry((summary_path("learning-pizza"),), best_before_rl_figure, inline=True),
    "spooky_slow_kinds": Entry((summary_path("learning-spooky"),), slow_kinds_figure, inline=True),
    "duration_bias": Entry((f"{RESULTS}/duration_bias.jsonl",), render_duration_bias),
    "benchmarks": Entry(
        (f"{RESULTS}/duration_bias.jsonl", f"{RESULTS}/ppo_epochs.json", f"{RESULTS}/hostile_inputs.json"),
        render_benchmarks,
    ),
    "hostile_inputs": Entry((f"{RESULTS}/hostile_inputs.json",), render_hostile_inputs),
    "smollm2_samples": Entry((SMOL,), render_smollm2_samples),
    "smollm2_instrument": Entry((SMOL,), render_smollm2_instrument),
    "smollm2_rlstep": Entry((SMOL,), render_smollm2_rlstep),
    "smollm2_rlstep_walls": Entry((SMOL,), smollm2_rlstep_walls, inline=True),
    "smollm2_samplers": Entry((SMOL,), smollm2_samplers, inline=True),
    "smollm2_samplers_before": Entry((SMOL,), smollm2_samplers_before, inline=True),
    "smollm2_samplers_history": Entry((SMOL,), render_smollm2_samplers_history),
    "smollm2_profile": Entry((SMOL,), render_smollm2_profile),
    "smollm2_roofline": Entry((SMOL,), render_smollm2_roofline),
    "smollm2_memory": Entry((SMOL,), render_smollm2_memory),
    "compile_counts_cpu": Entry((f"{RESULTS}/compiles-cpu.json",), render_compile_counts),
    "smollm2_memory_figure": Entry((SMOL,), smollm2_memory, inline=True),
    "smollm2_sft_step": Entry((SMOL,), smollm2_sft_step, inline=True),
    "smollm2_resume": Entry((SMOL,), smollm2_resume, inline=True),
    "tpu_plans": Entry(tuple(f"{RESULTS}/tpu_plans_{g}.json" for g in ("v4", "v5e", "v6e", "v5p")), render_plans),
    "tpu_plans_2slices": Entry((f"{RESULTS}/tpu_plans_2slices.json",), render_plans),
    "objective_plans": Entry(OBJECTIVE_PLANS, render_objective_plans),
    "wall_spooky_objectives_quick": Entry(
        (summary_path("learning-spooky-objectives-quick"),), wall_figure, inline=True
    ),
    "test_tiers": Entry((f"{RESULTS}/test_tiers.json",), render_test_tiers),
    "test_tiers_previous_wall": Entry((f"{RESULTS}/test_tiers-2026-11-29-0336.json",), test_tiers_wall, inline=True),
    "objective_arms": Entry((summary_path("learning-spooky-objectives-quick"),), render_objective_arms),
    "objective_arms_full": Entry((summary_path("learning-spooky-objectives"),), render_objective_arms),
    "wall_spooky_objectives": Entry((summary_path("learning-spooky-objectives"),), wall_figure, inline=True),
    "wall_spooky_objectives_quick_ws": Entry(
        (summary_path("learning-spooky-objectives-quick-ws"),), wall_figure, inline=True
    ),
    "objective_step_gpu": Entry((f"{RESULTS}/objective_step_h200.json",), render_objective_step),
    "objective_step_h100": Entry((f"{RESULTS}/objective_step_h100.json",), render_objective_step),
    "objective_step_h200_micro": Entry(
        tuple(
            f"{RESULTS}/objective_step_h200_micro/grpo_{v}.json"
            for v in ("micro1", "micro4", "micro8", "micro8rematfalse")
        ),
        render_micro_sweep,
    ),  # fmt: skip
    "objective_step_h100_profile": Entry(
        tuple(f"{RESULTS}/objective_step_h100_profile/{f}.json" for f in STEP_PROFILE_VARIANTS),
        functools.partial(render_step_profile, STEP_PROFILE_VARIANTS),
    ),
    "objective_step_h200_mfu": Entry(
        tuple(f"{RESULTS}/objective_step_h200_mfu/{f}.json" for f in STEP_MFU_VARIANTS),
        functools.partial(render_mfu_sweep, STEP_MFU_VARIANTS),
    ),
    "warmstart_debug": Entry((WARMSTART_DEBUG,), render_warmstart_debug),
    "mix_evidence": Entry((f"{RESULTS}/multitask-cpu/summary.json",), render_mix_evidence),
    "ablation_table": Entry(tuple(summary_path(p) for p in ABLATION_RUNS), render_ablation_table),
    "ablation_contrasts": Entry(tuple(summary_path(p) for p in ABLATION_RUNS), render_ablation_contrasts),
    "ablation_never_valid": Entry(tuple(summary_path(p) for p in ABLATION_RUNS), never_valid_figure, inline=True),
    "ablation_improve_trained": Entry(
        tuple(summary_path(p) for p in ABLATION_RUNS), improve_trained_figure, inline=True
    ),
    "turns_table": Entry(tuple(summary_path(p) for p in TURNS_RUNS), render_turns_table),
    "qwen_turns_table": Entry(tuple(summary_path(p) for p in QWEN_TURNS_RUNS), render_turns_table),
    "qwen_turns_contrasts": Entry(tuple(summary_path(p) for p in QWEN_TURNS_RUNS), render_turns_contrasts),
    "turns_contrasts": Entry(tuple(summary_path(p) for p in TURNS_RUNS), render_turns_contrasts),
    "wall_ablations_pizza": Entry((summary_path(ABLATION_RUNS[0]),), wall_figure, inline=True),
    "wall_ablations_spooky": Entry((summary_path(ABLATION_RUNS[1]),), wall_figure, inline=True),
    "search_evidence": Entry(EVIDENCE, render_search_evidence),
    "qwen_rl_progress": Entry((QWEN_RL_PROGRESS,), render_learning_progress),
    "qwen_rl_before_after": Entry((QWEN_RL_PARTIAL,), render_rl_before_after),
    "qwen_rl_contrasts": Entry((QWEN_RL_PARTIAL,), render_rl_arm_contrasts),
    "qwen_rl_contrast_figure": Entry((QWEN_RL_PARTIAL,), rl_contrast_figure, inline=True),
    "qwen_rl_progress_figure": Entry((QWEN_RL_PROGRESS,), learning_progress_figure, inline=True),
    "qwen_search_evidence": Entry(QWEN_SEARCH, render_search_evidence),
    "qwen_search_contrasts": Entry(QWEN_SEARCH, render_search_contrasts),
    "search_contrasts": Entry(EVIDENCE, render_search_contrasts),
    "search_operators": Entry(EVIDENCE, render_search_operators),
    "search_lite": Entry(EVIDENCE, render_search_lite),
    "search_ml_agent": Entry(ML_AGENT, render_search_ml_agent),
    "search_wall": Entry(EVIDENCE + ML_AGENT, search_wall_figure, inline=True),
}

# Results files written before their producing command recorded its command and date, which cannot be
# derived from the file itself. Do not add to this list: stamp new files with mle_jax.reporting.provenance.
LEGACY: dict[str, str] = {
    summary_path(p): "learning summary written before the experiment recorded its command (docs/results.md gives it)"
    for p in LEARNING_RUNS
} | {
    SMOL: "bench/smollm2_pizza.py's lines of 2026-11-24, before the bench stamped its command and date",
}  # fmt: skip
