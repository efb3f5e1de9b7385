"""Episodes of several turns (env/episodes.py): learner rows, masks, token-in/token-out, and an agent that fixes its
program at turn 2 because the error was in what it was shown, through the real bwrap sandbox and grader."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mle_jax.env.episodes import Episode, episode_rows
from mle_jax.env.observation import Observation, observation_ids, user_turn_text
from mle_jax.env.rollout import PromptItem, Sample
from mle_jax.env.settings import AgentSettings
from mle_jax.reporting.report import submitted_rows
from mle_jax.rl import core
from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.objectives import OBJECTIVES
from mle_jax.rl.settings import PPOSettings
from mle_jax.rl.step_metrics import StepStats
from mle_jax.sampling.protocol import Completion
from mle_jax.tasks.prompts import data_mount
from mle_jax.tasks.reward import Reward
from tests.rl.test_loop import _loop
from tests.rl.test_loop import pizza as pizza  # the prepared-data fixture

OK_SUBMISSION = Observation("ok", 0, "done", True, "submission.csv has the right format")
FAILED = Observation("error", 1, "Traceback ...\nKeyError: 'x'", False, "no submission.csv was written")


def _sample(uid, prompt, ids, reward, valid, duration, version=0, group=-1, episode=-1, turn=1, obs=None, task="t"):
    lps = [-0.5 - 0.1 * i for i in range(len(ids))]
    c = Completion(np.asarray(prompt, np.int32), np.asarray(ids, np.int32), np.asarray(lps, np.float32), "", "stop",
                   version)  # fmt: skip
    s = Sample(uid, PromptItem("scratch", list(prompt)), c, "plan", "code", group=group, task=task, episode=episode,
               turn=turn)  # fmt: skip
    s.reward = Reward(reward, valid, reward if valid else None, (), 0)
    s.observation = obs or (OK_SUBMISSION if valid else FAILED)
    s.result = type("R", (), {"duration_s": duration})()
    return s


def _three_turns(group=0, version=0):
    """An episode: turn 1 fails, turn 2 valid (score -0.5), turn 3 fails again; observations appended after 1 and 2."""
    t1 = _sample(10, [1, 2, 3], [4, 5], -9.6, False, 2.0, version, group=group, episode=10)
    t1.observation_ids = [90, 91, 92]
    t2 = _sample(11, [1, 2, 3, 4, 5, 90, 91, 92], [6, 7, 8], -0.5, True, 5.0, version + 1, group=group, episode=10,
                 turn=2)  # fmt: skip
    t2.observation_ids = [93, 94]
    t3 = _sample(12, [1, 2, 3, 4, 5, 90, 91, 92, 6, 7, 8, 93, 94], [9], -10.0, False, 1.0, version + 1, group=group,
                 episode=10, turn=3)  # fmt: skip
    return Episode([t1, t2, t3], ended=True)


@pytest.mark.unit
def test_one_turn_episodes_give_todays_batch_and_metrics():
    """agent.turns = 1: the rows of one-turn episodes pack into exactly the batch the loop built from its samples
    before episodes existed (RolloutBatch.from_sequences), field by field, and the step's metrics are the samples'."""
    samples = [
        _sample(0, [1, 2, 3], [4, 5], -9.7, False, 3.0, version=2, group=0, task="random-acts-of-pizza"),
        _sample(1, [1, 2, 3], [6], 0.7, True, 12.0, version=1, group=0, task="random-acts-of-pizza"),
        _sample(2, [7], [8, 9, 10], -0.3, True, 0.5, version=2, group=2, task="spooky-author-identification"),
    ]
    before = RolloutBatch.from_sequences(
        prompt_ids=[s.prompt.prompt_ids for s in samples],
        response_ids=[s.completion.token_ids for s in samples],
        logprobs=[s.completion.logprobs for s in samples],
        rewards=[s.reward.total for s in samples],
        durations_s=[s.duration_s for s in samples],
        versions=[s.version for s in samples],
        pad_to=16,
        group_ids=[s.group for s in samples],
        task_ids=RolloutBatch.task_indices([s.task for s in samples]),
    )
    for context in ("conversation", "state"):
        for credit in ("episode", "turn"):
            agent = AgentSettings(turns=1, context=context, credit=credit)
            episodes = [Episode([s], ended=True) for s in samples]
            rows = [r for e in episodes for r in episode_rows(e, agent)]
            after = RolloutBatch.from_rows(rows, pad_to=16)
            for name, value in before.as_dict().items():
                np.testing.assert_array_equal(getattr(after, name), value, err_msg=f"{context}/{credit}: {name}")
            assert [e.submitted() for e in episodes] == samples
    # the metrics: StepStats of what each one-turn episode submits are the samples' own
    sub = StepStats(
        [Episode([s], ended=True).submitted() for s in samples],
        ("random-acts-of-pizza", "spooky-author-identification"),
        None,
    ).metrics()
    assert sub == StepStats(samples, ("random-acts-of-pizza", "spooky-author-identification"), None).metrics()


@pytest.mark.unit
def test_conversation_row_masks_the_observations_and_gives_every_turn_the_submitted_reward():
    ep = _three_turns()
    assert ep.submitted().turn == 2  # the last turn whose submission passed the format check
    assert ep.best_private(lower_is_better=False).turn == 2
    [row] = episode_rows(ep, AgentSettings(turns=3, context="conversation", credit="episode"))
    b = RolloutBatch.from_rows([row], pad_to=20)
    np.testing.assert_array_equal(b.tokens[0, :16], [1, 2, 3, 4, 5, 90, 91, 92, 6, 7, 8, 93, 94, 9, 0, 0])
    np.testing.assert_array_equal(b.response_mask[0, :16], [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0])
    assert b.rewards[0] == pytest.approx(-0.5) and b.durations_s[0] == pytest.approx(8.0)  # Δt: sum of turns
    assert b.versions[0] == 0  # the oldest turn's version
    np.testing.assert_allclose(b.behaviour_logprobs[0, 8:11], [-0.5, -0.6, -0.7], rtol=1e-6)
    # "turn" credit: one row per turn, its own reward and Δt, grouped by turn
    rows = episode_rows(ep, AgentSettings(turns=3, context="conversation", credit="turn"))
    b = RolloutBatch.from_rows(rows, pad_to=20)
    np.testing.assert_allclose(b.rewards, [-9.6, -0.5, -10.0])
    np.testing.assert_allclose(b.durations_s, [2.0, 5.0, 1.0])
    assert len(set(b.group_ids.tolist())) == 3 and b.response_mask.sum(1).tolist() == [2, 3, 1]
    # "state" context with "episode" credit: a row per turn, each with the episode's reward and Δt; an episode that
    # ended after one turn fills its other rows with inert ones (no policy token, their own task)
    short = Episode([_sample(20, [1], [2], -10.0, False, 1.0, group=5, episode=20)], ended=True)
    rows = episode_rows(ep, AgentSettings(turns=3, context="state")) + episode_rows(
        short, AgentSettings(turns=3, context="state")
    )
    b = RolloutBatch.from_rows(rows, pad_to=20)
    np.testing.assert_allclose(b.rewards[:4], [-0.5, -0.5, -0.5, -10.0])
    assert b.response_mask[4:].sum() == 0 and len(set(b.task_ids[4:].tolist()) & set(b.task_ids[:4].tolist())) == 0


@pytest.mark.unit
@pytest.mark.parametrize("algorithm", sorted(OBJECTIVES))
@pytest.mark.parametrize("decoupled", [False, True])
def test_observation_tokens_take_no_part_in_any_loss(algorithm, decoupled):
    """The update's gradient reaches the weights through each position's logprob, entropy and (PPO) value. For every
    objective, the loss's partial derivatives with respect to those at an observation position are exactly 0, and
    changing anything the learner holds at those positions (reference logprobs, values) changes neither the
    advantages of the policy tokens nor the loss: observation tokens are context only."""
    [row] = episode_rows(_three_turns(), AgentSettings(turns=3))
    b = RolloutBatch.from_rows([row, row], pad_to=16)
    b.rewards[1] = -3.0  # a group of two with a spread, for the group objectives
    b.group_ids[:] = 0
    mask = jnp.asarray(b.response_mask, jnp.float32)
    obs = (b.attention_mask == 1) & (b.response_mask == 0)
    obs[:, :3] = False  # the prompt
    assert obs.sum() == 2 * 5
    s = PPOSettings(decoupled=decoupled)
    objective = OBJECTIVES[algorithm]
    batch = {k: jnp.asarray(v) for k, v in b.as_dict().items()}
    rng = np.random.default_rng(0)
    ref = jnp.asarray(rng.normal(-1.0, 0.3, b.tokens.shape), jnp.float32) * mask
    values = jnp.asarray(rng.normal(0, 1, b.tokens.shape), jnp.float32)

    def advantages(ref_lp, v):
        return objective.advantages(s, batch, mask, batch["behaviour_logprobs"] * mask, ref_lp, v if objective.critic
                                    else None)  # fmt: skip

    base = advantages(ref, values)
    noisy = jnp.where(jnp.asarray(obs), 5.0, 0.0)
    other = advantages(ref + jnp.where(jnp.asarray(obs), -2.0, 0.0), values + noisy)
    np.testing.assert_allclose(base["advantages"], other["advantages"], rtol=1e-6, atol=1e-6)
    mb = {
        "mask": mask,
        "old_logprobs": batch["behaviour_logprobs"],
        "advantages": base["advantages"],
        "weights": jnp.ones(2),
        "slow": jnp.zeros(2),
        "ref_logprobs": ref,
        "prox_logprobs": batch["behaviour_logprobs"] - 0.1 * mask,
    }
    lp = batch["behaviour_logprobs"] + 0.05 * mask
    ent = jnp.full(b.tokens.shape, 2.0)

    def loss(lp_, ent_):
        return objective.policy_loss(s, lp_ * mask, ent_, mb, jnp.sum(mask))[0]

    g_lp, g_ent = jax.grad(loss, argnums=(0, 1))(lp, ent)
    assert np.all(np.asarray(g_lp)[obs] == 0) and np.all(np.asarray(g_ent)[obs] == 0)
    assert np.any(np.asarray(g_lp)[b.response_mask == 1] != 0)  # the policy tokens do get a gradient
    if objective.critic:
        mb_v = {"mask": mask, "old_values": values, "returns": base["returns"]}
        g_v = jax.grad(lambda v: objective.value_loss(s, v, mb_v, jnp.sum(mask))[0])(values + 0.3)
        assert np.all(np.asarray(g_v)[obs] == 0)
    # GAE carries across an observation: turn 1's last token is followed by turn 2's first, not by the observation
    adv, _ = core.gae(jnp.zeros_like(mask), values, mask, 1.0, 0.0)  # λ = 0: one step of bootstrap
    assert float(adv[0, 4]) == pytest.approx(float(values[0, 8] - values[0, 4]), abs=1e-5)


@pytest.mark.unit
def test_the_conversation_keeps_the_sampled_tokens_where_retokenizing_differs(tmp_path):
    """Token-in/token-out: a response sampled as single characters whose text re-encodes to merged tokens reaches the
    next turn's prompt and the learner's row exactly as sampled."""
    from mle_jax.models.tokenizer import stop_token_ids, train_bpe_tokenizer

    tok = train_bpe_tokenizer(["import pandas as pd\nprint('hello')\n"] * 50, 300, tmp_path / "tok")
    word = "pandas"
    merged = tok.encode(word, add_special_tokens=False)
    chars = [tok.convert_tokens_to_ids(ch) for ch in word]
    assert len(merged) < len(chars) and tok.decode(chars) == word  # the text re-encodes differently
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled = [*chars, end]
    prompt = tok.encode("<|im_start|>user\nsolve<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    t1 = _sample(0, prompt, sampled, -10.0, False, 1.0)
    ids, text = observation_ids(tok, FAILED.text, sampled, stop_token_ids(tok), 1500, 512)
    assert "KeyError: 'x'" in text and "Submission check: no submission.csv was written" in text
    # the stop token the response ended with is not repeated: the user turn follows it
    assert tok.decode(ids, skip_special_tokens=False).startswith("\n<|im_start|>user\n")
    assert user_turn_text(tok, "o", "").startswith("<|im_end|>")  # a response cut at its length limit gets closed
    t1.observation_ids = ids
    second = [*prompt, *sampled, *ids]
    t2 = _sample(1, second, [*merged, end], -10.0, False, 1.0, episode=0, turn=2)
    [row] = episode_rows(Episode([t1, t2], ended=True), AgentSettings(turns=2))
    b = RolloutBatch.from_rows([row])
    assert b.tokens[0, len(prompt) : len(prompt) + len(sampled)].tolist() == sampled
    assert b.tokens[0].tolist() == [*second, *merged, end]
    # re-encoding the decoded conversation would not give these tokens back
    assert tok.encode(tok.decode(b.tokens[0].tolist(), skip_special_tokens=False), add_special_tokens=False) != (
        b.tokens[0].tolist()
    )


BROKEN = f"""I will predict a constant probability for every request.

```python
import pandas as pd
test = pd.read_json("{data_mount("random-acts-of-pizza")}test.json")
sub = pd.DataFrame({{"request_id": test["request_idd"], "requester_received_pizza": 0.3}})
sub.to_csv("submission.csv", index=False)
```"""
FIXED = BROKEN.replace('test["request_idd"]', 'test["request_id"]')


def _fixes_only_what_it_was_shown(shown: str) -> str:
    """A scripted policy: it writes the broken program unless the KeyError of that program is in its prompt."""
    return FIXED if "KeyError: 'request_idd'" in shown else BROKEN


def _two_turn_loop(tmp_path, pizza, agent: dict):
    """B = 2 episodes in flight of the scripted policy that fixes its program only when shown the KeyError."""
    sections = {"prompt": {"improve_fraction": 0.0}, "agent": agent}
    return _loop(tmp_path, pizza, _fixes_only_what_it_was_shown, texts=(BROKEN, FIXED), positions=4096,
                 sections=sections, in_flight_multiplier=1)  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("context", ["conversation"])  # "state": with "turn" credit, in the test below
def test_the_agent_fixes_its_program_at_turn_2_from_what_the_run_showed(tmp_path, pizza, context):
    """K = 2 turns, B = 2 episodes, the real bwrap sandbox and grader: turn 1's program fails with a KeyError; the
    observation shows it; the scripted policy answers it with the fixed program, which the grader scores. The learner
    trains on the episode's rows (conversation: one row, both responses as policy tokens, the observation masked)."""
    loop, sampler, fleet = _two_turn_loop(tmp_path, pizza, {"turns": 2, "context": context})
    try:
        m = loop.step()
    finally:
        loop.close()
        fleet.close()
    used = loop.last_used
    assert [s.turn for s in used] == [1, 2, 1, 2]
    first, second = used[0], used[1]
    assert not first.reward.valid and first.observation.status == "error"
    assert "KeyError: 'request_idd'" in first.observation_text and second.reward.valid
    assert second.code == FIXED.split("```python\n")[1].split("\n```")[0]
    assert m["valid_fraction/turn1"] == 0.0 and m["valid_fraction/turn2"] == 1.0 and m["valid_fraction"] == 1.0
    assert m["episode/submitted_turn"] == 2.0
    if context == "conversation":  # the whole episode in the second turn's prompt, tokens as sampled
        assert second.prompt.prompt_ids == [
            *first.prompt.prompt_ids, *first.completion.token_ids.tolist(), *first.observation_ids
        ]  # fmt: skip
    else:  # a fresh improve prompt about turn 1's program and its output, not the conversation
        assert first.observation_ids is None and "Terminal output of the previous solution" in sampler.tokenizer.decode(
            second.prompt.prompt_ids
        )
    assert loop.learner.step == 1 and np.isfinite(m["reward/mean"])
    b = loop._batch([Episode(used[:2], ended=True), Episode(used[2:], ended=True)])  # the rows it trained on
    spans = np.sum(np.diff(b.response_mask, axis=1) == 1, axis=1)
    assert spans.tolist() == ([2, 2] if context == "conversation" else [1, 1, 1, 1])  # a row per episode, or turn


@pytest.mark.unit
def test_turn_credit_groups_complete_with_inert_rows_for_turns_an_episode_did_not_reach():
    """Groups of n = 2, K = 3, B = 4 turns: episode A ended at turn 1, B has run turns 1 and 2. Turn 1's group and turn
    2's (B's turn 2 and an inert row for A) are complete and train; turn 3's waits for B; A leaves `finished`."""
    from types import SimpleNamespace

    from mle_jax.rl.loop import AsyncRLLoop

    def sample(uid, episode, turn, valid):
        return _sample(uid, [1, 2], [3, 4], -0.5 if valid else -10.0, valid, 1.0, group=0, episode=episode, turn=turn)

    a, b = Episode([sample(1, 1, 1, False)]), Episode([sample(2, 2, 1, False), sample(3, 2, 2, True)])
    loop = AsyncRLLoop.__new__(AsyncRLLoop)
    loop.settings = SimpleNamespace(group_size=2, batch_size=4)
    loop.env = SimpleNamespace(settings=SimpleNamespace(max_sequence_tokens=8))
    loop.turns, loop.per_turn, loop.pad_id = 3, True, 0
    loop.finished, loop.turn_queue = [], []
    loop._turn_done(a, a.turns[0])
    loop._end(a)  # inert members for turns 2 and 3
    loop._turn_done(b, b.turns[0])
    assert not loop._ready()  # one group (turn 1) of two rows
    loop._turn_done(b, b.turns[1])
    assert loop._ready()
    batch, turns, done, uids = loop._take_turns()
    assert [s.uid for s in turns] == [1, 2, 3] and uids == {1, 2, 3} and done == [a]
    assert batch.batch_size == 4 and int(batch.response_mask.sum()) == 3 * 2  # three turns of 2 tokens, one inert row
    assert [(e.uid, s, k) for e, s, k in loop.turn_queue] == [(1, None, 3)]  # waits for B's turn 3


@pytest.mark.integration
def test_with_turn_credit_an_update_trains_on_the_first_b_finished_turns(tmp_path, pizza):
    """With "turn" credit (ML-Agent's step-wise RL), K = 2, B = 2 episodes in flight, the state context: the first
    update trains on the two turn-1 runs as soon as they are graded (a batch of 2 rows), while the turn-2 programs are
    already sampled from what those runs showed (the improve prompt about turn 1's program and its KeyError); the
    second update trains on the turn 2s, the fixed program, which the grader scores."""
    loop, sampler, fleet = _two_turn_loop(tmp_path, pizza, {"turns": 2, "context": "state", "credit": "turn"})
    try:
        first = loop.step()
        used1, live = loop.last_used, len(loop.live)
        second = loop.step()
        used2 = loop.last_used
    finally:
        loop.close()
        fleet.close()
    assert [s.turn for s in used1] == [1, 1] and not any(s.reward.valid for s in used1)
    assert live == 2  # both episodes still going: their turn 2 was sampled before the update
    assert first["valid_fraction/turn1"] == 0.0 and first["valid_fraction/turn2"] is None
    assert first["episode/submitted_turn"] is None  # no episode ended yet
    assert [s.turn for s in used2] == [2, 2] and all(s.reward.valid for s in used2)
    assert all("KeyError: 'request_idd'" in s.observation_text for s in used1)
    assert used2[0].code == FIXED.split("```python\n")[1].split("\n```")[0]
    shown = sampler.tokenizer.decode(used2[0].prompt.prompt_ids)  # a fresh improve prompt, not the conversation
    assert used1[0].observation_ids is None and "Terminal output of the previous solution" in shown
    assert {s.episode for s in used2} == {s.episode for s in used1}
    assert second["valid_fraction/turn2"] == 1.0 and second["episode/submitted_turn"] == 2.0
    assert loop.learner.step == 2 and not loop.finished and not loop.turn_queue
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["turn"], r["trained_as"]) for r in rows] == [(1, 1, "turn")] * 2 + [(2, 2, "turn")] * 2
    assert len(submitted_rows(rows)) == 4  # every turn is a sample of its own


@pytest.mark.unit
def test_agent_settings_errors_are_one_line():
    from configs import base
    from mle_jax.run.settings import ConfigError, from_config

    for field, value, said in (
        ("turns", 0, "agent.turns must be an integer >= 1"),
        ("context", "tree", "agent.context must be one of conversation, state"),
        ("credit", "token", "agent.credit must be one of episode, turn"),
        ("turns", 40, "over model.max_position_embeddings=4096"),
    ):
        cfg = base.apply_cpu(base.task_config("spooky-author-identification", "paper"))
        cfg.agent[field] = value
        with pytest.raises(ConfigError, match=said) as e:
            from_config(cfg)
        assert "\n" not in str(e.value)
    cfg = base.apply_cpu(base.task_config("spooky-author-identification", "paper"))
    cfg.agent.turns, cfg.agent.context = 40, "state"  # a state prompt is bounded: any number of turns fits
    assert from_config(cfg).rollout.max_sequence_tokens == 768 + 320


@pytest.mark.unit
def test_the_report_shows_turns(tmp_path):
    from mle_jax.reporting.report import plot_keys, turn_table

    rows = [{"step": 1, "valid_fraction/turn1": 0.0, "valid_fraction/turn2": 0.5, "reward/mean/turn1": -9.6}]
    assert plot_keys(rows)["valid_fraction_by_turn"] == ("valid_fraction/turn1", "valid_fraction/turn2")
    samples = [
        {"episode": 0, "turn": 1, "valid": False, "reward": -9.6, "duration_s": 1.0, "submitted": False},
        {"episode": 0, "turn": 2, "valid": True, "reward": -0.5, "duration_s": 3.0, "submitted": True},
        {"episode": 4, "turn": 1, "valid": True, "reward": -0.7, "duration_s": 2.0, "submitted": True},
    ]
    table = turn_table(samples)
    assert "| 1 | 2 | 0.5 |" in table and "| 2 | 1 | 1 |" in table
    assert turn_table([{"episode": 0, "turn": 1, "valid": True, "reward": 1.0}]) == ""


@pytest.mark.unit
def test_a_batch_that_does_not_split_into_mini_batches_is_refused_before_anything_starts():
    from configs import base
    from mle_jax.run.settings import ConfigError, from_config

    cfg = base.apply_cpu(base.task_config("spooky-author-identification", "paper"))
    cfg.loop.batch_size = 12  # the :cpu mini-batch is 8
    with pytest.raises(ConfigError, match="the update's 12 rows are not a multiple of ppo.mini_batch_size=8"):
        from_config(cfg)
    cfg.loop.batch_size, cfg.agent.turns, cfg.agent.context = 4, 3, "state"  # 4 episodes x 3 rows: 12
    with pytest.raises(ConfigError, match=r"12 rows \(4 episodes x 3 rows\)"):
        from_config(cfg)


@pytest.mark.unit
def test_the_report_summary_counts_what_each_episode_submitted(tmp_path):
    import json

    from mle_jax.reporting.report import write_report

    rows = [
        {"step": 1, "episode": 0, "turn": 1, "valid": False, "reward": -9.6, "score": None, "submitted": False},
        {"step": 1, "episode": 0, "turn": 2, "valid": True, "reward": -0.5, "score": 0.5, "submitted": True},
        {"step": 1, "episode": 3, "turn": 1, "valid": True, "reward": -0.4, "score": 0.4, "submitted": True},
    ]
    for r in rows:
        r |= {"task": "spooky-author-identification", "duration_s": 1.0, "prompt": "scratch", "status": "ok"}
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "valid_fraction": 1.0}) + "\n")
    text = write_report(tmp_path, {"task": "spooky-author-identification"}, None, plots=False).read_text()
    assert "**Valid fraction** (step 1 → step 1): 1.00 → 1.00" in text  # the submitted turns, not every turn
    assert "(2 → 2 samples)" in text and "**Best score during RL**: 0.400" in text
    assert "## By turn" in text
