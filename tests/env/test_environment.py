"""The one builder of the environment a run's samples pass through (mle_jax/run/environment.py), which the run, the
evaluate CLI, the experiments and the benchmarks all call: the settings' task, fleet, sampler and instrumenter,
a real program run and graded through it, and the fleet closed on exit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from configs import pizza
from mle_jax.env.rollout import PromptItem, Sample
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.run import environment
from mle_jax.run.settings import from_config
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.protocol import Completion
from mle_jax.tasks.prompts import data_mount
from tests.rl.tiny import tiny_qwen2

FAST = f"""import pandas as pd
test = pd.read_json("{data_mount("random-acts-of-pizza")}test.json")
sub = pd.DataFrame({{"request_id": test["request_id"], "requester_received_pizza": 0.25}})
sub.to_csv("submission.csv", index=False)
"""


@pytest.fixture(scope="module")
def parts(tmp_path_factory, raw_data_dir):
    tmp = tmp_path_factory.mktemp("environment")
    cfg = pizza.get_config("cpu")
    cfg.task.raw_dir, cfg.task.data_root = str(raw_data_dir), str(tmp / "tasks")
    cfg.executor.slots = 1
    tok = train_bpe_tokenizer([FAST] * 4, 300, tmp / "tok")
    mcfg = tiny_qwen2(len(tok), num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512)
    return cfg, tok, mcfg, tmp


def _params(model: nnx.Module) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_the_environment_holds_the_runs_boxes_runs_a_program_and_closes_its_fleet(parts):
    cfg, tok, mcfg, tmp = parts
    cfg = cfg.copy_and_resolve_references()
    cfg.instrument.mode = "ast"
    s = from_config(cfg)
    task, packages = environment.prepare(s)
    assert task.id == "random-acts-of-pizza" and (task.public_dir / "test.json").is_file() and "pandas" in packages
    policy = Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(0))
    with environment.open_environment(s, task, packages, policy, tok, tmp / "run") as env:
        assert env.settings == s.rollout and env.task is task and env.packages == packages and env.tokenizer is tok
        assert isinstance(env.sampler, JaxSampler) and env.fleet.n_slots == 1  # sampler.backend jax, executor.slots
        ids = np.asarray([1, 2], np.int32)
        completion = Completion(ids, ids, np.zeros(2, np.float32), f"Plan.\n```python\n{FAST}```", "stop", 0)
        sample = Sample(uid=0, prompt=PromptItem("scratch", [1]), completion=completion, plan="Plan.", code=FAST)
        env.submit([sample])
        env.finish(sample, sample.future.result(timeout=300))
        fleet = env.fleet
    assert sample.instrument_path == "ast" and sample.reward.valid, sample.result
    assert sample.reward.n_prints > 0  # the AST instrumenter's prints, counted through the run's tag
    with pytest.raises(RuntimeError, match="fleet is closed"):
        fleet.submit(FAST, task, s.rollout.limits)


def test_the_frozen_instrumenter_copies_the_initial_policy_and_a_given_sampler_is_used(parts):
    cfg, tok, mcfg, tmp = parts
    s = from_config(cfg)  # instrument.mode "lm": a frozen copy of the initial policy instruments
    task, packages = environment.prepare(s)
    policy, initial = Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(0)), Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(1))
    fresh = JaxSampler(policy, tok)
    with environment.open_environment(
        s, task, packages, policy, tok, tmp / "eval", initial=initial, sampler=fresh
    ) as env:
        frozen = env.instrument_fn.sampler
        assert env.sampler is fresh and isinstance(frozen, JaxSampler)
        got = _params(nnx.merge(frozen.graphdef, frozen.state))
    assert all(np.array_equal(a, b) for a, b in zip(got, _params(initial), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(got, _params(policy), strict=True))
    with environment.open_environment(s, task, packages, policy, tok, tmp / "run") as env:  # default: the policy
        frozen = env.instrument_fn.sampler
        got = _params(nnx.merge(frozen.graphdef, frozen.state))
        assert env.sampler is not fresh and isinstance(env.sampler, JaxSampler)
    assert all(np.array_equal(a, b) for a, b in zip(got, _params(policy), strict=True))
