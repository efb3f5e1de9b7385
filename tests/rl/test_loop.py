"""The asynchronous loop on real parts: bwrap sandboxes running programs on the prepared pizza data,
the real grader, learner, checkpoints and a tiny Qwen2; only the policy's text comes from a script,
so that run times are known (see scripted_sampler.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flax import nnx

from configs import base
from mle_jax.builders import make_learner
from mle_jax.checkpoint import Checkpointer
from mle_jax.executor.fleet import make_fleet
from mle_jax.instrument import instrument_batch
from mle_jax.models.hf import hf_host_tensors
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.report import MetricsWriter
from mle_jax.rl.loop import AsyncRLLoop
from mle_jax.rl.rollout import Environment
from mle_jax.sampling.vllm_worker import is_orbax_item, iter_weights
from mle_jax.settings import from_config
from mle_jax.tasks.prepare import prepare
from mle_jax.tasks.prompts import data_mount
from tests.rl.scripted_sampler import ScriptedSampler

pytestmark = pytest.mark.integration


def _program(sleep_s: float, p: float) -> str:
    return f"""I will predict a constant probability for every request, after loading the test data.

```python
import time
import pandas as pd
test = pd.read_json("{data_mount("random-acts-of-pizza")}test.json")
time.sleep({sleep_s})
sub = pd.DataFrame({{"request_id": test["request_id"], "requester_received_pizza": {p}}})
sub.to_csv("submission.csv", index=False)
```"""


SLOW = _program(0.0, 0.3).replace(
    "time.sleep(0.0)",  # runs until the test puts RELEASE into the (read-only) data folder: an event, not a clock
    f'while not __import__("os").path.exists("{data_mount("random-acts-of-pizza")}RELEASE"): time.sleep(0.05)',
)
FAST = _program(0.0, 0.25)
NO_CODE = "I would train a model but I will not write any code."


@pytest.fixture(scope="module")
def pizza(tmp_path_factory, raw_data_dir):
    return prepare(
        "random-acts-of-pizza", raw_data_dir / "random-acts-of-pizza", tmp_path_factory.mktemp("pizza") / "prepared"
    )


def _loop(tmp_path, task, script, sections=None, **loop_overrides):
    cfg = base.apply_cpu(base.task_config("random-acts-of-pizza", "paper"))
    cfg.workdir = str(tmp_path)
    cfg.loop.batch_size, cfg.loop.in_flight_multiplier, cfg.loop.max_version_lag = 2, 3, 1
    cfg.ppo.mini_batch_size, cfg.ppo.micro_batch_size = 2, 2
    cfg.prompt.max_prompt_tokens, cfg.sampler.max_tokens = 1536, 256
    cfg.prompt.improve_fraction = 1.0
    cfg.executor.timeout_s = 600.0  # a guard only: SLOW runs until released, the others end in seconds
    for k, v in loop_overrides.items():
        cfg.loop[k] = v
    for section, fields in (sections or {}).items():
        for k, v in fields.items():
            cfg[section][k] = v
    tok = train_bpe_tokenizer([SLOW, FAST, NO_CODE] * 4, 400, tmp_path / "tok")
    mcfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
    )
    policy = Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(0))
    s = from_config(cfg)
    learner = make_learner(s, policy)
    sampler = ScriptedSampler(policy, tok, script)
    fleet = make_fleet(s.executor)
    env = Environment(
        s.rollout, task, tok, ["pandas", "numpy"], sampler, lambda codes: instrument_batch(codes, "ast"), fleet
    )
    loop = AsyncRLLoop(
        s.loop, env, learner, Checkpointer(tmp_path / "ckpt", keep=2), MetricsWriter(tmp_path, tensorboard=False)
    )
    return loop, sampler, fleet


def test_a_slow_run_trains_with_its_duration_weight_however_late_and_only_queued_runs_are_resampled(tmp_path, pizza):
    """One slow program among fast ones, 2 slots, B=2, 16 in flight, max_version_lag=1. The slow run ends many
    versions after it was sampled (it runs until three updates have been made): it still trains, with its
    duration weight. Runs that were still *queued* when their sample fell more than one version behind are
    taken back and their prompts sampled again."""
    assert SLOW != FAST
    release = pizza.public_dir / "RELEASE"
    # m = 8 (16 in flight, 15 of them fast runs of version 0 queued behind one slot): when the policy reaches
    # version 2, some are still queued however long the updates take on a loaded machine (with m = 4, the last
    # three once all started during a slow update, and nothing was left to re-sample)
    loop, sampler, fleet = _loop(tmp_path, pizza, [SLOW] + [FAST] * 80, in_flight_multiplier=8)
    found = None
    try:
        for _ in range(40):
            m = loop.step()
            if loop.counters.version >= 3:
                release.touch()
            slow = [s for s in loop.last_used if s.code and "RELEASE" in s.code]
            if slow:
                found = (m, slow[0], loop.counters.version - 1)
                break
    finally:
        release.unlink(missing_ok=True)
        loop.close()
        fleet.close()
    assert found is not None, "the slow run never reached a batch"
    m, slow, trained_at = found
    assert slow.reward.valid, slow.result
    assert trained_at - slow.version >= 2  # older than max_version_lag=1, and trained on: it was running
    # Δt of three updates (each waiting for two fast runs in the other slot) against one fast run: weight > 1.5
    assert slow.reward.valid and m["learner/duration/weight_max"] > 1.5
    # the staleness metrics the loop writes for that step: the slow run is its batch's slow sample (Δt above the mean)
    assert m["learner/stale/version_lag_slow"] == trained_at - slow.version
    assert 0.0 <= m["learner/stale/clipfrac_slow"] <= 1.0
    assert loop.counters.resampled_stale >= 1 and m["resampled_stale"] == loop.counters.resampled_stale
    assert sampler.version == loop.counters.step  # synced after every update


def test_improve_prompts_show_earlier_solutions_and_no_code_is_total_failure(tmp_path, pizza):
    loop, sampler, fleet = _loop(tmp_path, pizza, [FAST, FAST, NO_CODE])
    used, history = [], []
    try:
        for _ in range(5):
            history.append(loop.step())
            used += loop.last_used
    finally:
        loop.close()
        fleet.close()
    no_code = [s for s in used if s.code is None]
    ran = [s for s in used if s.code is not None]
    assert no_code and all(s.reward.total == -10.0 and s.result is None for s in no_code)  # never executed
    assert ran and all(s.reward.valid and s.reward.total == pytest.approx(0.5) for s in ran)
    assert len(loop.buffer) >= 1  # valid programs, with their output
    improve = [s for s in used if s.prompt.kind == "improve"]
    assert improve, "with improve_fraction=1 and a non-empty buffer, prompts ask to improve"
    assert any(m["improve_fraction"] > 0 for m in history)
    text = sampler.tokenizer.decode(improve[0].prompt.prompt_ids)
    assert "requester_received_pizza" in text and "loaded data" in text  # the code and its progress output
    assert "@@mle" not in text  # the per-run tag of the instrumenter's prints never reaches the policy


def test_orbax_sync_hands_the_sampler_the_committed_checkpoint_of_the_step(tmp_path, pizza):
    """sync_source "orbax": after each update the loop saves the step, waits for it to be written, and gives the
    sampler that checkpoint's learner item, whose policy (read as the vLLM worker reads it) is the trained one."""
    loop, sampler, fleet = _loop(tmp_path, pizza, [FAST] * 40)
    loop.settings = dataclasses.replace(loop.settings, sync_source="orbax")
    seen = []
    scripted_sync = sampler.sync

    def sync(params, version):
        seen.append((params, is_orbax_item(params), version))
        scripted_sync(loop.learner.policy_state(), version)  # the scripted sampler samples from our model

    sampler.sync = sync
    try:
        for _ in range(2):
            loop.step()
        expected = hf_host_tensors(loop.learner.policy_state())
        item, committed, version = seen[-1]
        got = {name: tensor.numpy() for name, tensor in iter_weights(item)}
    finally:
        loop.close()
        fleet.close()
    assert [(v, c) for _, c, v in seen] == [(1, True), (2, True)]
    assert [p for p, _, _ in seen] == [loop.checkpointer.item_dir(s, "learner") for s in (1, 2)]
    assert sorted(got) == sorted(expected)
    for name, x in expected.items():
        np.testing.assert_array_equal(got[name], x, err_msg=name)


def test_a_critic_free_objective_with_the_decoupled_loss_trains_on_the_real_loop(tmp_path, pizza):
    """learner.algorithm=grpo with ppo.decoupled: the loop's learner has no critic, each step's metrics carry the KL
    loss and the slow/fast staleness metrics (behaviour weights included), and its checkpoints hold no critic."""
    sections = {"learner": {"algorithm": "grpo"}, "ppo": {"decoupled": True}}
    loop, _, fleet = _loop(tmp_path, pizza, [FAST, NO_CODE] * 20, sections=sections)
    try:
        history = [loop.step() for _ in range(2)]
    finally:
        loop.close()
        fleet.close()
    assert loop.learner.state.value is None and loop.learner.value_model() is None
    m = history[-1]
    assert not any(k.startswith("learner/critic/") for k in m) and "learner/actor/kl_loss" in m
    stale = {
        f"learner/stale/{q}_{s}" for q in ("version_lag", "clipfrac", "behaviour_weight") for s in ("slow", "fast")
    }
    assert stale <= set(m)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert set(ckpt.restore()["learner"]) == {"step", "policy", "policy_opt"}
