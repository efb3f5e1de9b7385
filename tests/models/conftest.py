"""The fixtures of the real-model tests (SmolLM2, Qwen2.5-Coder): a test module defines `folder` (the converted HF
folder), `chat` (the messages of its prompt) and `greedy_len`; these build on them."""

from __future__ import annotations

import pytest
import torch
import transformers

from mle_jax.models import hf
from mle_jax.models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(folder):
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def prompt(tokenizer, chat) -> list[int]:
    return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"])


@pytest.fixture(scope="module")
def ours(folder):
    return hf.from_pretrained(folder)


@pytest.fixture(scope="module")
def theirs(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def greedy(theirs, prompt, greedy_len) -> list[int]:
    """transformers' greedy `greedy_len` tokens on the chat prompt: the reference of our sampler and of vLLM."""
    with torch.no_grad():
        out = theirs.generate(torch.tensor([prompt]), max_new_tokens=greedy_len, do_sample=False)
    return out[0, len(prompt) :].tolist()
