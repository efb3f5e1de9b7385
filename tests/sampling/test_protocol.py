"""The sampler contract's two checks: SamplingSettings (what a caller may ask for) and check_completion (what
a sampler must return)."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from configs import base, pizza
from mle_jax.run.settings import ConfigError, from_config
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.protocol import Completion, Sampler, SamplingSettings, check_completion
from mle_jax.sampling.vllm import VLLMSampler


def test_settings_from_the_run_config_are_generate_kwargs():
    cfg = base.get_config()
    s = from_config(pizza.get_config()).rollout.sampling
    kwargs = s.generate_kwargs()
    assert kwargs == dict(
        temperature=cfg.sampler.temperature, top_p=cfg.sampler.top_p, top_k=cfg.sampler.top_k,
        max_tokens=cfg.sampler.max_tokens,
    )  # fmt: skip
    for generate in (Sampler.generate, JaxSampler.generate, VLLMSampler.generate):
        params = inspect.signature(generate).parameters
        assert set(kwargs) <= set(params)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.temperature = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(temperature=-0.1), r"^sampling temperature must be >= 0 \(0 = greedy\), got -0.1$"),
        (dict(temperature=float("nan")), "temperature must be >= 0"),
        (dict(top_p=0.0), r"^sampling top_p must be in \(0, 1\] \(1 = off\), got 0.0$"),
        (dict(top_p=1.01), r"top_p must be in \(0, 1\]"),
        (dict(top_k=2.5), "top_k must be an integer"),
        (dict(max_tokens=0), r"^sampling max_tokens must be an integer >= 1, got 0$"),
    ],
)
def test_bad_settings_fail_with_one_line(fields, match):
    with pytest.raises(ValueError, match=match):
        SamplingSettings(**fields)
    if "top_k" in fields:
        return  # the config's top_k is an int field: ml_collections refuses 2.5 before we see it
    cfg = pizza.get_config("cpu")
    for k, v in fields.items():
        cfg.sampler[k] = v
    with pytest.raises(ConfigError, match=match.lstrip("^")):  # the same line, from the run config
        from_config(cfg)


def test_edge_settings_are_accepted():
    assert SamplingSettings(temperature=0.0, top_p=1.0, top_k=0, max_tokens=1).generate_kwargs()["temperature"] == 0.0
    assert SamplingSettings(top_p=1e-6, top_k=5).top_k == 5


def completion(**overrides) -> Completion:
    fields = dict(
        prompt_ids=np.array([1, 2, 3], np.int32), token_ids=np.array([4, 5], np.int32),
        logprobs=np.array([-0.1, -2.0], np.float32), text="ab", finish_reason="length", version=0,
    )  # fmt: skip
    return Completion(**{**fields, **overrides})


def test_check_completion_accepts_the_contract():
    c = completion()
    assert check_completion(c) is c
    assert check_completion(completion(token_ids=np.zeros(0, np.int32), logprobs=np.zeros(0, np.float32)))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(token_ids=np.array([4, 5], np.int64)),  # int64 ids (numpy's default)
        dict(logprobs=np.array([-0.1, -2.0], np.float64)),
        dict(prompt_ids=np.array([1, 2, 3], np.int64)),
        dict(logprobs=np.array([-0.1], np.float32)),  # one logprob short
        dict(token_ids=np.array([[4, 5]], np.int32), logprobs=np.array([[-0.1, -2.0]], np.float32)),  # [1, T]
        dict(prompt_ids=np.array([[1, 2, 3]], np.int32)),
    ],
)
def test_check_completion_catches_a_broken_contract(overrides):
    with pytest.raises(AssertionError, match="Chex"):
        check_completion(completion(**overrides))
