"""What Table 3's 100 PPO epochs per batch would do, measured on a real batch of the embedded run.

    python -m mle_jax.experiments.ppo_epochs --config=configs/pizza.py:cpu --out DIR [--epochs=1,4,100]

The paper's Table 3 lists actor_ppo_epochs 100 (and critic_ppo_epochs 100) beside total_epochs 100; verl's
default is one epoch per batch. From one warm-started policy (the learning experiment's, cached in
DIR/base), one batch of B real samples is drawn, instrumented, run in the sandbox and graded; then one
update with each number of epochs, each from the same initial state, and for each: how far the updated policy
moved from the behaviour policy on the batch's own tokens (mean log-ratio and the share of tokens whose
ratio left the clip range), and the valid fraction of fresh samples from it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from flax import nnx

from mle_jax.env.driver import EpisodeDriver
from mle_jax.env.evaluation import evaluate
from mle_jax.reporting import provenance
from mle_jax.reporting.markdown import markdown_table
from mle_jax.rl import core
from mle_jax.rl.batch import RolloutBatch
from mle_jax.run import builders, environment
from mle_jax.run.cli import config_flag, parse_flags
from mle_jax.run.settings import from_config


def drift(model: nnx.Module, batch: RolloutBatch, temperature: float, clip: float) -> dict[str, float]:
    """How far `model` is from the behaviour policy on the batch's response tokens: mean log π_old - log π
    (the k1 KL estimate) and the share of tokens whose ratio π/π_old is outside [1 - clip, 1 + clip]."""
    tokens = jnp.asarray(batch.tokens)
    logits = model(tokens, attention_mask=jnp.asarray(batch.attention_mask))
    lp = np.asarray(core.token_logprobs(logits, tokens, temperature))
    mask = batch.response_mask > 0
    log_ratio = (lp - batch.behaviour_logprobs)[mask]
    ratio = np.exp(log_ratio)
    return {
        "kl_from_behaviour": float(np.mean(-log_ratio)),
        "outside_clip": float(np.mean((ratio < 1 - clip) | (ratio > 1 + clip))),
    }


def measure(cfg: Any, out: Path, epochs: list[int], fresh_samples: int) -> dict:
    s = from_config(cfg)
    s = dataclasses.replace(s, workdir=str(out / "base"))
    task, packages = environment.prepare(s)
    initial, tokenizer, _ = builders.build_policy(s, task, packages, out / "base")
    local = builders.local_sampler(s.sampler)
    results = {}
    with environment.open_environment(
        s, task, packages, initial, tokenizer, out / "base", sampler=local(initial, tokenizer)
    ) as env:
        rng = np.random.default_rng(s.seed)
        samples = env.sample(env.prompts(s.loop.batch_size, None, rng, improve_fraction=0.0), 0)
        driver = EpisodeDriver(env)
        driver.start(samples)
        driver.run_out()
        batch = RolloutBatch.from_sequences(
            [x.prompt.prompt_ids for x in samples],
            [x.completion.token_ids for x in samples],
            [x.completion.logprobs for x in samples],
            [x.reward.total for x in samples],
            [x.duration_s for x in samples],
            [x.version for x in samples],
            pad_to=s.rollout.max_sequence_tokens,
            pad_id=int(tokenizer.pad_token_id or 0),
        )
        evals = dataclasses.replace(s.eval, samples=fresh_samples, improve=False)
        for n in epochs:
            ppo_settings = dataclasses.replace(s.learner.ppo, epochs=n)
            learner = builders.make_learner(
                dataclasses.replace(s, learner=dataclasses.replace(s.learner, ppo=ppo_settings)), nnx.clone(initial)
            )
            metrics = learner.update(batch)
            model = learner.policy_model()
            env_n = dataclasses.replace(env, sampler=local(model, tokenizer))
            after = evaluate(evals, env_n)["scratch"]
            results[n] = {
                **drift(model, batch, ppo_settings.temperature, ppo_settings.clip_ratio),
                "mean_clipfrac_during_update": metrics["actor/clipfrac"],
                "valid_fraction_after": after["valid_fraction"],
                "mean_reward_after": after["mean_reward"],
            }
        base = evaluate(evals, dataclasses.replace(env, sampler=local(initial, tokenizer)))["scratch"]
    summary = {
        "batch": {"size": len(samples), "valid": int(sum(x.reward.valid for x in samples))},
        "before": {"valid_fraction": base["valid_fraction"], "mean_reward": base["mean_reward"]},
        "epochs": results,
    }
    provenance.write_json(out / "ppo_epochs.json", summary)  # with the command and date
    rows = [["before (no update)", None, None, None, base["valid_fraction"], base["mean_reward"]]]
    rows += [
        [n, r["kl_from_behaviour"], r["outside_clip"], r["mean_clipfrac_during_update"], r["valid_fraction_after"],
         r["mean_reward_after"]]
        for n, r in results.items()
    ]  # fmt: skip
    header = ["epochs", "KL from behaviour", "tokens outside clip", "clipfrac (mean)", "valid after", "reward after"]
    (out / "ppo_epochs.md").write_text(markdown_table(header, rows) + "\n")
    return summary


_FLAGS: dict[str, Any] = {}  # defined when run as a program, so that importing this module defines no flags


def _define_flags() -> dict[str, Any]:
    return {
        "config": config_flag(),
        "out": flags.DEFINE_string("out", None, "output folder"),
        "epochs": flags.DEFINE_list("epochs", ["1", "4", "100"], "PPO epochs to compare"),
        "samples": flags.DEFINE_integer("samples", 32, "fresh samples drawn after each update"),
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if _FLAGS["config"].value is None or not _FLAGS["out"].value:
        raise app.UsageError("--config and --out are required")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    measure(
        _FLAGS["config"].value,
        Path(_FLAGS["out"].value),
        [int(e) for e in _FLAGS["epochs"].value],
        _FLAGS["samples"].value,
    )
    print((Path(_FLAGS["out"].value) / "ppo_epochs.md").read_text())


if __name__ == "__main__":
    _FLAGS.update(_define_flags())
    app.run(main, flags_parser=parse_flags)
