"""The planner's update program on a LoRA config: it counts the model's parameters, and the adapters it trains."""

from __future__ import annotations

import math

import jax
import pytest
from flax import nnx

from configs import pizza
from mle_jax.infra import sharding
from mle_jax.planner.programs import abstract_models, compile_update, model_config
from mle_jax.run.settings import from_config

pytestmark = pytest.mark.model


def test_a_lora_update_counts_the_models_parameters_and_the_adapters_it_trains():
    cfg = pizza.get_config("cpu")
    cfg.model.lora.rank = 4
    s = from_config(cfg)
    arch = model_config(s)
    info = compile_update(s, arch, sharding.make_mesh(s.mesh), batch=2, seq_len=64, donate=False, compile=False)
    policy, _ = abstract_models(s, arch)
    full = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    assert info["policy_params"] == full
    assert 0 < info["trained_params"] < full / 10  # rank-4 adapters on the projections
    cfg.model.lora.rank = 0  # every weight trained
    s = from_config(cfg)
    info = compile_update(s, arch, sharding.make_mesh(s.mesh), batch=2, seq_len=64, donate=False, compile=False)
    assert info["trained_params"] == info["policy_params"] == full
