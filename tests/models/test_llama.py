"""Llama-family checkpoints in our decoder, against transformers' torch LlamaForCausalLM (as test_qwen2 does
for Qwen2): biases as the config says, rope θ, RMSNorm ε, tied or untied embeddings; saved as Llama."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2Config
from tests.models.reference import TINY, jax_logits, torch_llama, torch_logits

pytestmark = pytest.mark.model

CASES = {
    # SmolLM2's layout: no biases, tied embeddings, 3:1 grouped queries
    "nobias-tied-gqa2": dict(tie_word_embeddings=True, num_key_value_heads=2, rope_theta=100000.0, rms_norm_eps=1e-5),
    "attnbias-untied-gqa1": dict(tie_word_embeddings=False, num_key_value_heads=4, attention_bias=True),
    "allbias-untied-gqa4": dict(tie_word_embeddings=False, num_key_value_heads=1, attention_bias=True, mlp_bias=True),
}
TOKENS = np.random.RandomState(0).randint(0, TINY["vocab_size"], (3, 13))


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(torch Llama, our model loaded from its save_pretrained folder, the folder)."""
    tm = torch_llama(seed=len(request.param), **CASES[request.param])
    path = tmp_path_factory.mktemp(request.param)
    tm.save_pretrained(path)
    return tm, hf.from_pretrained(path), path


def test_config_fields_reach_our_model(pair):
    tm, ours, _ = pair
    c, t = ours.config, tm.config
    assert c.model_type == "llama"
    assert (c.attention_bias, c.attention_out_bias, c.mlp_bias) == (t.attention_bias, t.attention_bias, t.mlp_bias)
    assert (c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings) == (
        t.rope_parameters["rope_theta"],
        t.rms_norm_eps,
        t.tie_word_embeddings,
    )
    attn = ours.model.layers[0].attn
    assert hasattr(attn, "q_bias") == hasattr(attn, "o_bias") == t.attention_bias
    assert hasattr(ours.model.layers[0].mlp, "down_bias") == t.mlp_bias


def test_logits_match_transformers(pair):
    tm, ours, _ = pair
    ref = torch_logits(tm, TOKENS)
    got = jax_logits(ours, TOKENS)
    assert got.shape == ref.shape == (3, 13, TINY["vocab_size"])
    assert np.abs(got - ref).max() <= 1e-4


def test_right_padded_rows_and_cached_decoding_match(pair):
    tm, ours, _ = pair
    mask = np.ones((2, 10), np.int32)
    mask[1, 6:] = 0
    got = jax_logits(ours, TOKENS[:2, :10], mask)
    assert np.abs(got[1, :6] - torch_logits(tm, TOKENS[1:2, :6])[0]).max() <= 1e-4
    step = nnx.jit(lambda m, t, mk, c: m(t, attention_mask=mk, cache=c))
    cache = ours.init_cache(1, 16)
    logits, cache = step(ours, jnp.asarray(TOKENS[:1, :8], jnp.int32), jnp.ones((1, 8), jnp.int32), cache)
    ref = torch_logits(tm, TOKENS[:1, :11])
    assert np.abs(np.asarray(logits)[0] - ref[0, :8]).max() <= 1e-4
    for i in range(8, 11):
        logits, cache = step(ours, jnp.asarray(TOKENS[:1, i : i + 1], jnp.int32), jnp.ones((1, 1), jnp.int32), cache)
        assert np.abs(np.asarray(logits)[0, 0] - ref[0, i]).max() <= 1e-4


def test_save_pretrained_writes_a_llama_folder(pair, tmp_path):
    tm, ours, src = pair
    hf.save_pretrained(ours, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["attention_bias"], cfg["mlp_bias"]) == (tm.config.attention_bias, tm.config.mlp_bias)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(back).__name__ == "LlamaForCausalLM"
    assert np.abs(torch_logits(back, TOKENS) - torch_logits(tm, TOKENS)).max() <= 1e-5
    assert hf.read_config(tmp_path) == hf.read_config(src)


def test_rope_scaling_and_other_families_fail_clearly():
    base = Qwen2Config(**{**TINY, "model_type": "llama", "attention_bias": False}).to_hf_dict()
    for rope_type in ("llama3", "linear", "dynamic", "yarn"):
        bad = {**base, "rope_parameters": {"rope_type": rope_type, "rope_theta": 1e4, "factor": 8.0}}
        with pytest.raises(ValueError, match=rf"cfg\.json: rope_type='{rope_type}' \(rope scaling\) is not supported"):
            Qwen2Config.from_hf_dict(bad, source="cfg.json")
    with pytest.raises(ValueError, match=r"model_type='mistral'.*not a Qwen2 or Llama config"):
        Qwen2Config.from_hf_dict({**base, "model_type": "mistral"})
    with pytest.raises(ValueError, match="q/k/v/o or on none"):
        Qwen2Config(**{**TINY, "model_type": "llama", "attention_bias": True, "attention_out_bias": False})
    with pytest.raises(ValueError, match="use model_type='llama'"):
        Qwen2Config(**{**TINY, "attention_bias": False})
    assert Qwen2Config.from_hf_dict(base) == Qwen2Config(**{**TINY, "model_type": "llama", "attention_bias": False})
