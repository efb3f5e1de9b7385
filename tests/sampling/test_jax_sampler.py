"""JaxSampler against transformers' generate and against a full forward pass."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from mle_jax.models import hf
from mle_jax.sampling.jax_sampler import JaxSampler, sample_token
from mle_jax.sampling.protocol import Sampler
from tests.models.reference import jax_logits, torch_qwen2

pytestmark = pytest.mark.model
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40, 41, 42, 43]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tm = torch_qwen2(seed=7, num_key_value_heads=2, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("sampler")
    tm.save_pretrained(path)
    return tm, hf.from_pretrained(path)


@pytest.fixture(scope="module")
def sampler(models):
    return JaxSampler(models[1], eos_ids=[])


def reference_logprobs(model, prompt, completion, temperature):
    full = np.array([list(prompt) + completion.token_ids.tolist()])
    logits = jax_logits(model, full)[0, len(prompt) - 1 : -1]
    scale = temperature if temperature > 0 else 1.0
    logp = np.asarray(jax.nn.log_softmax(logits / scale, axis=-1))
    return np.take_along_axis(logp, completion.token_ids[:, None], axis=1)[:, 0]


def test_greedy_matches_transformers_generate(models, sampler):
    tm, ours = models
    out = sampler.generate(PROMPTS, temperature=0.0, max_tokens=32)
    assert isinstance(sampler, Sampler) and len(out) == len(PROMPTS)
    for prompt, c in zip(PROMPTS, out, strict=True):
        ref = tm.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32, min_new_tokens=32)
        np.testing.assert_array_equal(c.token_ids, ref[0, len(prompt) :].numpy())
        assert c.finish_reason == "length" and c.version == 0
        np.testing.assert_array_equal(c.prompt_ids, prompt)
        assert np.abs(c.logprobs - reference_logprobs(ours, prompt, c, 0.0)).max() <= 1e-4


def test_sampled_logprobs_equal_full_forward_and_groups_by_prompt(models, sampler):
    _, ours = models
    out = sampler.generate(PROMPTS[:2], n=3, temperature=0.7, top_p=0.95, max_tokens=12, seed=3)
    assert len(out) == 6
    for i, c in enumerate(out):
        prompt = PROMPTS[i // 3]
        np.testing.assert_array_equal(c.prompt_ids, prompt)
        assert len(c.token_ids) == 12 and c.logprobs.dtype == np.float32
        assert np.abs(c.logprobs - reference_logprobs(ours, prompt, c, 0.7)).max() <= 1e-4
    # Same seed -> same samples; rows of one prompt differ (they draw independently).
    again = sampler.generate(PROMPTS[:2], n=3, temperature=0.7, top_p=0.95, max_tokens=12, seed=3)
    assert all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(out, again, strict=True))
    assert len({tuple(c.token_ids) for c in out[:3]}) > 1


def test_top_k_1_and_tiny_top_p_are_greedy(sampler):
    greedy = sampler.generate(PROMPTS, temperature=0.0, max_tokens=10)
    k1 = sampler.generate(PROMPTS, temperature=1.5, top_k=1, max_tokens=10, seed=1)
    p0 = sampler.generate(PROMPTS, temperature=1.5, top_p=1e-6, max_tokens=10, seed=2)
    for g, a, b in zip(greedy, k1, p0, strict=True):
        np.testing.assert_array_equal(g.token_ids, a.token_ids)
        np.testing.assert_array_equal(g.token_ids, b.token_ids)


def test_top_k_restricts_the_draw():
    logits = jax.random.normal(jax.random.key(0), (256, 50))
    keys = jax.random.split(jax.random.key(1), 256)
    toks = jax.vmap(lambda lg, k: sample_token(lg[None], k, 1.0, 1.0, 3)[0][0])(logits, keys)
    top3 = np.argsort(-np.asarray(logits), axis=1)[:, :3]
    assert all(t in row for t, row in zip(np.asarray(toks), top3, strict=True))


def test_stops_on_stop_ids(models):
    _, ours = models
    free = JaxSampler(ours, eos_ids=[]).generate([PROMPTS[0]], temperature=0.0, max_tokens=20)[0]
    stop = int(free.token_ids[4])
    first = int(np.argmax(free.token_ids == stop))
    c = JaxSampler(ours, eos_ids=[stop]).generate([PROMPTS[0], PROMPTS[1]], temperature=0.0, max_tokens=20)
    np.testing.assert_array_equal(c[0].token_ids, free.token_ids[: first + 1])
    assert c[0].finish_reason == "stop" and c[0].token_ids[-1] == stop
    assert len(c[0].logprobs) == len(c[0].token_ids)


def test_sync_swaps_weights_and_version(tmp_path):
    a, b = torch_qwen2(seed=11), torch_qwen2(seed=12)
    a.save_pretrained(tmp_path / "a")
    b.save_pretrained(tmp_path / "b")
    ma, mb = hf.from_pretrained(tmp_path / "a"), hf.from_pretrained(tmp_path / "b")
    s = JaxSampler(ma, eos_ids=[])
    before = s.generate([PROMPTS[0]], temperature=0.0, max_tokens=16)[0]
    s.sync(nnx.state(mb), version=5)
    after = s.generate([PROMPTS[0]], temperature=0.0, max_tokens=16)[0]
    ref = JaxSampler(mb, eos_ids=[]).generate([PROMPTS[0]], temperature=0.0, max_tokens=16)[0]
    np.testing.assert_array_equal(after.token_ids, ref.token_ids)
    assert not np.array_equal(before.token_ids, after.token_ids)
    assert after.version == 5 and s.version == 5


def test_bad_prompts_are_rejected(sampler):
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate([[]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.generate([[1, 10_000]])
