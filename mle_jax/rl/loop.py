"""The asynchronous RL loop (Algorithm 1): m·B samples in flight, update on the first B to finish.

It only wires the boxes: prompts and rollouts (rl/rollout.py), the sampler, the instrumenter,
the executor fleet, the learner (rl/learner.py), checkpoints and metrics. Samples still running
when a batch closes stay in flight and join a later batch with the policy version that produced
them; PPO's ratio against their stored behaviour logprobs corrects for the lag. Nothing is ever dropped
because its program ran long: that is exactly the bias the duration weights undo. With
`loop.max_version_lag` > 0 (off by default), a sample whose program is still *queued* (not yet running)
when the policy has moved on more than that many versions is taken back and its prompt sampled again
with the current policy (counted in `resampled_stale`); a run in progress or finished always trains.

With `sampler.group_size` n > 1 each prompt is sampled n times in one request, and the samples of a prompt form a
group (for the group objectives, whose advantages compare a sample with its group). An update trains on whole
groups only (B is a multiple of n), in the order the groups finished; a group is finished when all its members
are, so a group with one slow member waits for it. The stale re-sampling takes back whole groups (all members
still queued), and an executor failure of one member drops its group (a group cannot be completed without it).

With `agent.turns` K > 1 (env/episodes.py) a sample is one turn of an episode: when a turn's run returns, the
episode's next turn is sampled at once with the current weights (the observation of the run in its prompt), without
waiting for other episodes; m·B *episodes* are in flight and an update trains on the first B finished episodes (whole
groups of n), as learner rows (one per conversation, or one per turn). With "turn" credit (ML-Agent's step-wise RL) an
update trains on the first B finished *turns* instead (whole groups of n: the same turn of the episodes of one start
prompt, where a turn an episode did not reach is an inert row), so a turn never waits for its episode's later turns.
A killed run restarts its unfinished episodes.

Ctrl-C (under `infra.interrupt.stop_on_sigint`) stops the loop between two steps, the last one checkpointed, or
abandons a step still waiting for its runs (a resumed run samples its prompts again, as after a crash).

What becomes of every drawn sample (trained at a step, discarded with a reason, or redrawn after a resume) is appended
to <workdir>/ledger.jsonl (rl/ledger.py); bench/chaos.py counts lost and twice-trained samples from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mle_jax.env import rollout
from mle_jax.env.driver import POLL_S, EpisodeDriver, Turn
from mle_jax.env.episodes import Episode, episode_rows, inert_row, turn_group, turn_row
from mle_jax.env.improve_buffer import ImproveBuffer
from mle_jax.env.sample_texts import tensorboard_samples
from mle_jax.infra import interrupt
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import MetricsWriter, memory_breakdown, process_metrics
from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.hosts import BatchChannel
from mle_jax.rl.learner import Learner
from mle_jax.rl.ledger import LEDGER, Ledger
from mle_jax.rl.settings import LoopSettings
from mle_jax.rl.step_metrics import StepStats, episode_records, ratio, turn_metrics


class ExecutorDown(RuntimeError):
    """Every recent run failed for infrastructure reasons: the executors, not the agent, are broken."""


@dataclass
class LoopCounters:
    """Run-long totals, checkpointed with the loop state."""

    step: int = 0
    version: int = 0
    next_uid: int = 0
    sampled: int = 0
    resampled_stale: int = 0
    infra_failures: int = 0
    dropped_with_group: int = 0  # samples never trained on because a member of their group failed in the executor
    instrumented_lm: int = 0  # programs the frozen LM instrumented (accepted by verification)
    instrumented_fallback: int = 0  # programs the LM's output was rejected for: the AST fallback instrumented them
    instrumented_unparsed: int = 0  # programs that do not parse: no instrumenter can place a print in them
    update_s: float = 0.0
    wait_s: float = 0.0
    sample_s: float = 0.0  # sampling, and instrumenting and queueing what was sampled (instrument_s of it)
    instrument_s: float = 0.0  # Environment.submit of newly drawn samples: the instrumenter, then the fleet's queue
    exec_busy_s: float = 0.0
    wall_s: float = 0.0

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def instrument_shares(self) -> dict[str, float | None]:
        """lm and fallback: shares of the sampled programs that parse; unparsed: share of all sampled programs
        with code. None where there is nothing to divide."""
        parsed = self.instrumented_lm + self.instrumented_fallback
        return {
            "lm": ratio(self.instrumented_lm, parsed),
            "fallback": ratio(self.instrumented_fallback, parsed),
            "unparsed": ratio(self.instrumented_unparsed, parsed + self.instrumented_unparsed),
        }


class AsyncRLLoop:
    def __init__(
        self,
        settings: LoopSettings,
        env: rollout.Environment,
        learner: Learner,
        checkpointer: Checkpointer,
        writer: MetricsWriter,
        channel: BatchChannel | None = None,
    ):
        """channel: in a multi-process run, this (the leader's) loop sends each batch to the follower processes
        before the update they all take part in (rl/hosts.py)."""
        self.settings, self.env, self.learner = settings, env, learner
        self.channel = channel
        self.sampler, self.fleet = env.sampler, env.fleet
        self.checkpointer, self.writer = checkpointer, writer
        self.counters = LoopCounters()
        self.buffer = ImproveBuffer(settings.improve_buffer_size)
        self._drawn_kinds: list[str] = []  # the kinds of the prompts sampled since the last step's metrics
        self.rng = np.random.default_rng(settings.seed)
        self.pad_id = int(getattr(env.tokenizer, "pad_token_id", None) or 0)
        # submits, waits on and finishes every turn; holds the running turn of each live episode (env/driver.py)
        self.driver = EpisodeDriver(env, env.settings.agent.turns)
        self.last_used: list[rollout.Sample] = []  # the samples (every turn) of the latest update, for inspection
        # finished episodes in completion order (members of groups not yet finished too); one turn each by default
        self.finished: list[Episode] = []
        self.turns = env.settings.agent.turns
        # "turn" credit: a batch is the first B finished turns. The graded turns not yet trained, in completion order,
        # as (episode, turn, turn number); with groups (n > 1) a turn an ended episode did not reach is (episode, None,
        # k), an inert row that completes its group. An ended episode stays in `finished` until all its turns trained.
        self.per_turn = env.settings.agent.per_turn
        self.turn_queue: list[tuple[Episode, rollout.Sample | None, int]] = []
        self.infra_streak = 0  # executor failures in a row (reset by any run that was not one)
        self.requeued: list[rollout.PromptItem] = []  # prompts of stale queued groups, to sample again
        self.saved_step: int | None = None  # the newest step checkpointed (or resumed from)
        # what became of every drawn sample (rl/ledger.py): drawn, trained, discarded with a reason, resumed
        self.ledger = Ledger(writer.workdir / LEDGER)

    @property
    def in_flight(self) -> list[rollout.Sample]:
        """The running turn of each live episode (the driver's)."""
        return self.driver.in_flight

    @property
    def live(self) -> dict[int, Episode]:
        """Episodes with a turn running, by episode uid (the driver's)."""
        return self.driver.live

    # ---- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "counters": self.counters.state_dict(),
            "buffer": self.buffer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "prompt_stream": self.env.stream.state_dict(),  # a resumed run continues its (task, kind) stream
        }

    def load_state_dict(self, state: dict) -> None:
        self.counters = LoopCounters(**state["counters"])
        self.buffer = ImproveBuffer.from_state_dict(state["buffer"])
        self.rng.bit_generator.state = state["rng"]
        if "prompt_stream" in state:  # absent from checkpoints written before mixes of tasks
            self.env.stream.load_state_dict(state["prompt_stream"])

    # ---- the boxes, wired ------------------------------------------------------------------
    def _refill(self) -> None:
        """Samples prompts until m·B samples are in flight (finished-but-unused ones count), n samples per prompt;
        prompts taken back from stale queued groups are sampled again first."""
        n = self.settings.group_size
        target = self.settings.batch_size * self.settings.in_flight_multiplier
        groups = (target - len(self.in_flight) - len(self.finished)) // n
        if groups <= 0:
            return
        t0 = time.monotonic()
        again, self.requeued = self.requeued[:groups], self.requeued[groups:]
        prompts = again + self.env.prompts(groups - len(again), self.buffer, self.rng)
        self._drawn_kinds += [p.kind for p in prompts for _ in range(n)]
        samples = self.env.sample(prompts, self.counters.next_uid, n=n)
        self.ledger.drawn(s.uid for s in samples)
        self.counters.next_uid += len(samples)
        self.counters.sampled += len(samples)
        t1 = time.monotonic()
        _, ended = self.driver.start(samples)
        self.counters.instrument_s += time.monotonic() - t1
        self._started(samples, ended)
        self.counters.sample_s += time.monotonic() - t0

    def _started(self, samples: list[rollout.Sample], ended: list[Turn]) -> None:
        """Counts the instrumenter's path of each new turn; a turn without code ended its episode at once."""
        for s in samples:
            self.counters.instrumented_lm += s.instrument_path == "lm"
            self.counters.instrumented_fallback += s.instrument_path == "fallback"
            self.counters.instrumented_unparsed += s.instrument_path == "unparsed"
        for t in ended:
            self._turn_done(t.episode, t.sample)
            self._end(t.episode)

    def _next_turns(self) -> None:
        """Samples the next turn of the episodes whose turns just finished, with the current weights, without
        waiting for the other episodes, and queues their programs."""
        t0 = time.monotonic()
        samples, ended = self.driver.advance(self.counters.next_uid)
        self.ledger.drawn(s.uid for s in samples)
        self.counters.next_uid += len(samples)
        self.counters.sampled += len(samples)
        self._started(samples, ended)
        self.counters.sample_s += time.monotonic() - t0

    def _collect(self, block: bool) -> None:
        """Moves finished runs to `finished`, in completion order (the driver grades them outside the sandbox); the
        episodes that go on get their next turn."""
        broken = set()
        for t in self.driver.poll(POLL_S if block else 0):
            s = t.sample
            self.counters.exec_busy_s += s.duration_s
            if t.outcome == "failed":
                broken.add(s.group)
                self.ledger.discarded("infra_failure", [s.uid])
                self.ledger.discarded("dropped_with_group", [x.uid for x in t.episode.turns if x.uid != s.uid])
                self._infra_failure(s)
                continue
            self.infra_streak = 0
            self.buffer.add(self.env.previous(s), s.reward.n_prints)
            self._turn_done(t.episode, s)
            if t.outcome == "ended":
                self._end(t.episode)
        if broken:
            self._drop_groups(broken)
        if self.driver.ready:
            self._next_turns()

    def _turn_done(self, e: Episode, s: rollout.Sample) -> None:
        """A turn was graded (or ended without code): with "turn" credit it may train from now on."""
        if self.per_turn:
            self.turn_queue.append((e, s, s.turn))

    def _end(self, e: Episode) -> None:
        """No further turn of `e` will be sampled: it joins `finished`; with "turn" credit and groups, each turn it did
        not reach becomes an inert member of that turn's group (the driver has taken it out of `live`)."""
        e.ended = True
        self.finished.append(e)
        if self.per_turn and self.settings.group_size > 1:
            self.turn_queue += [(e, None, k) for k in range(len(e.turns) + 1, self.turns + 1)]

    def _drop_groups(self, groups: set[int]) -> None:
        """Drops the other members of groups one of whose runs failed in the executor: their queued runs are
        cancelled, running and finished ones are never trained on (an update trains on whole groups only)."""
        dropped = self.driver.drop(groups)  # cancelled: a queued run never starts
        dropped += [s for e in self.finished if e.group in groups for s in e.turns]
        self.finished = [e for e in self.finished if e.group not in groups]
        self.turn_queue = [x for x in self.turn_queue if x[0].group not in groups]
        self.counters.dropped_with_group += len(dropped)
        self.ledger.discarded("dropped_with_group", [s.uid for s in dropped])

    def _infra_failure(self, sample: rollout.Sample) -> None:
        """Counts an executor failure (never trained on); too many in a row stop the run."""
        self.counters.infra_failures += 1
        self.infra_streak += 1
        if self.infra_streak >= self.settings.max_consecutive_infra_failures:
            raise ExecutorDown(
                f"{self.infra_streak} runs in a row failed in the executor, not in the agent's code; last error: "
                f"{sample.result.stderr_tail.strip()[-300:]} (check the sandbox backend / Ray cluster)"
            )

    def _resample_stale_queued(self) -> None:
        """With loop.max_version_lag > 0: a group whose runs all still wait in the executor queue and whose samples
        are more than that many versions old is cancelled and its prompt sampled again. A group with a run in
        progress or finished stays whole."""
        lag = self.settings.max_version_lag
        if lag <= 0:
            return
        started = {e.group for e in self.finished} | {s.group for s in self.in_flight if s.turn > 1}
        members: dict[int, list[rollout.Sample]] = {}
        for s in self.in_flight:
            members.setdefault(s.group, []).append(s)
        taken = set()
        for group, runs in members.items():
            if group in started or self.counters.version - runs[0].version <= lag:
                continue
            if any(s.future is None or s.future.running() or s.future.done() for s in runs):
                continue
            cancelled = [s for s in runs if s.future.cancel()]  # cancel() succeeds only for a run not started
            if len(cancelled) < len(runs):  # a member started meanwhile: the group trains, the others queue again
                for s in cancelled:
                    self.env.queue(s)
                continue
            self.requeued.append(runs[0].prompt)  # the group's prompt (its members share it)
            self.ledger.discarded("resampled_stale", [s.uid for s in runs])
            self.counters.resampled_stale += len(runs)
            taken.add(group)
        self.driver.drop(taken, cancel=False)  # cancelled above

    def _finished_groups(self) -> list[list[Episode]]:
        """The groups all of whose n episodes have finished, in the order their last member finished."""
        n = self.settings.group_size
        members: dict[int, list[Episode]] = {}
        complete = []
        for e in self.finished:
            members.setdefault(e.group, []).append(e)
            if len(members[e.group]) == n:
                complete.append(members[e.group])
        return complete

    def _finished_turn_groups(self, inert: bool = False) -> list[list[tuple[Episode, rollout.Sample | None, int]]]:
        """With "turn" credit: the groups of turns (the same turn of the n episodes of one start prompt) all of whose
        members are graded or inert, in the order they completed; those with a turn to train, or (`inert`) those of
        inert members only (nothing to train)."""
        n = self.settings.group_size
        members: dict[int, list] = {}
        complete = []
        for entry in self.turn_queue:
            key = turn_group(entry[0].group, entry[2], self.turns)
            members.setdefault(key, []).append(entry)
            if len(members[key]) == n and any(s is not None for _, s, _ in members[key]) != inert:
                complete.append(members[key])
        return complete

    def _ready(self) -> bool:
        """Whether B samples (episodes, or turns with "turn" credit) are finished in whole groups."""
        n = self.settings.group_size
        groups = self._finished_turn_groups() if self.per_turn else self._finished_groups()
        return len(groups) * n >= self.settings.batch_size

    def _take_turns(self) -> tuple[RolloutBatch, list[rollout.Sample], list[Episode], set[int]]:
        """ "turn" credit: the first B finished turns (whole groups) as a batch of B rows, those turns, the episodes
        whose last turn is among them (they leave `finished`), and the uids of the trained turns."""
        n = self.settings.group_size
        entries = [x for g in self._finished_turn_groups()[: self.settings.batch_size // n] for x in g]
        taken = {id(x) for x in entries} | {id(x) for g in self._finished_turn_groups(inert=True) for x in g}
        self.turn_queue = [x for x in self.turn_queue if id(x) not in taken]
        left = {x[0].uid for x in self.turn_queue if x[1] is not None}  # ended episodes with a turn still to train
        done = [e for e in self.finished if e.uid not in left]
        self.finished = [e for e in self.finished if e.uid in left]
        rows = [
            inert_row()
            if s is None
            else turn_row(s, float(s.reward.total), s.duration_s, turn_group(e.group, k, self.turns))
            for e, s, k in entries
        ]
        batch = RolloutBatch.from_rows(rows, pad_to=self.env.settings.max_sequence_tokens, pad_id=self.pad_id)
        turns = [s for _, s, _ in entries if s is not None]
        return batch, turns, done, {s.uid for s in turns}

    def _batch(self, episodes: list[Episode]) -> RolloutBatch:
        """The learner's rows of the episodes (env/episodes.py): one per episode of one turn (the paper's samples)
        or of a conversation with "episode" credit, else one per turn. Each row's Δt is floored by the learner
        (ppo.duration_weights); its task gives per-task advantage and duration scales."""
        agent = self.env.settings.agent
        rows = [r for e in episodes for r in episode_rows(e, agent)]
        return RolloutBatch.from_rows(rows, pad_to=self.env.settings.max_sequence_tokens, pad_id=self.pad_id)

    def step(self) -> dict[str, float]:
        """One update: fill the pipeline, wait for B / n finished groups (B samples), train, sync, checkpoint."""
        B, n = self.settings.batch_size, self.settings.group_size
        t_start = time.monotonic()
        self._collect(block=False)
        self._resample_stale_queued()
        self._refill()
        t0 = time.monotonic()
        while not self._ready():
            if interrupt.requested():  # the step is abandoned; a resumed run samples its prompts again
                last = "none yet" if self.saved_step is None else f"step {self.saved_step}"
                raise interrupt.Interrupted(
                    f"stopped in RL step {self.counters.step + 1} of {self.settings.steps}, before its update "
                    f"(last checkpoint: {last})"
                )
            self._collect(block=True)
            self._resample_stale_queued()
            if len(self.finished) + len(self.in_flight) < B:  # re-sampled prompts or infra failures left a hole
                self._refill()
        self._collect(block=False)
        self.counters.wait_s += time.monotonic() - t0
        only = None
        if self.per_turn:  # the first B finished turns, each its own sample
            batch, used, episodes, only = self._take_turns()
            self.last_used = used
        else:
            episodes = [e for group in self._finished_groups()[: B // n] for e in group]
            taken = {e.uid for e in episodes}
            self.finished = [e for e in self.finished if e.uid not in taken]
            used = [e.submitted() for e in episodes]  # what each episode hands in (its one sample, with one turn)
            self.last_used = [s for e in episodes for s in e.turns]
            batch = self._batch(episodes)
        mix = len(self.env.tasks) > 1
        stats = StepStats(
            used,
            tuple(self.env.tasks) if mix else (),
            None if mix else self.env.task.lower_is_better,
            self.env.settings.reward.failure,
        )

        t0 = time.monotonic()
        if self.channel is not None:
            self.channel.publish(self.counters.step + 1, batch, {"version": self.counters.version + 1})
        learner_metrics = self.learner.update(batch)
        self.counters.update_s += time.monotonic() - t0
        self.counters.step += 1
        self.ledger.trained(self.counters.step, [s.uid for s in self.last_used])
        self.counters.version += 1
        saved = False
        if self.counters.step % self.settings.sync_every == 0:
            saved = self.settings.sync_source == "orbax"
            if saved:
                self.save()
            self.sync()
        self.counters.wall_s += time.monotonic() - t_start

        m = stats.metrics()
        if self.turns > 1:
            m.update(turn_metrics(episodes, self.turns, self.counters.version, used if self.per_turn else None))
        m.update({f"learner/{k}": v for k, v in learner_metrics.items()})
        c = self.counters
        slots = max(1, getattr(self.fleet, "n_slots", 1))
        m.update(
            {
                "version_lag/mean": float(np.mean([c.version - 1 - s.version for s in used]))
                if self.per_turn
                else float(np.mean([c.version - 1 - e.first.version for e in episodes])),
                "resampled_stale": c.resampled_stale,
                "infra_failures": c.infra_failures,
                "dropped_with_group": c.dropped_with_group,
                "in_flight": len(self.in_flight),
                "learner_idle_fraction": 1.0 - c.update_s / max(c.wall_s, 1e-9),
                "executor_utilization": min(1.0, c.exec_busy_s / max(c.wall_s * slots, 1e-9)),
                "time/wait_s": c.wait_s,
                "time/update_s": c.update_s,
                "time/sample_s": c.sample_s,
                "time/instrument_s": c.instrument_s,
                "time/exec_busy_s": c.exec_busy_s,
                # of the samples drawn since the last step: improve prompts (prompt.improve_fraction, once owed
                # draws are settled; env/task_mix.PromptStream)
                "prompt/improve_share_drawn": float(np.mean([k == "improve" for k in self._drawn_kinds]))
                if self._drawn_kinds
                else None,
            }
            | process_metrics()
            | memory_breakdown(self.learner.memory_parts() | self.env.memory_parts())
        )
        self.writer.write(c.step, m)
        self._drawn_kinds = []
        if self.per_turn:  # the trained turns, with their episodes (ended or not)
            episodes = list({id(e): e for e in [*episodes, *self.finished, *self.live.values()]}.values())
        records = episode_records(episodes, c.version - 1, self.env, self.writer.output_chars, only)
        self.writer.write_samples(c.step, records, texts=rollout.TEXT_FIELDS)
        self.writer.write_texts(c.step, tensorboard_samples(records))  # the best, the worst, a failure
        if c.step % self.settings.checkpoint_every == 0 and not saved:
            self.save()
        return m

    def save(self) -> None:
        self.learner.save(self.checkpointer, self.counters.step, loop=self.state_dict())
        self.saved_step = self.counters.step

    def sync(self) -> None:
        """The policy to the sampler: exported as HF safetensors, or (sync_source "orbax") the checkpoint of this
        step, once written, loaded by the sampler itself."""
        c = self.counters
        if self.settings.sync_source == "orbax":
            self.checkpointer.wait()
            self.sampler.sync(self.checkpointer.item_dir(c.step, "learner"), c.version)
        else:
            self.sampler.sync(self.learner.policy_state(), c.version)

    def restore(self) -> bool:
        """Resumes from the latest checkpoint, if any. In-flight samples of the dead run are re-sampled."""
        found = self.learner.restore_latest(self.checkpointer)
        if found is None:
            return False
        self.load_state_dict(found["loop"])
        self.saved_step = self.counters.step
        self.ledger.resumed(self.counters.step, self.counters.next_uid)
        self.sync()
        self.writer.truncate_after(self.counters.step)
        return True

    def run(self, steps: int) -> list[dict[str, float]]:
        history = []
        with Progress(
            TextColumn("[bold]RL"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
        ) as bar:
            job = bar.add_task("rl", total=steps, completed=self.counters.step, status="")
            while self.counters.step < steps:
                self._stop_if_requested(steps)
                m = self.step()
                history.append(m)
                bar.update(
                    job,
                    completed=self.counters.step,
                    status=(
                        f"reward {m['reward/mean']:.2f}/{m['reward/max']:.2f}  valid {m['valid_fraction']:.0%}  "
                        f"Δt {m['duration_s/mean']:.1f}s  in flight {m['in_flight']}"
                    ),
                )
        return history

    def _stop_if_requested(self, steps: int) -> None:
        """Between two steps, after Ctrl-C: checkpoints the last finished step if its cadence did not, then stops."""
        if not interrupt.requested():
            return
        step = self.counters.step
        if step > 0 and self.saved_step != step:
            self.save()
        saved = f"checkpoint {step} saved" if step > 0 else "no checkpoint yet"
        raise interrupt.Interrupted(f"stopped after RL step {step} of {steps} ({saved})")

    def close(self) -> None:
        """Cancels queued runs and waits for checkpoint writes in flight (orbax saves asynchronously); the samples
        not trained are discarded in the ledger ("run_ended")."""
        left = [s.uid for s in self.in_flight] + [s.uid for e in [*self.finished, *self.live.values()] for s in e.turns]
        try:
            self.ledger.discarded("run_ended", sorted(set(left)))
        except OSError as e:  # a full disk: the run's own error is the one to report
            print(f"ledger not written ({e}): {len(left)} samples left untrained")
        self.driver.close()
        self.checkpointer.close()
        self.writer.close()
