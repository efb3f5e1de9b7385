"""Warm-start SFT: batch layout, response-only loss, loss goes down, resume continues the same stream."""

from __future__ import annotations

import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import base
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.tasks.prompts import render_prompt
from mle_jax.warmstart.programs import generate_corpus
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.settings import SFTSettings
from mle_jax.warmstart.sft import (
    batch_stream,
    copy_pretrain,
    make_train_step,
    pack_examples,
    response_loss,
    run_sft,
    tokenize_examples,
    train_task_tokenizer,
)
from tests.rl.tiny import tiny_qwen2

MESSAGES = [
    {"role": "system", "content": "You are given a machine learning task."},
    {"role": "user", "content": "Predict requester_received_pizza. Write a plan, then python."},
]


def test_pack_examples_layout():
    d = pack_examples([[5, 6], [7]], [[1, 2, 3], [4]], pad_id=0, multiple=4)
    p = int(d["prompt_len"])
    assert p == 2 and d["tokens"].shape == (2, 6) and d["loss_mask"].shape == (2, 4)
    np.testing.assert_array_equal(d["tokens"], [[5, 6, 1, 2, 3, 0], [0, 7, 4, 0, 0, 0]])
    np.testing.assert_array_equal(d["attention_mask"], [[1, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(d["loss_mask"], [[1, 1, 1, 0], [1, 0, 0, 0]])
    # the targets slice is exactly the responses
    np.testing.assert_array_equal(d["tokens"][0, p : p + 3], [1, 2, 3])
    with pytest.raises(ValueError, match="empty response"):
        pack_examples([[1]], [[]], pad_id=0)


def test_response_loss_matches_numpy_and_ignores_masked_positions():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    targets = rng.integers(0, 5, size=(2, 3)).astype(np.int32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    want = (nll * mask).sum() / mask.sum()
    got = float(response_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask)))
    assert got == pytest.approx(want, rel=1e-5)
    logits2 = logits.copy()
    logits2[0, 2] += 100.0  # a masked position: no effect
    masked = response_loss(jnp.asarray(logits2), jnp.asarray(targets), jnp.asarray(mask))
    assert float(masked) == pytest.approx(got)


def test_batch_stream_is_seeded_and_reshuffles_each_epoch():
    threads = threading.active_count()
    a = [b.tolist() for _, b in zip(range(6), iter(batch_stream(6, 3, seed=1)), strict=False)]
    assert threading.active_count() == threads  # read in this thread: no prefetching threads left computing
    b = [b.tolist() for _, b in zip(range(6), iter(batch_stream(6, 3, seed=1)), strict=False)]
    c = [b.tolist() for _, b in zip(range(6), iter(batch_stream(6, 3, seed=2)), strict=False)]
    assert a == b and a != c
    assert sorted(a[0] + a[1]) == list(range(6))  # an epoch is a permutation
    assert a[:2] != a[2:4]  # the next epoch is another permutation


@pytest.fixture(scope="module")
def sft_setup(tmp_path_factory):
    items = generate_corpus(PIZZA, 8, seed=0)
    responses = [it.response() for it in items]
    tok = train_task_tokenizer(responses, [MESSAGES], 1024, tmp_path_factory.mktemp("tok"))
    m = base.tiny_model()
    m.vocab_size, m.hidden_size, m.intermediate_size, m.num_hidden_layers = len(tok), 64, 128, 1
    m.num_attention_heads, m.num_key_value_heads, m.head_dim = 2, 1, 32
    config = Qwen2Config.from_model_config(m)
    # short responses (the plans) keep these tests fast; the full programs are checked in the tokenizer test
    examples = [(MESSAGES, it.plan) for it in items]
    return tok, config, examples, responses


def _cfg(**kw):
    c = dict(
        steps=24,
        lr=1e-2,
        batch_size=4,
        warmup_steps=3,
        max_response_tokens=640,
        max_prompt_tokens=256,
        seed=0,
        log_every=1,
        checkpoint_every=100,
    )
    c.update(kw)
    return SFTSettings(**c)


@pytest.mark.model
def test_task_tokenizer_speaks_chatml_and_round_trips(sft_setup):
    tok, _, _, full = sft_setup
    ids = render_prompt(MESSAGES, tok, 256)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert tok.decode(tok.encode(full[0], add_special_tokens=False)) == full[0]
    prompts, responses, dropped = tokenize_examples([(MESSAGES, r) for r in full], tok, 256, 640)
    assert dropped == 0 and all(r[-1] == tok.convert_tokens_to_ids("<|im_end|>") for r in responses)
    assert max(len(r) for r in responses) < 520  # the programs stay short in the task tokenizer


@pytest.mark.model
def test_task_tokenizer_reloads_from_a_policy_folder_unchanged(sft_setup, tmp_path):
    """A saved policy has a qwen2 config.json beside the tokenizer; loading must not swap in Qwen's
    word-splitting pre-tokenizer (merges here cross words: the SFT and RL must see the same ids)."""
    from mle_jax.models.hf import save_pretrained
    from mle_jax.models.tokenizer import load_tokenizer

    tok, config, _, full = sft_setup
    save_pretrained(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)), tmp_path)
    tok.save_pretrained(str(tmp_path))
    again = load_tokenizer(tmp_path)
    for text in (full[0], "train.json", 'pd.read_json("/workdir/x/train.json")'):
        assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert render_prompt(MESSAGES, again, 256) == render_prompt(MESSAGES, tok, 256)
    assert again.eos_token == "<|im_end|>" and again.pad_token == "<|endoftext|>"


@pytest.fixture(scope="module")
def straight_run(sft_setup, tmp_path_factory):
    """One uninterrupted SFT run, shared by the loss test and the resume test (its reference)."""
    tok, config, examples, _ = sft_setup
    model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
    before = jax.tree.map(np.array, nnx.state(model, nnx.Param))
    workdir = tmp_path_factory.mktemp("straight")
    metrics = run_sft(model, tok, examples, _cfg(), workdir, progress=False)
    return model, before, workdir, metrics


def _losses(workdir):
    return [json.loads(x)["loss"] for x in (workdir / "sft_metrics.jsonl").read_text().splitlines()]


@pytest.mark.model
def test_sft_reduces_response_loss(straight_run):
    model, before, workdir, metrics = straight_run
    curve = _losses(workdir)
    assert len(curve) == 24 and metrics["steps"] == 24
    assert curve[0] > 5.0  # about log(vocab) at init
    assert np.mean(curve[-4:]) < 0.6 * curve[0], curve
    after = nnx.state(model, nnx.Param)  # the model passed in is the one trained
    pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    assert any(not np.allclose(a, b) for a, b in pairs)


@pytest.mark.model
def test_sft_resume_continues_the_same_stream(sft_setup, straight_run, tmp_path):
    tok, config, examples, _ = sft_setup
    straight, _, straight_dir, _ = straight_run
    cfg = _cfg(checkpoint_every=12)
    first = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
    m1 = run_sft(first, tok, examples, cfg, tmp_path, progress=False, stop_at=12)
    assert m1["steps"] == 12 and m1["resumed_from"] is None
    # the checkpoint holds the stream position (12 batches drawn), restored below
    assert _iter_state(tmp_path / "sft_ckpt", 12) == {"next_index": 12}
    resumed = Qwen2ForCausalLM(config, rngs=nnx.Rngs(1))  # other weights: all state comes from the checkpoint
    m2 = run_sft(resumed, tok, examples, cfg, tmp_path, progress=False)
    assert m2["resumed_from"] == 12 and m2["steps"] == 24
    np.testing.assert_allclose(_losses(tmp_path), _losses(straight_dir), rtol=1e-4)
    leaves = [jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (straight, resumed)]
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def _iter_state(ckpt_dir, step):
    with Checkpointer(ckpt_dir) as ckpt:
        return ckpt.restore(step)["data_iter"]


@pytest.mark.model
def test_copy_pretraining_teaches_a_fresh_model_to_repeat_unseen_sequences():
    """Random sequences can only be predicted by copying: the loss falls from chance (log V) to near zero, and
    the model then repeats a sequence it never saw, greedily, token for token."""
    config = tiny_qwen2(64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16)
    model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
    losses = copy_pretrain(model, 64, steps=300, length=16, batch_size=16, seed=0)
    assert losses[0] > 3.5 and losses[-1] < 0.1, losses
    seq = np.random.default_rng(123).integers(3, 64, size=16)
    tokens = np.zeros(33, np.int32)  # one shape for every step: one compile
    tokens[:17] = list(seq) + [2]
    forward = nnx.jit(lambda m, t: m(t[None])[0])
    for t in range(17, 33):
        tokens[t] = int(jnp.argmax(forward(model, jnp.asarray(tokens))[t - 1]))  # causal: the padding is unseen
    assert list(tokens[17:]) == list(seq)


def test_micro_batches_give_the_whole_batch_step():
    """Accumulating over micro-batches of 1 and 2 rows gives the whole batch's loss and update: the token mean is
    taken over the whole batch's response tokens, whatever the rows' lengths. A bad micro-batch size is refused."""
    config = tiny_qwen2(64, num_hidden_layers=2, max_position_embeddings=64)
    graphdef, params, rest = nnx.split(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
    rng = np.random.default_rng(0)
    loss_mask = np.ones((4, 12), np.float32)
    for row, length in enumerate((12, 3, 7, 1)):  # responses of different lengths: per-row means would differ
        loss_mask[row, length:] = 0
    batch = {
        "tokens": jnp.asarray(rng.integers(3, 64, size=(4, 20)), jnp.int32),
        "attention_mask": jnp.ones((4, 20), jnp.int32),
        "loss_mask": jnp.asarray(loss_mask),
    }
    tx = optax.sgd(1.0)
    results = {}
    for m in (0, 1, 2):
        new, _, loss = make_train_step(graphdef, rest, tx, 8, micro_batch_size=m)(params, tx.init(params), batch)
        results[m] = (float(loss), new)
    whole_loss, whole = results[0]
    pairs = zip(jax.tree.leaves(whole), jax.tree.leaves(params), strict=True)
    moved = max(float(jnp.abs(a - b).max()) for a, b in pairs)
    assert moved > 1e-3  # the step changed the weights, so equal results below are not trivially equal
    for m in (1, 2):
        loss, new = results[m]
        assert loss == pytest.approx(whole_loss, rel=1e-5)
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(whole), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="micro_batch_size=3 must divide batch_size=4"):
        SFTSettings(batch_size=4, micro_batch_size=3)
