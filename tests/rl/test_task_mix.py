"""A run over a mix of tasks: the seeded (task, kind) stream, its position across a resume, and prompts of the
right task (an improve prompt shows an earlier solution of its own task)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from configs import base
from mle_jax.env.improve_buffer import ImproveBuffer, PreviousSolution
from mle_jax.env.rollout import Environment, PromptItem, Sample
from mle_jax.env.task_mix import BLOCK, PromptStream
from mle_jax.executor.fleet import make_fleet
from mle_jax.executor.result import Status
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import MetricsWriter
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.rl.loop import AsyncRLLoop
from mle_jax.run.settings import ConfigError, from_config
from mle_jax.sampling.protocol import Completion
from mle_jax.tasks.prepare import prepare

PIZZA, SPOOKY = "random-acts-of-pizza", "spooky-author-identification"


def test_the_stream_draws_tasks_by_weight_and_kinds_by_seed():
    draws = PromptStream([PIZZA, SPOOKY], [3.0, 1.0], 0.5, seed=0).take(4000)
    tasks = Counter(t for t, _ in draws)
    assert tasks[PIZZA] / len(draws) == pytest.approx(0.75, abs=0.01)
    for task in (PIZZA, SPOOKY):  # stratified: every block of BLOCK draws of a task holds the share exactly
        kinds = [k == "improve" for t, k in draws if t == task]
        blocks = np.reshape(kinds[: len(kinds) // BLOCK * BLOCK], (-1, BLOCK)).sum(axis=1)
        assert set(blocks.tolist()) == {BLOCK // 2}
        assert kinds[:BLOCK] != kinds[BLOCK : 2 * BLOCK] or kinds[BLOCK : 2 * BLOCK] != kinds[2 * BLOCK : 3 * BLOCK]
    odd = [k == "improve" for _, k in PromptStream([PIZZA], [1.0], 0.3, seed=4).take(203)]
    assert all(abs(sum(odd[:n]) - 0.3 * n) <= 0.3 * BLOCK + 1 for n in range(1, 204))  # any prefix, any share
    assert sum(odd[: 25 * BLOCK]) in (59, 60, 61)
    assert draws == PromptStream([PIZZA, SPOOKY], [3.0, 1.0], 0.5, seed=0).take(4000)  # seeded
    assert draws != PromptStream([PIZZA, SPOOKY], [3.0, 1.0], 0.5, seed=1).take(4000)


def test_a_restored_stream_continues_where_it_was_not_from_the_start():
    a = PromptStream([PIZZA, SPOOKY], [1.0, 1.0], 0.5, seed=0)
    first = a.take(10)
    state = json.loads(json.dumps(a.state_dict()))
    b = PromptStream([PIZZA, SPOOKY], [1.0, 1.0], 0.5, seed=0)
    b.load_state_dict(state)
    assert b.take(10) == a.take(10) != first
    with pytest.raises(ValueError, match="same config.tasks"):
        PromptStream([PIZZA], [1.0], 0.5, seed=0).load_state_dict(state)


@pytest.fixture(scope="module")
def mix_env(tmp_path_factory, raw_data_dir):
    root = tmp_path_factory.mktemp("mix")
    tasks = {t: prepare(t, raw_data_dir / t, root / t / "prepared") for t in (PIZZA, SPOOKY)}
    cfg = base.apply_cpu(base.task_config(PIZZA, "paper"))
    cfg.workdir = str(root / "run")
    cfg.tasks = (PIZZA, SPOOKY)
    cfg.prompt.improve_fraction = 1.0  # every draw asks to improve: the buffer decides
    cfg.prompt.max_prompt_tokens = 4096  # a BPE trained on one line spells the prompts out in long tokens
    s = from_config(cfg)
    tok = train_bpe_tokenizer(["import pandas as pd\nprint('x')"] * 4, 400, root / "tok")
    env = Environment(s.rollout, tasks[PIZZA], tok, ["pandas"], None, None, None, tasks=tasks, seed=s.seed)
    return s, env, root


def _solution(task: str) -> PreviousSolution:
    return PreviousSolution("plan", f"print('{task}')", "out", 0.1, False, None, 0, task=task)


def test_improve_prompts_pick_a_parent_of_their_own_task(mix_env):
    _, env, _ = mix_env
    buffer = ImproveBuffer(8)
    buffer.add(_solution(PIZZA), n_prints=1)  # only pizza has an earlier solution
    items = env.prompts(40, buffer, np.random.default_rng(0))
    assert {i.task for i in items} == {PIZZA, SPOOKY}
    for i in items:
        if i.task == PIZZA:
            assert i.kind == "improve" and i.parent.task == PIZZA
        else:  # no spooky solution to improve: a scratch prompt of spooky
            assert i.kind == "scratch" and i.parent is None
    spooky = env.tokenizer.decode(next(i for i in items if i.task == SPOOKY).prompt_ids)
    assert "spooky" in spooky.lower() or "author" in spooky.lower()


def test_the_loop_checkpoint_carries_the_stream_position(mix_env, tmp_path):
    s, env, _ = mix_env
    loop = AsyncRLLoop(s.loop, env, None, Checkpointer(tmp_path / "c1"), MetricsWriter(tmp_path, tensorboard=False))
    env.prompts(7, None, loop.rng)
    state = json.loads(json.dumps(loop.state_dict()))
    ahead = [(i.task, i.kind) for i in env.prompts(9, None, loop.rng)]
    env.stream.position = 0  # a fresh process's stream starts at 0 ...
    loop.load_state_dict(state)  # ... and the checkpoint puts it back at 7
    assert [(i.task, i.kind) for i in env.prompts(9, None, loop.rng)] == ahead


def test_each_task_runs_with_its_own_timeout(mix_env):
    """config.task_timeouts_s: the same 3-second program times out under a task with a 1-second timeout and finishes
    under the other task's (the executor's 120 s), each in the real bwrap fleet."""
    s, env, _ = mix_env
    cfg = base.apply_cpu(base.task_config(PIZZA, "paper"))
    cfg.tasks, cfg.task_timeouts_s = (SPOOKY, PIZZA), (1.0, 120.0)  # config.tasks' order, not the mix's
    timed = from_config(cfg)
    assert [t.id for t in timed.mix] == [PIZZA, SPOOKY] and timed.task_timeouts_s == (120.0, 1.0)
    fleet = make_fleet(timed.executor)
    try:
        timeouts = dict(zip([PIZZA, SPOOKY], timed.task_timeouts_s, strict=True))
        run = Environment(s.rollout, env.tasks[PIZZA], env.tokenizer, ["pandas"], None, None, fleet,
                          tasks=env.tasks, timeouts_s=timeouts)  # fmt: skip
        prompt = PromptItem("scratch", [1])
        completion = Completion(
            np.array([1], np.int32), np.array([2], np.int32), np.zeros(1, np.float32), "", "stop", 0
        )
        samples = [Sample(i, prompt, completion, "", "", task=t) for i, t in enumerate((PIZZA, SPOOKY))]
        for sample in samples:
            sample.instrumented_code = "import time\ntime.sleep(3)\nprint('done')\n"
            run.queue(sample)
        results = {sample.task: sample.future.result(timeout=300) for sample in samples}
    finally:
        fleet.close()
    assert results[SPOOKY].status == Status.TIMEOUT
    assert results[PIZZA].status != Status.TIMEOUT and "done" in results[PIZZA].stdout_tail


def test_task_timeouts_must_match_the_tasks():
    cfg = base.apply_cpu(base.task_config(PIZZA, "paper"))
    cfg.tasks, cfg.task_timeouts_s = (PIZZA, SPOOKY), (60.0,)
    with pytest.raises(ConfigError, match="task_timeouts_s"):
        from_config(cfg)


def test_improve_draws_made_before_any_solution_are_owed_so_the_run_keeps_its_improve_share(raw_data_dir, tmp_path):
    """A run's first m·B prompts are drawn before any program has run, so their improve draws have nothing to show:
    they become scratch prompts and are owed to the next scratch draws once the buffer holds a solution. Over a
    scripted run (16 prompts on an empty buffer, then 8 per step for 20 steps) every improve draw of the stream
    becomes an improve prompt, and the share after the first steps is prompt.improve_fraction's within a few points.
    Without the debt (the fix of issue 46) the first 16 draws' improve share would be lost for good."""
    task = prepare(PIZZA, raw_data_dir / PIZZA, tmp_path / "prepared")
    cfg = base.apply_cpu(base.task_config(PIZZA, "paper"))
    cfg.workdir, cfg.prompt.max_prompt_tokens = str(tmp_path / "run"), 4096
    assert cfg.prompt.improve_fraction == 0.5
    s = from_config(cfg)
    tok = train_bpe_tokenizer(["import pandas as pd\nprint('x')"] * 4, 400, tmp_path / "tok")
    env = Environment(s.rollout, task, tok, ["pandas"], None, None, None, seed=s.seed)
    twin = PromptStream([PIZZA], [1.0], 0.5, seed=s.seed)  # the same stream's raw draws
    rng, buffer = np.random.default_rng(0), ImproveBuffer(8)
    first = env.prompts(16, buffer, rng)
    drawn = [k for _, k in twin.take(16)]
    assert all(i.kind == "scratch" for i in first) and env.stream.owed[PIZZA] == drawn.count("improve") > 0
    buffer.add(_solution(PIZZA), n_prints=1)
    later = []
    for _ in range(20):
        later += env.prompts(8, buffer, rng)
        drawn += [k for _, k in twin.take(8)]
    formed = [i.kind for i in first + later]
    assert env.stream.owed[PIZZA] == 0 and formed.count("improve") == drawn.count("improve")
    share = np.mean([i.kind == "improve" for i in later])
    assert abs(share - 0.5) < 0.1 and share > np.mean([k == "improve" for k in drawn[16:]])
    state = json.loads(json.dumps(env.stream.state_dict()))
    assert state["owed"] == {PIZZA: 0}
