"""LoRA (mle_jax/models/lora.py) against peft on transformers' torch Qwen2: forward, gradients, one Adam step; and
the learner training adapters over a frozen base whose merged export transformers loads."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import peft
import pytest
import torch
import transformers
from flax import nnx

from mle_jax.infra.optim import OptimSettings
from mle_jax.models import hf, lora
from mle_jax.models.value import Qwen2ValueModel
from mle_jax.rl.learner import Learner, ParamTree
from mle_jax.rl.settings import LearnerSettings, PPOSettings
from tests.models.reference import TINY, torch_logits, torch_qwen2
from tests.rl.tiny import mesh

pytestmark = pytest.mark.model

RANK, ALPHA = 4, 8.0
TARGETS = tuple(lora.TARGETS)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(peft-wrapped torch Qwen2 with random non-zero A and B, our model of the same base weights, our adapters of
    the same A and B, the base's HF folder)."""
    tm = torch_qwen2(seed=7)
    path = tmp_path_factory.mktemp("lora-base")
    tm.save_pretrained(path)
    ours = hf.from_pretrained(path)
    pm = peft.get_peft_model(
        tm, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0, bias="none")
    )
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)  # B non-zero, so the adapters change the output
    return pm, ours, adapters_from_peft(pm), path


def adapters_from_peft(pm) -> dict:
    """peft's lora_A [r, in] and lora_B [out, r] of each target -> our A [*in, r], B [r, *out]."""
    c = TINY
    hq, hkv, dh, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["hidden_size"]
    f = c["intermediate_size"]
    outs = {"q_proj": (hq, dh), "k_proj": (hkv, dh), "v_proj": (hkv, dh), "o_proj": (d,),
            "gate_proj": (f,), "up_proj": (f,), "down_proj": (d,)}  # fmt: skip
    ins = {"o_proj": (hq, dh)}
    layers: dict = {}
    for name, module in pm.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in lora.TARGETS or not hasattr(module, "lora_A"):
            continue
        i = int(name.split(".layers.")[1].split(".")[0])
        a = module.lora_A["default"].weight.detach().numpy().T  # [in, r]
        b = module.lora_B["default"].weight.detach().numpy().T  # [r, out]
        a = a.reshape(*ins.get(leaf, (a.shape[0],)), RANK)
        b = b.reshape(RANK, *outs[leaf])
        group = "attn" if leaf.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
        layers.setdefault(str(i), {}).setdefault(group, {})[leaf] = {"lora_a": jnp.asarray(a), "lora_b": jnp.asarray(b)}
    return {"model": {"layers": layers}}


def _split(model):
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    tree = ParamTree(params)
    return graph, tree, rest, tree.to_nested(params)


def _logits_fn(model, how=lora.merge):
    graph, tree, rest, base = _split(model)

    def logits(adapters, tokens):
        m = nnx.merge(graph, tree.to_state(how(base, adapters, ALPHA / RANK)), rest)
        return m(tokens)

    return logits


TOKENS = np.random.RandomState(0).randint(0, TINY["vocab_size"], (2, 11))
PROBE = np.random.RandomState(1).normal(size=(2, 11, TINY["vocab_size"])).astype(np.float32)


def test_forward_matches_peft(pair):
    pm, ours, adapters, _ = pair
    ref = torch_logits(pm, TOKENS)
    got = np.asarray(jax.jit(_logits_fn(ours))(adapters, jnp.asarray(TOKENS)))
    assert np.abs(got - ref).max() <= 1e-4
    with pm.disable_adapter():  # the adapters matter: the base alone is far from both
        assert np.abs(torch_logits(pm, TOKENS) - ref).max() > 1e-2


def _torch_grads(pm) -> None:
    pm.zero_grad()
    out = pm(torch.from_numpy(TOKENS).long()).logits
    (out * torch.from_numpy(PROBE)).sum().backward()


def test_gradients_and_one_adam_step_match_peft(pair):
    pm, ours, adapters, _ = pair
    logits = _logits_fn(ours)
    loss = jax.jit(lambda ad: jnp.sum(logits(ad, jnp.asarray(TOKENS)) * PROBE))
    grads = jax.grad(loss)(adapters)
    _torch_grads(pm)
    ref_grads = adapters_from_peft_grads(pm)
    flat_got, flat_ref = jax.tree.leaves(grads), jax.tree.leaves(ref_grads)
    assert len(flat_got) == len(flat_ref) == 2 * len(TARGETS) * TINY["num_hidden_layers"]
    for g, r in zip(flat_got, flat_ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=2e-4)
    # one Adam step in each framework from the same gradients' own computation
    lr = 1e-2
    opt = torch.optim.Adam([p for n, p in pm.named_parameters() if "lora_" in n], lr=lr, eps=1e-8)
    opt.step()
    tx = optax.adam(lr, eps=1e-8)
    upd, _ = tx.update(grads, tx.init(adapters), adapters)
    stepped = optax.apply_updates(adapters, upd)
    for g, r in zip(jax.tree.leaves(stepped), jax.tree.leaves(adapters_from_peft(pm)), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scan", [False, True])
def test_adapters_applied_unmerged_equal_the_merged_weights(pair, scan):
    """What the update trains (`lora.adapted`: x W + s (x A) B in each matmul, the layers scanned or not) computes
    the merged model's logits and gradients (`lora.merge`, checked against peft above)."""
    _, _, adapters, path = pair
    ours = hf.from_pretrained(path, scan_layers=scan, remat=scan)
    tokens = jnp.asarray(TOKENS)
    merged, unmerged = _logits_fn(ours, lora.merge), _logits_fn(ours, lora.adapted)
    np.testing.assert_allclose(jax.jit(unmerged)(adapters, tokens), jax.jit(merged)(adapters, tokens), atol=2e-5)
    g_m = jax.grad(lambda ad: jnp.sum(merged(ad, tokens) * PROBE))(adapters)
    g_u = jax.grad(lambda ad: jnp.sum(unmerged(ad, tokens) * PROBE))(adapters)
    for a, b in zip(jax.tree.leaves(g_u), jax.tree.leaves(g_m), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)


def adapters_from_peft_grads(pm) -> dict:
    """The gradients of peft's lora_A/lora_B in our layout (adapters_from_peft of a model holding the grads)."""
    with torch.no_grad():
        saved = {n: p.detach().clone() for n, p in pm.named_parameters() if "lora_" in n}
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(p.grad)
        grads = adapters_from_peft(pm)
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(saved[n])
    return grads


def test_adapters_start_at_the_base_and_settings_say_what_is_wrong():
    base = {"model": {"layers": {"0": {"attn": {"q_proj": jnp.ones((8, 2, 4)), "o_proj": jnp.ones((2, 4, 8))}}}}}
    s = lora.LoraSettings(rank=2, alpha=4.0, targets=("q_proj", "o_proj"))
    ad = lora.init_adapters(base, s, jax.random.key(0))
    q, o = ad["model"]["layers"]["0"]["attn"]["q_proj"], ad["model"]["layers"]["0"]["attn"]["o_proj"]
    assert q["lora_a"].shape == (8, 2) and q["lora_b"].shape == (2, 2, 4)
    assert o["lora_a"].shape == (2, 4, 2) and o["lora_b"].shape == (2, 8)
    assert float(jnp.abs(q["lora_a"]).max()) > 0 and float(jnp.abs(q["lora_b"]).max()) == 0
    merged = lora.merge(base, ad, s.scale)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), merged, base))
    for bad, words in (
        (dict(rank=-1), "rank"), (dict(rank=4, targets=("qproj",)), "unknown"), (dict(rank=4, targets=()), "empty"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=words):
            lora.LoraSettings(**bad)
    with pytest.raises(ValueError, match="no such weight"):
        lora.init_adapters({"x": jnp.ones((2, 2))}, s, jax.random.key(0))


def _batch(b: int, t: int, vocab: int, seed: int = 0):
    from mle_jax.rl.batch import RolloutBatch

    rng = np.random.RandomState(seed)
    tokens = rng.randint(1, vocab, (b, t)).astype(np.int32)
    resp = np.zeros((b, t), np.int32)
    resp[:, t // 2 :] = 1
    return RolloutBatch(
        tokens=tokens, attention_mask=np.ones((b, t), np.int32), response_mask=resp,
        behaviour_logprobs=np.full((b, t), -3.0, np.float32) * resp, rewards=rng.normal(size=b).astype(np.float32),
        durations_s=rng.uniform(1, 5, b).astype(np.float32), versions=np.zeros(b, np.int32),
        group_ids=np.arange(b, dtype=np.int32), task_ids=np.zeros(b, np.int32),
    )  # fmt: skip


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_learner_trains_adapters_over_a_frozen_base_and_exports_the_merge(pair, tmp_path, algorithm):
    """LoRA for an objective with a critic (PPO) and one without (GRPO): the state holds only adapters (+ the
    critic's head), the reference is the base and stays bitwise, the policy moves; the merged export loads in
    transformers and gives our merged logits."""
    _, ours, _, _ = pair
    settings = LearnerSettings(
        algorithm=algorithm, ppo=PPOSettings(mini_batch_size=4, micro_batch_size=2, seq_bucket=0),
        optim=OptimSettings(actor_lr=1e-2, critic_lr=1e-2), lora=lora.LoraSettings(rank=RANK, alpha=ALPHA), seed=0,
    )  # fmt: skip
    value = Qwen2ValueModel.from_policy(ours, rngs=nnx.Rngs(1)) if algorithm == "ppo" else None
    learner = Learner(settings, ours, value, mesh())
    base = jax.tree.map(np.asarray, learner.reference)
    n_trained = lora.count(learner.state.policy)
    n_model = ours.config.num_parameters()
    assert 0 < n_trained < n_model / 5
    if algorithm == "ppo":
        assert set(learner.state.value) == {"model", "value_head", "value_bias"}
    else:
        assert learner.state.value is None
    before = np.asarray(_logits_fn_state(learner))
    np.testing.assert_allclose(before, np.asarray(ours(jnp.asarray(TOKENS))), atol=1e-5)  # B = 0: the base
    batch = _batch(4, 12, TINY["vocab_size"])
    if algorithm == "grpo":  # two groups of two with different rewards
        batch = dataclasses.replace(batch, group_ids=np.array([0, 0, 2, 2], np.int32))
    metrics = learner.update(batch)
    assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    after = np.asarray(_logits_fn_state(learner))
    assert np.abs(after - before).max() > 1e-4  # the policy moved
    assert jax.tree.all(jax.tree.map(np.array_equal, base, jax.tree.map(np.asarray, learner.reference)))
    # the merged export: transformers loads it and computes our logits
    export = tmp_path / "hf_export"
    hf.save_pretrained(learner.policy_model(), export)
    tm = transformers.Qwen2ForCausalLM.from_pretrained(export).eval()
    assert np.abs(torch_logits(tm, TOKENS) - after).max() <= 1e-4
    # a checkpoint holds adapters only; restoring gives the same policy
    state = learner.state_dict()
    assert lora.count(state["policy"]) == n_trained


def _logits_fn_state(learner):
    return learner.policy_model()(jnp.asarray(TOKENS))
