"""The evaluation outlives runs that fail in the executor (found by bench/chaos.py: Ray's memory monitor killed both
executors during the final evaluation, the retry too, and the run ended with an AttributeError on the sample's
missing reward). Such a sample is the executor's failure: counted apart, never scored as the agent's."""

from __future__ import annotations

import pytest
from flax import nnx

from configs import base
from mle_jax.env.evaluation import evaluate
from mle_jax.env.rollout import Environment
from mle_jax.env.settings import EvalSettings
from mle_jax.executor.fleet import SlotFleet
from mle_jax.instrument import instrument_batch
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.run.settings import from_config
from tests.env.test_printed_metric import HONEST
from tests.rl.scripted_sampler import ScriptedSampler
from tests.rl.test_loop import pizza as pizza  # the prepared-data fixture
from tests.rl.tiny import tiny_qwen2

pytestmark = pytest.mark.integration


class LostNode:
    """An executor slot whose every run dies with its node (what the fleet sees of an OOM-killed Ray worker)."""

    def run(self, code, task, limits):
        raise RuntimeError("1 worker(s) were killed due to the node running low on memory")

    def restart(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_samples_whose_runs_failed_in_the_executor_are_counted_apart_in_the_evaluation(tmp_path, pizza):
    cfg = base.apply_cpu(base.task_config("random-acts-of-pizza", "paper"))
    cfg.workdir = str(tmp_path)
    cfg.prompt.max_prompt_tokens, cfg.sampler.max_tokens = 1536, 256
    s = from_config(cfg)
    tok = train_bpe_tokenizer([HONEST] * 4, 400, tmp_path / "tok")
    mcfg = tiny_qwen2(len(tok), num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048)
    sampler = ScriptedSampler(Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(0)), tok, [HONEST])
    fleet = SlotFleet(lambda i: LostNode(), slots=1)
    env = Environment(s.rollout, pizza, tok, ["pandas"], sampler, lambda codes: instrument_batch(codes, "ast"), fleet)
    try:
        out = evaluate(EvalSettings(samples=2, improve=True), env)
    finally:
        fleet.close()
    for kind in ("scratch", "improved"):
        assert out[kind]["infra_failures"] == 2 and out[kind]["samples"] == 0, out[kind]
        assert out[kind]["mean_reward"] is None and len(out[kind]["records"]) == 2
    assert out["best_of_both"]["samples"] == 0  # no pair had a graded run
