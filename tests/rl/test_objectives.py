"""The objective seam on the real learner (tiny random Qwen2 models): the critic-free update against a hand-written
GRPO step, a GRPO learner that builds, updates, saves and restores no critic, the decoupled loss in the update,
the staleness metrics, a fourth objective added by one registry line, and a workdir's checkpoints guarding their
objective at launch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import pizza
from mle_jax.infra.checkpoint import Checkpointer, CheckpointError
from mle_jax.planner.programs import abstract_models
from mle_jax.rl import core, duration, objectives
from mle_jax.rl.advantages import group_advantages
from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.learner import Learner, version_lags
from mle_jax.rl.settings import LearnerSettings
from mle_jax.run import builders, preflight
from mle_jax.run.settings import ConfigError, from_config
from tests.rl.tiny import TINY, learner_config, linear_adam, make_models, mesh, params_digest, random_batch

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
GROUPS = np.array([7, 2, 7, 40, 2, 40, 9, 9])  # four pairs, interleaved, arbitrary ids


def grouped_batch(seed: int) -> RolloutBatch:
    """random_batch's 8 samples in four groups, two of them failures (-10) beside scores."""
    b = random_batch(seed)
    rewards = b.rewards.copy()
    rewards[[0, 3]] = -10.0
    return dataclasses.replace(b, rewards=rewards, group_ids=GROUPS)


def grpo_config(**ppo_fields) -> LearnerSettings:
    return dataclasses.replace(learner_config(**ppo_fields), algorithm="grpo")


def policy_of(seed: int = 0) -> nnx.Module:
    return make_models(seed)[0]


def reference_group_step(cfg: LearnerSettings, policy: nnx.Module, batch: RolloutBatch) -> list[jax.Array]:
    """One epoch on one mini-batch = the whole batch, written out: group advantages on every response token, the
    clipped surrogate times the duration weights, the entropy bonus, kl_coef x KL(π || π_ref) as a loss term."""
    s = cfg.ppo
    ref = nnx.clone(policy)
    tokens, attn = jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)
    mask = jnp.asarray(batch.response_mask, jnp.float32)
    blp = jnp.asarray(batch.behaviour_logprobs)
    ref_lp = core.token_logprobs(ref(tokens, attention_mask=attn), tokens) * mask
    adv = group_advantages(jnp.asarray(batch.rewards), jnp.asarray(batch.group_ids), "grpo")[:, None] * mask
    w = duration.duration_weights(jnp.asarray(batch.durations_s), s.duration_weights, s.duration_max_weight)

    def objective(model):
        logits = model(tokens, attention_mask=attn)
        lp = core.token_logprobs(logits, tokens) * mask
        pg, _ = core.policy_loss(lp, blp, adv, mask, w, s.clip_ratio)
        ent = core.masked_mean(core.shift_right(core.entropy_from_logits(logits)), mask)
        kl = core.masked_mean(core.kl_penalty(lp, ref_lp, s.kl_estimator), mask)
        return pg - s.entropy_coef * ent + s.kl_coef * kl

    params = nnx.state(policy, nnx.Param)
    grads = nnx.grad(objective)(policy)
    tx = cfg.optim.optimizer(cfg.optim.actor_lr)
    updates, _ = tx.update(grads, tx.init(params), params)
    return jax.tree.leaves(jax.tree.map(jnp.add, params, updates))


def test_grpo_update_equals_the_hand_written_group_step():
    cfg = linear_adam(grpo_config(micro_batch_size=2, kl_coef=0.5))  # a KL term large enough to matter
    learner = Learner(cfg, policy_of(0), None, mesh=mesh())
    batch = grouped_batch(1)
    metrics = learner.update(batch)
    want = reference_group_step(cfg, policy_of(0), batch)
    got = jax.tree.leaves(learner.policy_state())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
    init = jax.tree.leaves(nnx.state(policy_of(0), nnx.Param))
    assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(got, init, strict=True)) > 1e-3
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # π = π_ref at first: KL 0, not its gradient
    assert not any(k.startswith("critic/") for k in metrics) and "rollout/returns_mean" not in metrics
    # the same batch with every sample its own group: every advantage 0, only entropy and KL move the policy
    lone = Learner(cfg, policy_of(0), None, mesh=mesh()).update(dataclasses.replace(batch, group_ids=None))
    assert lone["rollout/advantages_mean"] == 0.0 and metrics["rollout/advantages_mean"] != 0.0


def test_a_critic_free_learner_builds_updates_saves_and_restores_no_critic(tmp_path):
    cfg = grpo_config()
    learner = Learner(cfg, policy_of(0), None, mesh=mesh())
    assert learner.state.value is None and learner.state.value_opt is None and learner.value_model() is None
    assert learner.program.value_tree is None and learner.program.value_tx is None
    n_policy = len(jax.tree.leaves(learner.state.policy))
    assert len(jax.tree.leaves(learner.state)) == 1 + n_policy + len(jax.tree.leaves(learner.state.policy_opt))
    learner.update(grouped_batch(2))
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        learner.save(ckpt, 1, loop={"step": 1})
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        saved = ckpt.restore(1)["learner"]  # as written, no targets
        assert set(saved) == {"step", "policy", "policy_opt"}
        fresh = Learner(cfg, policy_of(0), None, mesh=mesh())  # as a resumed run: the same initial policy
        assert params_digest(fresh.state) != params_digest(learner.state)
        assert fresh.restore_latest(ckpt) == {"loop": {"step": 1}}
    assert fresh.step == 1 and params_digest(fresh.state) == params_digest(learner.state)
    batch = grouped_batch(3)
    assert fresh.update(batch) == learner.update(batch) and params_digest(fresh.state) == params_digest(learner.state)
    # a critic's state does not load into it, and the learner refuses a value model it would not train
    ppo_learner = Learner(learner_config(), *make_models(0), mesh=mesh())
    with pytest.raises(ValueError, match="holds a critic"):
        learner.load_state_dict(ppo_learner.state_dict())
    with pytest.raises(ValueError, match="has no critic"):
        Learner(cfg, *make_models(0), mesh=mesh())
    with pytest.raises(ValueError, match="trains a critic"):
        Learner(learner_config(), policy_of(0), None, mesh=mesh())


def test_decoupled_update_without_staleness_is_plain_ppo_and_with_it_differs():
    """Fresh samples (behaviour logprobs = the policy's own): the decoupled update is plain PPO's, its behaviour
    weights 1. Stale ones (the batch's other logprobs): the update differs and the weights leave 1."""
    batch = random_batch(4)
    tokens, attn = jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)
    own = core.token_logprobs(policy_of(0)(tokens, attention_mask=attn), tokens) * batch.response_mask
    fresh = dataclasses.replace(batch, behaviour_logprobs=np.minimum(np.asarray(own), 0.0))
    plain = Learner(linear_adam(learner_config()), *make_models(0), mesh=mesh())
    decoupled = Learner(linear_adam(learner_config(decoupled=True)), *make_models(0), mesh=mesh())
    m_plain, m_dec = plain.update(fresh), decoupled.update(fresh)
    for a, b in zip(jax.tree.leaves(plain.state), jax.tree.leaves(decoupled.state), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert "stale/behaviour_weight_slow" not in m_plain
    for speed in ("slow", "fast"):
        assert m_dec[f"stale/behaviour_weight_{speed}"] == pytest.approx(1.0, abs=1e-5)
    stale_plain = Learner(learner_config(), *make_models(0), mesh=mesh())
    stale_dec = Learner(learner_config(decoupled=True), *make_models(0), mesh=mesh())
    stale_plain.update(batch)
    m = stale_dec.update(batch)
    assert params_digest(stale_plain.state.policy) != params_digest(stale_dec.state.policy)
    # the mean weights, recounted from the policy's own logprobs (the proximal policy's: the update's start)
    weights = np.minimum(np.exp(np.asarray(own) - batch.behaviour_logprobs), 5.0)
    slow = batch.durations_s > batch.durations_s.mean()
    for speed, rows in (("slow", slow), ("fast", ~slow)):
        want = weights[rows][batch.response_mask[rows] > 0].mean()
        assert m[f"stale/behaviour_weight_{speed}"] == pytest.approx(want, rel=1e-4)
    assert np.std(weights[batch.response_mask > 0]) > 0.1  # stale: the weights are not all 1


def test_staleness_metrics_split_slow_and_fast_samples():
    learner = Learner(learner_config(clip_ratio=0.05), *make_models(0), mesh=mesh())
    learner.update(random_batch(5))  # now at step 1
    batch = random_batch(6)
    slow = batch.durations_s > batch.durations_s.mean()
    assert 0 < slow.sum() < len(slow)
    m = learner.update(dataclasses.replace(batch, versions=np.where(slow, 0, 1)))  # slow ones sampled by version 0
    assert m["stale/version_lag_slow"] == 1.0 and m["stale/version_lag_fast"] == 0.0
    # the clipped shares, recounted from the tokens: every token's ratio at the (only) mini-batch step is
    # π_θ1 / π_behaviour, so the clip decides where it leaves [1 - ε, 1 + ε] on the advantage's side
    for speed in ("slow", "fast"):
        assert 0.0 < m[f"stale/clipfrac_{speed}"] <= 1.0
    n = {s: int(np.sum(batch.response_mask[rows])) for s, rows in (("slow", slow), ("fast", ~slow))}
    total = (m["stale/clipfrac_slow"] * n["slow"] + m["stale/clipfrac_fast"] * n["fast"]) / (n["slow"] + n["fast"])
    assert total == pytest.approx(m["actor/clipfrac"])
    # equal durations: no sample is slow
    equal = learner.update(random_batch(7, equal_durations=True))
    assert np.isnan(equal["stale/version_lag_slow"]) and np.isnan(equal["stale/clipfrac_slow"])
    assert equal["stale/version_lag_fast"] == 2.0 and not np.isnan(equal["stale/clipfrac_fast"])
    assert version_lags(3, np.array([0, 3, 1]), np.array([9.0, 1.0, 1.0])) == {
        "stale/version_lag_slow": 3.0,
        "stale/version_lag_fast": 1.0,
    }
    # slow is relative to the sample's own task: 9 s is fast beside task 1's 30 s, 2 s slow beside task 0's 1 s
    lags = version_lags(3, np.array([0, 3, 1, 2]), np.array([9.0, 30.0, 1.0, 2.0]), np.array([1, 1, 0, 0]))
    assert lags == {"stale/version_lag_slow": 0.5, "stale/version_lag_fast": 2.5}  # slow: 30 s, 2 s; fast: 9 s, 1 s


class MeanBaseline(objectives.Objective):
    """A fourth objective for the test: REINFORCE with the batch's mean reward as the baseline."""

    def advantages(self, s, batch, mask, behaviour_lp, ref_lp, values):
        r = batch["rewards"]
        return {"advantages": (r - jnp.mean(r))[:, None] * mask, "kl": core.kl_penalty(behaviour_lp, ref_lp) * mask}


def test_a_fourth_objective_is_one_registry_line(monkeypatch):
    """A class and one OBJECTIVES entry: the config accepts the name, builders and the planner build no critic, the
    learner trains with it (and with the decoupled loss, valid for every objective). An unknown name is one
    ConfigError line naming the choices."""
    monkeypatch.setitem(objectives.OBJECTIVES, "mean_baseline", MeanBaseline())
    cfg = pizza.get_config("cpu")
    cfg.learner.algorithm = "mean_baseline"
    cfg.ppo.decoupled = True
    s = from_config(cfg)
    assert s.learner.algorithm == "mean_baseline" and not s.learner.objective.critic
    assert abstract_models(s, TINY)[1] is None
    learner = builders.make_learner(s, policy_of(0))
    assert learner.state.value is None
    before = params_digest(learner.state.policy)
    m = learner.update(random_batch(8))
    assert params_digest(learner.state.policy) != before and m["stale/behaviour_weight_fast"] > 0
    cfg.learner.algorithm = "ppo2"
    with pytest.raises(ConfigError) as e:
        from_config(cfg)
    assert str(e.value) == (
        "config section learner: learner.algorithm must be one of ('ppo', 'grpo', 'dr_grpo', 'rloo', 'mean_baseline'), "
        "got 'ppo2'"
    )


@pytest.fixture(scope="module")
def ppo_workdir(tmp_path_factory) -> Path:
    """A workdir as a PPO run leaves it: its config.json and a real checkpoint of a learner with a critic."""
    workdir = tmp_path_factory.mktemp("ppo_run")
    cfg = pizza.get_config("cpu")
    cfg.workdir = str(workdir)
    (workdir / "config.json").write_text(cfg.to_json_best_effort(indent=2))
    learner = Learner(learner_config(), *make_models(0), mesh=mesh())
    with Checkpointer(workdir / "checkpoints") as ckpt:
        learner.save(ckpt, 1, loop={"step": 1})
    return workdir


def _settings(workdir: Path, **learner_and_top: object):
    cfg = pizza.get_config("cpu")
    cfg.workdir = str(workdir)
    for key, value in learner_and_top.items():
        if key == "resume":
            cfg.resume = value
        else:
            cfg.learner[key] = value
    cfg.sampler.group_size = 4 if objectives.get(cfg.learner.algorithm).needs_groups else 1
    return from_config(cfg)


def test_resuming_a_workdir_with_another_objective_is_one_preflight_line(ppo_workdir, tmp_path):
    says = (
        f"workdir={ppo_workdir} holds checkpoints of learner.algorithm=ppo, not grpo: pass "
        "--config.learner.algorithm=ppo to resume them, or a new --config.workdir"
    )
    assert says in preflight.problems(_settings(ppo_workdir, algorithm="grpo"))
    assert not any("holds checkpoints" in p for p in preflight.problems(_settings(ppo_workdir)))
    fresh_start = _settings(ppo_workdir, algorithm="grpo", resume=False)
    assert not any("holds checkpoints" in p for p in preflight.problems(fresh_start))
    # what the line prevents: a critic-free learner cannot read the checkpoint (orbax fails on the structure)
    with Checkpointer(ppo_workdir / "checkpoints") as ckpt, pytest.raises(CheckpointError, match="reads back"):
        Learner(grpo_config(), policy_of(0), None, mesh=mesh()).restore_latest(ckpt)
    # a config.json from before the learner section: PPO's checkpoints
    old = tmp_path / "old"
    old.mkdir()
    (old / "checkpoints").symlink_to(ppo_workdir / "checkpoints")
    saved = json.loads((ppo_workdir / "config.json").read_text())
    del saved["learner"]
    (old / "config.json").write_text(json.dumps(saved))
    assert preflight._checkpointed_algorithm(old) == "ppo"
    assert any("of learner.algorithm=ppo, not rloo" in p for p in preflight.problems(_settings(old, algorithm="rloo")))


def test_launch_refuses_another_objective_on_a_checkpointed_workdir_in_one_line(ppo_workdir):
    done = subprocess.run(
        [sys.executable, "-m", "mle_jax.launch", "--config=configs/pizza.py:cpu", f"--config.workdir={ppo_workdir}",
         "--config.learner.algorithm=grpo", "--config.sampler.group_size=4"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    [line] = done.stderr.strip().splitlines()
    assert line == (
        f"error: workdir={ppo_workdir} holds checkpoints of learner.algorithm=ppo, not grpo: pass "
        "--config.learner.algorithm=ppo to resume them, or a new --config.workdir"
    )
    assert json.loads((ppo_workdir / "config.json").read_text()).get("learner", {}).get("algorithm") == "ppo"
