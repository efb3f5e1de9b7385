"""The one episode driver: RL, evaluation and search all move their episodes through it.

An episode (env/episodes.py) is turns of sample -> run -> observe. The driver owns the part they share: it submits
a turn's program to the executor fleet, waits on the runs (`wait_for_runs`, the only wait on executor futures
outside executor/), finishes each run as it ends (graded and observed outside the sandbox, `Environment.finish`),
and knows which episodes go on (a turn with code, fewer than `turns` turns) and which have ended. It samples the next
turns of the episodes that go on when its user says so (`advance`: at once in RL, a round at a time in an evaluation),
and drops the episodes of groups its user gives up (a run that failed in the executor, a stale queued group).

What each user decides stays with it: RL what to train on and when to sample more, evaluation what to report, a
search policy which node to expand with which operator. Every call reports what happened as `Turn`s, in the order
the runs ended.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Literal

from mle_jax.env.episodes import Episode
from mle_jax.env.rollout import Environment, Sample

POLL_S = 0.5  # a blocking wait returns this often, so that its caller sees a stop request (Ctrl-C)


def wait_for_runs(futures: Collection[Future], timeout: float) -> set[Future]:
    """Blocks until one of `futures` (runs in an executor) is done, or `timeout` seconds pass -> those done."""
    if not futures:
        return set()
    done, _ = wait(list(futures), timeout=timeout, return_when=FIRST_COMPLETED)
    return done


@dataclass(frozen=True)
class Turn:
    """A turn that finished: `failed` (its run failed in the executor, not in the agent's code: its episode is over
    and RL drops its group), `continues` (its episode will be given another turn by `advance`) or `ended` (its
    episode is over)."""

    sample: Sample
    episode: Episode
    outcome: Literal["failed", "continues", "ended"]


class EpisodeDriver:
    """Episodes in flight on one environment (module doc). `turns`: the most turns an episode has."""

    def __init__(self, env: Environment, turns: int = 1):
        self.env, self.turns = env, turns
        self.in_flight: list[Sample] = []  # the running turn of each live episode, in submission order
        self.live: dict[int, Episode] = {}  # episodes with a turn running or about to be sampled, by episode uid
        self.ready: list[Sample] = []  # finished last turns of episodes that continue, waiting for `advance`

    def start(self, samples: Iterable[Sample]) -> tuple[list[Episode], list[Turn]]:
        """New episodes, one per sample (their first turns, sampled by the caller): their programs instrumented and
        submitted -> (the episodes, in the samples' order; the turns that ended at once: a response without code ends
        its episode)."""
        episodes = [Episode([s]) for s in samples]
        self.env.submit([e.last for e in episodes])
        return episodes, self._track(episodes)

    def advance(self, first_uid: int, key: Callable[[Sample], int] | None = None) -> tuple[list[Sample], list[Turn]]:
        """Samples the next turn of every episode in `ready` (one generate call, the current weights; uids from
        first_uid; in `ready`'s order, the order their runs ended in, or sorted by `key`) and submits them -> (the new
        samples, the turns that ended at once)."""
        lasts, self.ready = self.ready, []
        if not lasts:
            return [], []
        if key is not None:
            lasts = sorted(lasts, key=key)
        new = self.env.next_turns(lasts, first_uid)
        episodes = []
        for s in new:
            e = self.live[s.episode]
            e.turns.append(s)
            episodes.append(e)
        return new, self._track(episodes)

    def poll(self, timeout: float) -> list[Turn]:
        """Waits up to `timeout` s for runs in flight to end; finishes each that ended -> their turns, in the order the
        runs ended. An episode that continues joins `ready`."""
        done = wait_for_runs([s.future for s in self.in_flight if s.future is not None], timeout)
        if not done:
            return []
        turns, still = [], []
        for s in self.in_flight:
            if s.future not in done:
                still.append(s)
                continue
            self.env.finish(s, s.future.result())
            e = self.live[s.episode]
            if s.result.infra_failure:  # never continues: RL drops its group, an evaluation reports it
                turns.append(self._end(e, "failed"))
            elif e.continues(self.turns):
                self.ready.append(s)
                turns.append(Turn(s, e, "continues"))
            else:
                turns.append(self._end(e))
        self.in_flight = still
        return turns

    def run_out(
        self, on_turn: Callable[[Turn], None] | None = None, interrupted: Callable[[], None] | None = None
    ) -> None:
        """Polls until no run is in flight (a round of an evaluation or a search). on_turn(turn): each finished turn
        (a progress bar); interrupted(): called between waits, it raises to stop (Ctrl-C)."""
        while self.in_flight:
            turns = self.poll(POLL_S)
            if interrupted is not None:
                interrupted()
            for t in turns:
                if on_turn is not None:
                    on_turn(t)

    def drop(self, groups: Collection[int], cancel: bool = True) -> list[Sample]:
        """Gives up the live episodes of `groups`: their runs in flight leave (cancelled: a queued run never starts)
        and none of them gets another turn -> the samples in flight that left."""
        gone = [s for s in self.in_flight if s.group in groups]
        if cancel:
            for s in gone:
                if s.future is not None:
                    s.future.cancel()
        self.in_flight = [s for s in self.in_flight if s.group not in groups]
        self.ready = [s for s in self.ready if s.group not in groups]
        self.live = {uid: e for uid, e in self.live.items() if e.group not in groups}
        return gone

    def close(self) -> None:
        """Cancels the runs still queued; forgets every live episode."""
        for s in self.in_flight:
            if s.future is not None:
                s.future.cancel()
        self.in_flight, self.ready, self.live = [], [], {}

    def _track(self, episodes: list[Episode]) -> list[Turn]:
        """Each episode's newest turn: one that ended without a run ends its episode now; a running one is in flight."""
        ended = []
        for e in episodes:
            s = e.last
            if s.done:
                ended.append(self._end(e))
            else:
                self.live[e.uid] = e
                self.in_flight.append(s)
        return ended

    def _end(self, e: Episode, outcome: Literal["failed", "ended"] = "ended") -> Turn:
        e.ended = True
        self.live.pop(e.uid, None)
        return Turn(e.last, e, outcome)
