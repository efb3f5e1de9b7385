"""JaxSampler against transformers' generate and against a full forward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from mle_jax.models import hf
from mle_jax.models.decoding import sample_token
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.run.settings import SamplerSettings
from mle_jax.sampling import jax_sampler
from mle_jax.sampling.jax_sampler import Grid, JaxSampler, compiled_programs, grid_tokens, plan_grids
from mle_jax.sampling.protocol import Sampler
from tests.models.reference import TINY, jax_logits, numpy_random_model, torch_qwen2

pytestmark = pytest.mark.model
BUCKETS = dict(min_batch_bucket=8, min_new_bucket=32)  # few shapes: few compiles
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40, 41, 42, 43]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tm = torch_qwen2(seed=7, num_key_value_heads=2, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("sampler")
    tm.save_pretrained(path)
    return tm, hf.from_pretrained(path)


@pytest.fixture(scope="module")
def sampler(models):
    return JaxSampler(models[1], eos_ids=[], **BUCKETS)


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


def test_chunked_batches_give_the_same_greedy_output(models, sampler):
    whole = sampler.generate(PROMPTS, temperature=0.0, max_tokens=10)
    chunked = JaxSampler(models[1], eos_ids=[], max_batch=2, **BUCKETS).generate(
        PROMPTS, temperature=0.0, max_tokens=10
    )
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_phases_grow_the_suffix_and_warm_up_compiles_them_all(models, sampler):
    """A decode whose suffix grows (4, 8, 12, 16, then 32 slots per row) gives transformers' greedy tokens, and the
    tokens and logprobs that one phase of 32 slots draws with the same key; after `warm_up`, generate compiles
    nothing."""
    tm, ours = models
    assert jax_sampler.phase_sizes(32, 4) == [4, 8, 12, 16, 32]
    assert jax_sampler.phase_sizes(2048) == [256, 512, 768, 1024, 2048]
    assert jax_sampler.phase_sizes(1024, None) == [1024]  # one phase: the frozen instrumenter's (fewest programs)
    assert JaxSampler.from_settings(None, ours, None, None, frozen=True).suffix_phase is None
    phased = JaxSampler(ours, eos_ids=[], suffix_phase=4, **BUCKETS)
    assert phased.warm_up(PROMPTS, n=2, max_tokens=30) >= 5 + 4  # the phases and the growths between them
    before = compiled_programs()
    greedy = phased.generate(PROMPTS, n=2, temperature=0.0, max_tokens=30)
    drawn = phased.generate(PROMPTS, n=2, temperature=1.0, max_tokens=30, seed=3)
    assert compiled_programs() == before
    for i, prompt in enumerate(PROMPTS):
        ref = tm.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=30, min_new_tokens=30)
        for c in greedy[2 * i : 2 * i + 2]:
            np.testing.assert_array_equal(c.token_ids, ref[0, len(prompt) :].numpy())
    for a, b in zip(drawn, sampler.generate(PROMPTS, n=2, temperature=1.0, max_tokens=30, seed=3), strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="at least one slot"):
        JaxSampler(ours, suffix_phase=0)


def test_the_cpu_kernels_decode_as_xla_does_and_the_setting_turns_them_off(models):
    """sampler.jax_cpu_kernels (on by default; `make kernels` built the library): the decode on the kernels gives
    the greedy tokens and logprobs of XLA's ops."""
    _, ours = models
    on = JaxSampler.from_settings(SamplerSettings(backend="jax"), ours, None, None)
    off = JaxSampler.from_settings(SamplerSettings(backend="jax", jax_cpu_kernels=False), ours, None, None)
    assert on.cpu_kernels and not off.cpu_kernels
    a = on.generate(PROMPTS, n=2, temperature=0.0, max_tokens=24)
    b = off.generate(PROMPTS, n=2, temperature=0.0, max_tokens=24)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)


def test_rows_that_stop_early_decode_on_the_kernels_as_on_xla(models, sampler):
    """The kernels skip the rows that have stopped (cpu_decode.live_rows): with a stop token that ends some rows
    after a few steps and not others, every row's tokens and logprobs equal XLA's decode of all rows."""
    _, ours = models
    probe = sampler.generate(PROMPTS, temperature=0.0, max_tokens=24)  # no stop token: every row runs to the end
    stop = int(probe[0].token_ids[3])  # row 0 stops at its 4th token; a row that never draws it runs to the end
    on = JaxSampler(ours, eos_ids=[stop], **BUCKETS)
    off = JaxSampler(ours, eos_ids=[stop], cpu_kernels=False, **BUCKETS)
    assert on.cpu_kernels
    a = on.generate(PROMPTS, n=2, temperature=0.0, max_tokens=24)
    b = off.generate(PROMPTS, n=2, temperature=0.0, max_tokens=24)
    assert {c.finish_reason for c in b} == {"stop", "length"}, "the stop token should end some rows, not all"
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
        assert x.finish_reason == y.finish_reason


def test_grids_share_a_prompt_between_its_samples():
    a, b, c = [1, 2], [3], [4, 5, 6]
    # the same count for every prompt: U x n, no padding (n samples of each prompt; distinct prompts: n = 1)
    prompts, grids = plan_grids([a, a, b, b], None)
    assert prompts == [a, b] and grids == [Grid((0, 1), 2, (0, 1, 2, 3))]
    assert plan_grids([a, b, c], None)[1] == [Grid((0, 1, 2), 1, (0, 1, 2))]
    # uneven counts: one row per prompt occurrence
    assert plan_grids([a, a, a, b], None)[1] == [Grid((0, 0, 0, 1), 1, (0, 1, 2, 3))]
    # chunks of max_batch rows in order: a prompt split across two chunks is one distinct prompt
    prompts, grids = plan_grids([a, a, a, b], 2)
    assert prompts == [a, b] and grids == [Grid((0,), 2, (0, 1)), Grid((0, 1), 1, (2, 3))]
    # a budget of KV positions: each distinct prompt at the chunk's longest, max_tokens (here 10) per row
    assert grid_tokens([2, 2], 3, 10) == 2 * 3 + 4 * 10 and grid_tokens([3, 1], 3, 10) == 4 * 3 + 4 * 10
    long = [7] * 30
    _, grids = plan_grids([a, b, long, c], None, max_grid_tokens=2 * 3 + 2 * 10, new_tokens=10)
    assert grids == [Grid((0, 1), 1, (0, 1)), Grid((2,), 1, (2,)), Grid((3,), 1, (3,))]  # a row alone goes over
    _, grids = plan_grids([a, a, b, b], None, max_grid_tokens=2 * 2 + 4 * 10, new_tokens=10)
    assert grids == [Grid((0, 1), 2, (0, 1, 2, 3))]  # n samples of a prompt share its prefill: it fits
    padded = plan_grids([a, b, c], None, max_grid_tokens=2 * 16 + 2 * 10, new_tokens=10, prompt_len=lambda n: 16)
    assert padded[1] == [Grid((0, 1), 1, (0, 1)), Grid((2,), 1, (2,))]  # at their padded length


def test_repeated_prompts_decode_as_each_alone(models, sampler, monkeypatch):
    """Rows sharing a prompt (one prefill, its keys read once per step for all of them) give each prompt's greedy
    tokens and logprobs alone, in the grid of n samples per prompt and in the row-per-occurrence grid of uneven
    counts; each distinct prompt is prefilled once per call, or not at all when the last calls kept it."""
    alone = [sampler.generate([p], temperature=0.0, max_tokens=12)[0] for p in PROMPTS[:2]]
    prefills = []
    real = jax_sampler._prefill
    monkeypatch.setattr(
        jax_sampler, "_prefill", lambda gd, st, tokens, mask: prefills.append(1) or real(gd, st, tokens, mask)
    )
    s = JaxSampler(models[1], eos_ids=[], prefix_cache=0, **BUCKETS)
    uneven = s.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[0]], temperature=0.0, max_tokens=12)
    samples = s.generate(PROMPTS[:2], n=3, temperature=0.0, max_tokens=12)
    assert len(prefills) == 4  # two distinct prompts per call
    for out, want in ((uneven, [0, 1, 0, 0]), (samples, [0, 0, 0, 1, 1, 1])):
        for c, i in zip(out, want, strict=True):
            np.testing.assert_array_equal(c.token_ids, alone[i].token_ids)
            np.testing.assert_allclose(c.logprobs, alone[i].logprobs, atol=1e-5)
    kept = JaxSampler(models[1], eos_ids=[], prefix_cache=2, **BUCKETS)
    for _ in range(2):
        kept.generate(PROMPTS[:2], n=2, temperature=0.0, max_tokens=4)
    assert len(prefills) == 6  # the second call found both prompts kept
    kept.sync(nnx.state(models[1], nnx.Param), version=1)
    kept.generate(PROMPTS[:2], n=2, temperature=0.0, max_tokens=4)
    assert len(prefills) == 8 and len(kept._prefills) == 2  # new weights: prefilled again; at most 2 kept
    bounded = JaxSampler(
        models[1], eos_ids=[], prefix_cache=0, max_grid_tokens=40, **BUCKETS
    )  # a grid per row: the same tokens
    for c, i in zip(bounded.generate(PROMPTS[:2], n=2, temperature=0.0, max_tokens=12), [0, 0, 1, 1], strict=True):
        np.testing.assert_array_equal(c.token_ids, alone[i].token_ids)
        np.testing.assert_allclose(c.logprobs, alone[i].logprobs, atol=1e-5)


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


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, -1), (0.7, 1.0, -1), (1.0, 0.8, -1), (1.3, 1.0, 4)]
)
def test_draws_follow_the_truncated_softmax(temperature, top_p, top_k):
    """20k draws from one row: frequencies match softmax(logits / T) restricted as vLLM does (top-k, then
    the smallest top-p set), to within 5 standard errors per token; excluded tokens never appear."""
    logits = jnp.asarray([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -np.inf, 3.0, 2.5], jnp.float32)
    n = 20_000
    keys = jax.random.split(jax.random.key(3), n)
    toks = jax.jit(jax.vmap(lambda k: sample_token(logits[None], k, temperature, top_p, top_k)[0][0]))(keys)
    p = np.asarray(jax.nn.softmax(logits / temperature), np.float64)
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, bool)
    mass = 0.0
    for rank, i in enumerate(order):
        if (top_k > 0 and rank >= top_k) or (rank > 0 and mass >= top_p):
            break
        keep[i] = True
        mass += p[i]
    want = np.where(keep, p, 0.0) / p[keep].sum()
    got = np.bincount(np.asarray(toks), minlength=len(p)) / n
    assert got[~keep].sum() == 0.0
    se = np.sqrt(want * (1 - want) / n)
    assert np.all(np.abs(got - want) <= 5 * se + 1e-12), (got, want)


def test_greedy_is_the_first_argmax_and_logprob_is_log_softmax():
    logits = jnp.asarray([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 5.0], [-2.0, -1.0, -3.0, -1.5]], jnp.float32)
    tok, lp = sample_token(logits, jax.random.key(0), 0.0, 1.0, -1)
    np.testing.assert_array_equal(np.asarray(tok), np.argmax(np.asarray(logits), axis=-1))
    want = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(tok)[:, None], 1)[:, 0]
    np.testing.assert_allclose(np.asarray(lp), want, rtol=1e-6)


def test_stops_on_stop_ids(models):
    _, ours = models
    free = JaxSampler(ours, eos_ids=[], **BUCKETS).generate([PROMPTS[0]], temperature=0.0, max_tokens=20)[0]
    stop = int(free.token_ids[4])
    first = int(np.argmax(free.token_ids == stop))
    c = JaxSampler(ours, eos_ids=[stop], **BUCKETS).generate([PROMPTS[0], PROMPTS[1]], temperature=0.0, max_tokens=20)
    np.testing.assert_array_equal(c[0].token_ids, free.token_ids[: first + 1])
    assert c[0].finish_reason == "stop" and c[0].token_ids[-1] == stop
    assert len(c[0].logprobs) == len(c[0].token_ids)


def test_sync_swaps_weights_and_version(tmp_path):
    a, b = torch_qwen2(seed=11), torch_qwen2(seed=12)
    a.save_pretrained(tmp_path / "a")
    b.save_pretrained(tmp_path / "b")
    ma, mb = hf.from_pretrained(tmp_path / "a"), hf.from_pretrained(tmp_path / "b")
    ref = JaxSampler(mb, eos_ids=[], **BUCKETS).generate([PROMPTS[0]], temperature=0.0, max_tokens=16)[0]
    s = JaxSampler(ma, eos_ids=[], **BUCKETS)
    before = s.generate([PROMPTS[0]], temperature=0.0, max_tokens=16)[0]
    compiled = compiled_programs()
    s.sync(nnx.state(mb, nnx.Param), version=5)
    mb.model.embed_tokens[...] = mb.model.embed_tokens[...] * 0  # the sampler holds its own copy
    s.generate([PROMPTS[0]], temperature=0.7, top_p=0.9, max_tokens=16, seed=0)
    after = s.generate([PROMPTS[0]], temperature=0.0, max_tokens=16)[0]
    assert compiled_programs() == compiled  # new weights and sampling settings: no recompile
    np.testing.assert_array_equal(after.token_ids, ref.token_ids)
    assert not np.array_equal(before.token_ids, after.token_ids)
    assert after.version == 5 and s.version == 5


def test_bad_prompts_are_rejected(sampler):
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate([[]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.generate([[1, 10_000]])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(temperature=-0.5), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
        (dict(n=0), "n must be >= 1"),
    ],
)
def test_bad_sampling_settings_are_rejected(sampler, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sampler.generate(PROMPTS, **kwargs)


def test_tokenizer_gives_stop_ids_pad_and_text(tmp_path):
    tok = train_bpe_tokenizer(["print('loaded data')\n", "training loss: 0.5\n"] * 20, 300, tmp_path / "tok")
    cfg = Qwen2Config(**{**TINY, "vocab_size": len(tok)})
    s = JaxSampler(numpy_random_model(Qwen2ForCausalLM, cfg, seed=1), tokenizer=tok, **BUCKETS)
    assert set(s.stop_ids) == set(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    assert s.pad_id == tok.pad_token_id
    messages = [{"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    for c in s.generate([prompt], n=2, temperature=1.0, max_tokens=24, seed=0):
        assert c.text == tok.decode(c.token_ids.tolist(), skip_special_tokens=True)
        stop_at = np.flatnonzero(np.isin(c.token_ids, s.stop_ids))
        assert (c.finish_reason == "stop") == (len(stop_at) > 0)
        if len(stop_at):
            assert stop_at[0] == len(c.token_ids) - 1


def test_every_in_process_sampler_takes_the_runs_sampler_settings(models):
    """One way to build a sampler: outside sampling/ nothing in mle_jax/ or bench/ calls JaxSampler's constructor:
    the loop's comes from run/builders.make_sampler, a held model's (the warm start, the experiments, the benches)
    from `JaxSampler.for_run` with the run's sampler settings (run/builders.local_sampler binds them), so
    sampler.jax_cpu_kernels=false reaches every one of them."""
    from pathlib import Path

    import mle_jax
    from mle_jax.run.builders import local_sampler

    repo = Path(mle_jax.__file__).parents[1]
    builds = sorted(
        str(p.relative_to(repo))
        for p in [*(repo / "mle_jax").rglob("*.py"), *(repo / "bench").glob("*.py")]
        if "JaxSampler(" in p.read_text() and p.parent.name != "sampling"
    )
    assert builds == []
    _, ours = models
    off = local_sampler(SamplerSettings(backend="jax", jax_cpu_kernels=False, jax_max_grid_tokens=4096))(ours, None)
    on = local_sampler(SamplerSettings(backend="vllm"))(ours, None)  # in process whatever serves the loop
    assert not off.cpu_kernels and on.cpu_kernels
    assert off.max_grid_tokens == 4096 and on.max_grid_tokens is None  # the grid budget too (0: none)
    loop = JaxSampler.from_settings(SamplerSettings(backend="jax", jax_max_grid_tokens=512), ours, None, None)
    frozen = JaxSampler.from_settings(
        SamplerSettings(backend="jax", jax_max_grid_tokens=512), ours, None, None, None, True
    )
    assert loop.max_grid_tokens == frozen.max_grid_tokens == 512
