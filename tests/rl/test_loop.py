"""The asynchronous loop on real parts: bwrap sandboxes running programs on the prepared pizza data,
the real grader, learner, checkpoints and a tiny Qwen2; only the policy's text comes from a script,
so that run times are known (see scripted_sampler.py)."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base
from mle_jax.env.rollout import Environment, PromptItem, Sample
from mle_jax.executor.fleet import make_fleet
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import MetricsWriter, read_metrics
from mle_jax.infra.tensorboard_events import text_points
from mle_jax.instrument import instrument_batch
from mle_jax.models.hf import hf_host_tensors
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.reporting import report
from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.loop import AsyncRLLoop
from mle_jax.rl.step_metrics import StepStats
from mle_jax.run.builders import make_learner
from mle_jax.run.settings import from_config
from mle_jax.sampling.protocol import Completion
from mle_jax.sampling.vllm_worker import is_orbax_item, iter_weights
from mle_jax.tasks.medals import LEVELS
from mle_jax.tasks.prepare import prepare
from mle_jax.tasks.prompts import data_mount
from mle_jax.tasks.reward import Reward
from tests.executor.programs import DEEP_TREE
from tests.rl.scripted_sampler import ScriptedSampler
from tests.rl.tiny import tiny_qwen2
from tests.samples_browser import open_page, rows

pytestmark = pytest.mark.integration


def _program(sleep_s: float, p: float) -> str:
    return f"""I will predict a constant probability for every request, after loading the test data.

```python
import time
import pandas as pd
test = pd.read_json("{data_mount("random-acts-of-pizza")}test.json")
time.sleep({sleep_s})
sub = pd.DataFrame({{"request_id": test["request_id"], "requester_received_pizza": {p}}})
sub.to_csv("submission.csv", index=False)
```"""


SLOW = _program(0.0, 0.3).replace(
    "time.sleep(0.0)",  # runs until the test puts RELEASE into the (read-only) data folder: an event, not a clock
    f'while not __import__("os").path.exists("{data_mount("random-acts-of-pizza")}RELEASE"): time.sleep(0.05)',
)
FAST = _program(0.0, 0.25)
NO_CODE = "I would train a model but I will not write any code."
# a program that leaves a tree 1,200 folders deep in its work dir (the executor's clean-up once died of it: the sample
# became an infrastructure failure, never trained on, and every later run with the same temporary root failed)
DEEP = "I will make a deep folder tree.\n\n```python\n" + DEEP_TREE.format(depth=1200).strip() + "\n```"


@pytest.fixture(scope="module")
def pizza(tmp_path_factory, raw_data_dir):
    return prepare(
        "random-acts-of-pizza", raw_data_dir / "random-acts-of-pizza", tmp_path_factory.mktemp("pizza") / "prepared"
    )


def _loop(
    tmp_path,
    task,
    script,
    group_size=1,
    slots=2,
    work_root=None,
    sections=None,
    texts=(SLOW, FAST, NO_CODE),
    positions=2048,
    tensorboard=False,
    **loop_overrides,
):
    cfg = base.apply_cpu(base.task_config("random-acts-of-pizza", "paper"))
    cfg.workdir = str(tmp_path)
    cfg.loop.batch_size, cfg.loop.in_flight_multiplier, cfg.loop.max_version_lag = 2, 3, 1
    cfg.sampler.group_size = group_size
    cfg.executor.slots = slots
    cfg.ppo.mini_batch_size, cfg.ppo.micro_batch_size = 2, 2
    cfg.prompt.max_prompt_tokens, cfg.sampler.max_tokens = 1536, 256
    cfg.prompt.improve_fraction = 1.0
    cfg.executor.timeout_s = 600.0  # a guard only: SLOW runs until released, the others end in seconds
    for k, v in loop_overrides.items():
        cfg.loop[k] = v
    for section, fields in (sections or {}).items():
        for k, v in fields.items():
            cfg[section][k] = v
    tok = train_bpe_tokenizer(list(texts) * 4, 400, tmp_path / "tok")
    mcfg = tiny_qwen2(
        len(tok), num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=positions
    )
    policy = Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(0))
    s = from_config(cfg)
    learner = make_learner(s, policy)
    sampler = ScriptedSampler(policy, tok, script)
    fleet = make_fleet(s.executor, work_root=work_root)
    env = Environment(
        s.rollout, task, tok, ["pandas", "numpy"], sampler, lambda codes: instrument_batch(codes, "ast"), fleet
    )
    writer = MetricsWriter(tmp_path, tensorboard=tensorboard, output_chars=s.report.sample_output_chars)
    loop = AsyncRLLoop(s.loop, env, learner, Checkpointer(tmp_path / "ckpt", keep=2), writer)
    return loop, sampler, fleet


def compile_update(loop: AsyncRLLoop) -> None:
    """Compiles the learner's update for the loop's batch shape by one update on a batch of that shape, then puts
    the learner's state back (a copy: the update donates its state): the loop starts as it would have."""
    n = loop.settings.batch_size
    batch = RolloutBatch.from_sequences([[1, 2]] * n, [[3]] * n, [[-1.0]] * n, [0.0] * n, [1.0] * n, [0] * n,
                                        pad_to=loop.env.settings.max_sequence_tokens)  # fmt: skip
    state = jax.tree.map(jnp.copy, loop.learner.state)
    loop.learner.update(batch)
    loop.learner.state = state
    assert loop.learner.step == 0


def test_a_slow_run_trains_with_its_duration_weight_however_late_and_only_queued_runs_are_resampled(tmp_path, pizza):
    """One slow program among fast ones, 2 slots, B=2, 16 in flight, max_version_lag=1. The slow run ends many
    versions after it was sampled (it runs until three updates have been made): it still trains, with its
    duration weight. Runs that were still *queued* when their sample fell more than one version behind are
    taken back and their prompts sampled again."""
    assert SLOW != FAST
    release = pizza.public_dir / "RELEASE"
    # 16 in flight, 15 of them fast runs of version 0 queued behind one slot. For some to be still queued when the
    # policy reaches version 2, an update must take less time than the two fast runs it waits for: the update is
    # compiled before the loop starts (a first update's compile took as long as all 15 fast runs, which were then
    # gone however the test was tuned), and each fast run takes half a second more than FAST
    fast = _program(0.5, 0.25)
    loop, sampler, fleet = _loop(tmp_path, pizza, [SLOW] + [fast] * 80, in_flight_multiplier=8)
    compile_update(loop)
    found = None
    try:
        for _ in range(40):
            m = loop.step()
            if loop.counters.version >= 3:
                release.touch()
            slow = [s for s in loop.last_used if s.code and "RELEASE" in s.code]
            if slow:
                found = (m, slow[0], loop.counters.version - 1)
                break
    finally:
        release.unlink(missing_ok=True)
        loop.close()
        fleet.close()
    assert found is not None, "the slow run never reached a batch"
    m, slow, trained_at = found
    assert slow.reward.valid, slow.result
    assert trained_at - slow.version >= 2  # older than max_version_lag=1, and trained on: it was running
    # Δt of three updates (each waiting for two fast runs in the other slot) against one fast run: weight > 1.5
    assert slow.reward.valid and m["learner/duration/weight_max"] > 1.5
    # the staleness metrics the loop writes for that step: the slow run is its batch's slow sample (Δt above the mean)
    assert m["learner/stale/version_lag_slow"] == trained_at - slow.version
    assert 0.0 <= m["learner/stale/clipfrac_slow"] <= 1.0
    assert loop.counters.resampled_stale >= 1 and m["resampled_stale"] == loop.counters.resampled_stale
    assert sampler.version == loop.counters.step  # synced after every update


def test_groups_train_whole_and_a_group_with_a_slow_member_waits_for_it(tmp_path, pizza):
    """group_size n=2, B=2 (the other tests' shapes: their compiled update is reused), 6 in flight; the first group
    is one slow program and one fast one. Every update trains on a whole group (both members of one prompt,
    sampled in one request at one version), the batch's group_ids are the samples' groups, and the slow program's
    fast sibling, finished long before, is trained on only with it."""
    release = pizza.public_dir / "RELEASE"
    loop, sampler, fleet = _loop(tmp_path, pizza, [SLOW] + [FAST] * 60, group_size=2)
    batches, update = [], loop.learner.update

    def recording_update(batch):
        batches.append((batch.group_ids.copy(), list(loop.last_used)))
        return update(batch)

    loop.learner.update = recording_update
    found = None
    try:
        for _ in range(40):
            loop.step()
            if loop.counters.version >= 1:
                release.touch()
            slow = [s for s in loop.last_used if s.code and "RELEASE" in s.code]
            if slow:
                found = slow[0]
                break
    finally:
        release.unlink(missing_ok=True)
        loop.close()
        fleet.close()
    assert found is not None, "the slow program's group never reached a batch"
    for group_ids, used in batches:
        np.testing.assert_array_equal(group_ids, [s.group for s in used])
        assert len(used) == 2 and group_ids[0] == group_ids[1]  # one whole group
        for g in set(group_ids.tolist()):
            members = sorted((s for s in used if s.group == g), key=lambda s: s.uid)
            assert [s.uid for s in members] == [g, g + 1]  # the group's id is its first member's uid
            assert members[0].prompt is members[1].prompt and members[0].version == members[1].version
    sibling = [s for s in loop.last_used if s.group == found.group and s is not found]
    assert len(sibling) == 1 and sibling[0].reward.valid and found.reward.valid
    assert sibling[0].duration_s < found.duration_s / 2  # it finished long before, and waited for its group
    assert all(found.group not in ids for ids, _ in batches[:-1])  # never trained on without its slow member
    assert len(batches) >= 2
    assert len(sampler.prompts_seen) * 2 == loop.counters.sampled  # one request of n=2 samples per prompt


def test_stale_queued_groups_are_resampled_whole_and_a_group_with_a_running_member_stays(tmp_path, pizza):
    """One sandbox slot, held by the slow member of the first group; every other run waits in the queue. Once the
    policy has moved on past max_version_lag, every group whose runs all still wait is taken back whole and its
    prompt sampled again as one group of n; the slow program's group, with a member running, stays (its queued
    sibling too)."""
    release = pizza.public_dir / "RELEASE"
    loop, sampler, fleet = _loop(tmp_path, pizza, [SLOW] + [FAST] * 60, group_size=2, slots=1, batch_size=4)
    try:
        loop._refill()  # m·B = 12 samples: 6 groups of 2, all at version 0
        assert [s.uid for s in loop.in_flight] == list(range(12)) and loop.counters.sampled == 12
        first = loop.in_flight[0]
        for _ in range(600):  # the slot picks the slow run up
            if first.future.running():
                break
            time.sleep(0.05)
        assert first.future.running() and "RELEASE" in first.code
        prompts = {s.group: s.prompt for s in loop.in_flight}
        loop.counters.version = 2  # two updates later: version lag 2 > max_version_lag=1
        loop._resample_stale_queued()
        assert [s.uid for s in loop.in_flight] == [0, 1]  # the group of the running slow program
        assert loop.counters.resampled_stale == 10
        assert [id(p) for p in loop.requeued] == [id(prompts[g]) for g in (2, 4, 6, 8, 10)]  # the same prompts
        loop._refill()  # the five prompts again, one request of two samples each, then new prompts: none needed
        again = loop.in_flight[2:]
        assert [id(s.prompt) for s in again] == [id(prompts[g]) for g in (2, 2, 4, 4, 6, 6, 8, 8, 10, 10)]
        assert [s.group for s in again] == [12, 12, 14, 14, 16, 16, 18, 18, 20, 20] and not loop.requeued
        assert len(sampler.prompts_seen) == 11  # 6 + 5 requests
    finally:
        release.touch()
        loop.close()
        fleet.close()
        release.unlink(missing_ok=True)


def test_a_group_whose_run_fails_in_the_executor_is_dropped_whole(tmp_path, pizza):
    """Groups of two: a program and a response without code (finished at once, never run). The executor cannot
    run programs (its work root cannot be created: a real infrastructure failure), so no group can be completed;
    each is dropped when its program fails, its finished sibling with it, instead of waiting in `finished`."""
    loop, sampler, fleet = _loop(tmp_path, pizza, [FAST, NO_CODE], group_size=2, work_root="/proc/mle_jax_no_dir")
    try:
        loop._refill()  # m·B = 6: three groups, each a program (queued) and a response without code (finished)
        assert len(loop.finished) == 3 and len(loop.in_flight) == 3
        assert [s.group for s in loop.finished] == [s.group for s in loop.in_flight] == [0, 2, 4]
        while loop.in_flight:
            loop._collect(block=True)
    finally:
        loop.close()
        fleet.close()
    assert loop.counters.infra_failures == 3 and loop.counters.dropped_with_group == 3
    assert loop.finished == [] and loop._finished_groups() == []


def test_improve_prompts_show_earlier_solutions_and_no_code_is_total_failure(tmp_path, pizza):
    """...and what the run writes of them for people: samples.jsonl's texts, TensorBoard's samples and
    samples.html, read in headless Chromium."""
    loop, sampler, fleet = _loop(tmp_path, pizza, [FAST, FAST, NO_CODE], tensorboard=True)
    used, history = [], []
    try:
        for _ in range(5):
            history.append(loop.step())
            used += loop.last_used
    finally:
        loop.close()
        fleet.close()
    assert all(s.group == s.uid for s in used)  # group_size 1: every sample its own group
    no_code = [s for s in used if s.code is None]
    ran = [s for s in used if s.code is not None]
    assert no_code and all(s.reward.total == -10.0 and s.result is None for s in no_code)  # never executed
    assert ran and all(s.reward.valid and s.reward.total == pytest.approx(0.5) for s in ran)
    assert len(loop.buffer) >= 1  # valid programs, with their output
    improve = [s for s in used if s.prompt.kind == "improve"]
    assert improve, "with improve_fraction=1 and a non-empty buffer, prompts ask to improve"
    assert any(m["improve_fraction"] > 0 for m in history)
    text = sampler.tokenizer.decode(improve[0].prompt.prompt_ids)
    assert "requester_received_pizza" in text and "loaded data" in text  # the code and its progress output
    assert "@@mle" not in text  # the per-run tag of the instrumenter's prints never reaches the policy
    _check_what_people_read(tmp_path, pizza.id, used)


def _check_what_people_read(workdir, task_id, used):
    """samples.jsonl has each trained sample's texts (the tag never in them), TensorBoard each step's best, worst
    and failure, and samples.html (from the report) filters by status and shows a program with the instrumenter's
    print lines marked, in a real browser."""
    records = read_metrics(workdir / "samples.jsonl")
    assert [r["uid"] for r in records] == [s.uid for s in used]
    ran = [r for r in records if r["status"] == "ok"]
    assert ran and all(r["outcome"] == "valid" and r["medal"] in LEVELS for r in ran)
    for r in ran:
        marked = [r["program"].split("\n")[i - 1] for i in r["instrumenter_lines"]]
        assert marked and all("print(" in line for line in marked) and "@@mle" not in r["program"]
        printed = [r["stdout"].split("\n")[i - 1] for i in r["progress_lines"]]
        assert "loaded data" in printed and "@@mle" not in r["stdout"]
        assert r["plan"].startswith("I will predict a constant")
    no_code = [r for r in records if r["status"] is None]
    assert no_code and all(r["outcome"] == "no_code" and r["program"] is None for r in no_code)
    texts = text_points(workdir / "tb")
    assert {tag for tag, _, _ in texts} == {"samples/best", "samples/worst", "samples/failure"}
    assert any(tag == "samples/failure" and "outcome no_code" in text for tag, _, text in texts)

    report.write_report(workdir, {"task": task_id}, None)
    assert {"duration_score.png", "medal_shares.png", "outcomes.png"} <= {p.name for p in (workdir / "plots").iterdir()}
    with open_page(workdir / "samples.html") as opened:
        page = opened.page
        assert len(rows(page, "uid")) == len(records)
        page.select_option("#filter-status", "ok")
        assert rows(page, "status") == ["ok"] * len(ran)
        assert page.inner_text("#count") == f"{len(ran)} of {len(records)} samples pass the filters"
        page.locator("#samples tr.sample").first.click()
        program = page.locator("#program span.line").all_inner_texts()
        assert program == ran[0]["program"].split("\n")
        marked = page.locator("#program span.line.instr").all_inner_texts()
        assert marked == [program[i - 1] for i in ran[0]["instrumenter_lines"]] and marked
        assert "loaded data" in page.locator("#stdout span.line.progress").all_inner_texts()
        page.select_option("#filter-status", "—")  # the responses without code: nothing ran
        page.locator("#samples tr.sample").first.click()
        assert "no code block" in page.inner_text("#program")
    assert opened.errors == [] and opened.requests == []


def test_a_deep_folder_tree_costs_its_program_the_reward_and_the_next_program_scores(tmp_path, pizza):
    """Hostile programs round three: the deep tree is the program's own failure (a reward, trained on), never the
    executor's; the programs after it, in the same fleet and temporary root, run and score normally."""
    loop, sampler, fleet = _loop(tmp_path, pizza, [DEEP, FAST], texts=(FAST, NO_CODE, DEEP))
    used = []
    try:
        for _ in range(2):
            loop.step()
            used += loop.last_used
    finally:
        loop.close()
        fleet.close()
    deep = [s for s in used if s.code is not None and "os.chdir" in s.code]
    fast = [s for s in used if s.code is not None and "requester_received_pizza" in s.code]
    assert deep and all(s.result is not None and not s.result.infra_failure for s in deep)
    assert all(not s.reward.valid and s.reward.total < -9 for s in deep)
    assert fast and all(s.reward.valid and s.reward.total == pytest.approx(0.5) for s in fast)
    assert loop.counters.infra_failures == 0


def test_orbax_sync_hands_the_sampler_the_committed_checkpoint_of_the_step(tmp_path, pizza):
    """sync_source "orbax": after each update the loop saves the step, waits for it to be written, and gives the
    sampler that checkpoint's learner item, whose policy (read as the vLLM worker reads it) is the trained one."""
    loop, sampler, fleet = _loop(tmp_path, pizza, [FAST] * 40)
    loop.settings = dataclasses.replace(loop.settings, sync_source="orbax")
    seen = []
    scripted_sync = sampler.sync

    def sync(params, version):
        seen.append((params, is_orbax_item(params), version))
        scripted_sync(loop.learner.policy_state(), version)  # the scripted sampler samples from our model

    sampler.sync = sync
    try:
        for _ in range(2):
            loop.step()
        expected = hf_host_tensors(loop.learner.policy_state())
        item, committed, version = seen[-1]
        got = {name: tensor.numpy() for name, tensor in iter_weights(item)}
    finally:
        loop.close()
        fleet.close()
    assert [(v, c) for _, c, v in seen] == [(1, True), (2, True)]
    assert [p for p, _, _ in seen] == [loop.checkpointer.item_dir(s, "learner") for s in (1, 2)]
    assert sorted(got) == sorted(expected)
    for name, x in expected.items():
        np.testing.assert_array_equal(got[name], x, err_msg=name)


def test_a_critic_free_objective_with_the_decoupled_loss_trains_on_the_real_loop(tmp_path, pizza):
    """learner.algorithm=grpo with ppo.decoupled: the loop's learner has no critic, each step's metrics carry the KL
    loss and the slow/fast staleness metrics (behaviour weights included), and its checkpoints hold no critic."""
    sections = {"learner": {"algorithm": "grpo"}, "ppo": {"decoupled": True}}
    loop, _, fleet = _loop(tmp_path, pizza, [FAST, NO_CODE] * 20, group_size=2, sections=sections)
    try:
        history = [loop.step() for _ in range(2)]
    finally:
        loop.close()
        fleet.close()
    assert loop.learner.state.value is None and loop.learner.value_model() is None
    m = history[-1]
    assert not any(k.startswith("learner/critic/") for k in m) and "learner/actor/kl_loss" in m
    stale = {
        f"learner/stale/{q}_{s}" for q in ("version_lag", "clipfrac", "behaviour_weight") for s in ("slow", "fast")
    }
    assert stale <= set(m)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert set(ckpt.restore()["learner"]) == {"step", "policy", "policy_opt"}


def test_a_steps_best_score_is_in_the_tasks_direction():
    """score/best is the min of a lower-is-better task's scores (score/max is its worst sample); a mix logs each
    task's best instead, never one pooled over tasks of different scales."""
    ids = np.zeros(1, np.int32)

    def sample(uid: int, task: str, score: float | None) -> Sample:
        completion = Completion(ids, ids, np.zeros(1, np.float32), "", "stop", 0)
        reward = Reward(score if score is not None else -10.0, score is not None, score, (), 0)
        return Sample(uid, PromptItem("scratch", [0], task=task), completion, "", "x = 1", task=task, reward=reward)

    spooky = [sample(i, "spooky-author-identification", s) for i, s in enumerate((0.9, 0.4, None, 1.3))]
    m = StepStats(spooky, (), lower_is_better=True).metrics()
    assert (m["score/best"], m["score/max"], m["score/min"]) == (0.4, 1.3, 0.4)
    assert m["task_score/mean"] == pytest.approx((-0.9 - 0.4 - 10.0 - 1.3) / 4)  # log loss negated, invalid -10
    pizza = [sample(9, "random-acts-of-pizza", 0.62), sample(10, "random-acts-of-pizza", 0.55)]
    mix = StepStats(spooky + pizza, ("spooky-author-identification", "random-acts-of-pizza")).metrics()
    assert mix["score/best"] is None
    assert mix["task_score/mean/random-acts-of-pizza"] == pytest.approx((0.62 + 0.55) / 2)  # AUC: not negated
    assert mix["task_score/mean"] == pytest.approx((-0.9 - 0.4 - 10.0 - 1.3 + 0.62 + 0.55) / 6)
    assert mix["score/best/spooky-author-identification"] == 0.4 and mix["score/best/random-acts-of-pizza"] == 0.62


def test_the_trained_improve_share_holds_the_configured_half_though_improve_programs_run_slower(tmp_path, pizza):
    """prompt.improve_fraction=0.5 on a run whose improve programs run 1 s and whose scratch programs end at once
    (the fast ones return first and fill the early batches): after the first steps the share of improve prompts
    among trained samples is the configured half within a few points, drawn and trained shares are logged per step,
    and the first prompts (drawn before any solution existed) are owed, not lost."""
    slow_improve = _program(0.5, 0.35)

    def respond(shown: str) -> str:  # an improve prompt shows the earlier program, and only it has a sleep in it
        return slow_improve if "time.sleep(" in shown else FAST

    loop, _, fleet = _loop(tmp_path, pizza, respond, sections={"prompt": {"improve_fraction": 0.5}})
    history, used = [], []
    try:
        for _ in range(10):
            history.append(loop.step())
            used.append([s.prompt.kind == "improve" for s in loop.last_used])
    finally:
        loop.close()
        fleet.close()
    late = [k for step in used[4:] for k in step]
    assert abs(np.mean(late) - 0.5) <= 0.1, used
    for m, kinds in zip(history, used, strict=True):
        assert m["prompt/improve_share_trained"] == pytest.approx(np.mean(kinds))
    drawn = [m["prompt/improve_share_drawn"] for m in history if m["prompt/improve_share_drawn"] is not None]
    assert drawn and abs(np.mean(drawn) - 0.5) <= 0.1
