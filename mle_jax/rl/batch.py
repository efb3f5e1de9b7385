"""RolloutBatch: what the loop hands the learner (numpy, host side), with validation and padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the planner packs batches without loading the environment
    from mle_jax.env.episodes import Row

_TOKEN_FIELDS = ("tokens", "attention_mask", "response_mask", "behaviour_logprobs")
_SAMPLE_FIELDS = ("rewards", "durations_s", "versions", "group_ids", "task_ids")


@dataclass
class RolloutBatch:
    """B finished samples, prompt + response per row, right-padded to T.

    tokens:             [B, T] int32, prompt then response then padding.
    attention_mask:     [B, T] int32, 1 on prompt and response tokens, 0 on padding.
    response_mask:      [B, T] int32, 1 on the policy's tokens only: one span after the prompt, or (an episode's
                        conversation, env/episodes.py) one span per response with the observations between at 0.
    behaviour_logprobs: [B, T] float32, logprob of tokens[b, t] under the policy that sampled it;
                        0 outside the response.
    rewards:            [B] float32, scalar reward of each sample.
    durations_s:        [B] float32, Δt: the sample's program run time (the duration weight's input).
    versions:           [B] int32, policy version that produced the sample.
    group_ids:          [B] int32, the group of each sample: the samples of one prompt, sampled together
                        (sampler.group_size); any values, not necessarily contiguous. Default: every sample
                        its own group, arange(B).
    task_ids:           [B] int32, the task each sample answers (a run may mix several tasks, config.tasks); any
                        values: the update whitens advantages and scales duration weights within each task.
                        Default: one task, zeros(B).
    """

    tokens: np.ndarray
    attention_mask: np.ndarray
    response_mask: np.ndarray
    behaviour_logprobs: np.ndarray
    rewards: np.ndarray
    durations_s: np.ndarray
    versions: np.ndarray
    group_ids: np.ndarray | None = None
    task_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, np.int32)
        self.attention_mask = np.asarray(self.attention_mask, np.int32)
        self.response_mask = np.asarray(self.response_mask, np.int32)
        self.behaviour_logprobs = np.asarray(self.behaviour_logprobs, np.float32)
        self.rewards = np.asarray(self.rewards, np.float32)
        self.durations_s = np.asarray(self.durations_s, np.float32)
        self.versions = np.asarray(self.versions, np.int32)
        if self.group_ids is None:
            self.group_ids = np.arange(self.tokens.shape[0] if self.tokens.ndim else 0, dtype=np.int32)
        self.group_ids = np.asarray(self.group_ids, np.int32)
        if self.task_ids is None:
            self.task_ids = np.zeros(self.tokens.shape[0] if self.tokens.ndim else 0, dtype=np.int32)
        self.task_ids = np.asarray(self.task_ids, np.int32)
        self.validate()

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        if self.tokens.ndim != 2:
            raise ValueError(f"tokens must be [B, T], got shape {self.tokens.shape}")
        shape = self.tokens.shape
        for name in _TOKEN_FIELDS:
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} must have the tokens' shape {shape}, got {getattr(self, name).shape}")
        for name in _SAMPLE_FIELDS:
            if getattr(self, name).shape != (shape[0],):
                raise ValueError(f"{name} must be [B] = ({shape[0]},), got {getattr(self, name).shape}")
        for name in ("attention_mask", "response_mask"):
            if not np.isin(getattr(self, name), (0, 1)).all():
                raise ValueError(f"{name} must hold only 0 and 1")
        if np.any(self.response_mask > self.attention_mask):
            raise ValueError("response_mask is 1 where attention_mask is 0 (response tokens must be attended)")
        if np.any(self.response_mask[:, 0] > 0):
            raise ValueError("a response cannot start at position 0: every row needs at least one prompt token")
        if np.any(np.diff(self.attention_mask, axis=1) == 1):
            raise ValueError("attention_mask must be right-padded (ones then zeros)")
        if np.any(self.behaviour_logprobs[self.response_mask == 0] != 0):
            raise ValueError("behaviour_logprobs must be 0 outside the response")
        if np.any(self.behaviour_logprobs > 1e-4) or not np.all(np.isfinite(self.behaviour_logprobs)):
            raise ValueError("behaviour_logprobs must be finite log-probabilities (<= 0)")
        if not np.all(np.isfinite(self.rewards)):
            raise ValueError("rewards must be finite")
        if not np.all(np.isfinite(self.durations_s)) or np.any(self.durations_s < 0):
            raise ValueError("durations_s must be finite and >= 0")

    @classmethod
    def from_sequences(
        cls,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        logprobs: Sequence[Sequence[float]],
        rewards: Sequence[float],
        durations_s: Sequence[float],
        versions: Sequence[int],
        pad_to: int | None = None,
        pad_id: int = 0,
        group_ids: Sequence[int] | None = None,
        task_ids: Sequence[int] | None = None,
    ) -> RolloutBatch:
        """Pack ragged prompts/responses (and the sampler's per-response-token logprobs) into a batch.

        pad_to: T (default: the longest prompt + response). Rows longer than pad_to raise.
        group_ids: [B] (default: every sample its own group). task_ids: [B] (default: one task).
        """
        n = len(prompt_ids)
        for name, seq in (
            ("response_ids", response_ids),
            ("logprobs", logprobs),
            ("rewards", rewards),
            ("durations_s", durations_s),
            ("versions", versions),
            ("group_ids", range(n) if group_ids is None else group_ids),
            ("task_ids", range(n) if task_ids is None else task_ids),
        ):
            if len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} entries, prompt_ids has {n}")
        if n == 0:
            raise ValueError("from_sequences needs at least one sample")
        lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
        t = max(lengths) if pad_to is None else int(pad_to)
        if max(lengths) > t:
            raise ValueError(f"a sample has {max(lengths)} tokens, more than pad_to={t}")
        tokens = np.full((n, t), pad_id, np.int32)
        attn = np.zeros((n, t), np.int32)
        resp = np.zeros((n, t), np.int32)
        lps = np.zeros((n, t), np.float32)
        for i, (p, r, lp) in enumerate(zip(prompt_ids, response_ids, logprobs, strict=True)):
            if len(p) == 0:
                raise ValueError(f"sample {i} has an empty prompt")
            if len(lp) != len(r):
                raise ValueError(f"sample {i}: {len(lp)} logprobs for {len(r)} response tokens")
            lp_, lr = len(p), len(r)
            tokens[i, :lp_] = np.asarray(p, np.int32)
            tokens[i, lp_ : lp_ + lr] = np.asarray(r, np.int32)
            attn[i, : lp_ + lr] = 1
            resp[i, lp_ : lp_ + lr] = 1
            lps[i, lp_ : lp_ + lr] = np.asarray(lp, np.float32)
        return cls(
            tokens,
            attn,
            resp,
            lps,
            np.asarray(rewards),
            np.asarray(durations_s),
            np.asarray(versions),
            None if group_ids is None else np.asarray(group_ids),
            None if task_ids is None else np.asarray(task_ids),
        )

    @classmethod
    def from_rows(cls, rows: Sequence[Row], pad_to: int | None = None, pad_id: int = 0) -> RolloutBatch:
        """Pack episode rows (env/episodes.py: a prompt, then responses with their behaviour logprobs and observations
        without) into a batch: response_mask and behaviour_logprobs on the responses only. Inert rows (no segment)
        get the batch's oldest version, their own group and task, no policy token.

        pad_to: T (default: the longest row). Rows longer than pad_to raise."""
        if not rows:
            raise ValueError("from_rows needs at least one row")
        lengths = [len(r.prompt_ids) + sum(len(ids) for ids, _ in r.segments) for r in rows]
        t = max(lengths) if pad_to is None else int(pad_to)
        if max(lengths) > t:
            raise ValueError(f"a row has {max(lengths)} tokens, more than pad_to={t}")
        n = len(rows)
        tokens = np.full((n, t), pad_id, np.int32)
        attn, resp, lps = np.zeros((n, t), np.int32), np.zeros((n, t), np.int32), np.zeros((n, t), np.float32)
        real = [r.version for r in rows if r.segments]
        oldest = min(real) if real else 0
        groups, tasks = [], []
        for i, r in enumerate(rows):
            if not r.prompt_ids:
                raise ValueError(f"row {i} has an empty prompt")
            at = len(r.prompt_ids)
            tokens[i, :at] = np.asarray(r.prompt_ids, np.int32)
            for ids, lp in r.segments:
                tokens[i, at : at + len(ids)] = np.asarray(ids, np.int32)
                if lp is not None:
                    if len(lp) != len(ids):
                        raise ValueError(f"row {i}: {len(lp)} logprobs for {len(ids)} response tokens")
                    resp[i, at : at + len(ids)] = 1
                    lps[i, at : at + len(ids)] = np.asarray(lp, np.float32)
                at += len(ids)
            attn[i, :at] = 1
            groups.append(r.group if r.segments else -1 - i)
            tasks.append(r.task)
        return cls(
            tokens,
            attn,
            resp,
            lps,
            np.asarray([r.reward for r in rows]),
            np.asarray([r.duration_s for r in rows]),
            np.asarray([r.version if r.segments else oldest for r in rows]),
            np.asarray(groups),
            np.asarray(cls.task_indices(tasks)),
        )

    @classmethod
    def random(cls, b: int, p: int, r: int, vocab: int, seed: int = 0, group: int = 1) -> RolloutBatch:
        """b random samples of p prompt and r response tokens, every position real (the costliest batch of that
        shape, for benchmarks), in groups of `group` consecutive samples with rewards of some spread."""
        rng = np.random.default_rng(seed)
        return cls.from_sequences(
            [rng.integers(1, vocab, size=p).tolist() for _ in range(b)],
            [rng.integers(1, vocab, size=r).tolist() for _ in range(b)],
            [(-rng.uniform(1.0, 8.0, size=r)).tolist() for _ in range(b)],
            rng.normal(size=b).tolist(),
            rng.uniform(1.0, 60.0, size=b).tolist(),
            [0] * b,
            group_ids=[i // group for i in range(b)],
        )

    @staticmethod
    def task_indices(tasks: Sequence[str]) -> list[int]:
        """[B] task names -> [B] small ints in order of first appearance (["leaf", "pizza", "leaf"] -> [0, 1, 0]):
        task_ids for `from_sequences` (the update compares them only for equality)."""
        index: dict[str, int] = {}
        return [index.setdefault(t, len(index)) for t in tasks]

    def pad_to(self, seq_len: int, pad_id: int = 0) -> RolloutBatch:
        """Right-pad T to `seq_len` (e.g. a fixed bucket, so jit compiles once per bucket)."""
        t = int(seq_len)
        if t < self.seq_len:
            raise ValueError(f"cannot pad T={self.seq_len} down to {t}")
        extra = t - self.seq_len

        def pad(x: np.ndarray, value: float = 0) -> np.ndarray:
            return np.pad(x, ((0, 0), (0, extra)), constant_values=value)

        return RolloutBatch(
            pad(self.tokens, pad_id),
            pad(self.attention_mask),
            pad(self.response_mask),
            pad(self.behaviour_logprobs),
            self.rewards,
            self.durations_s,
            self.versions,
            self.group_ids,
            self.task_ids,
        )

    def select(self, index: np.ndarray | Sequence[int] | slice) -> RolloutBatch:
        """Rows `index` as a new batch."""
        return RolloutBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def concat(batches: Sequence[RolloutBatch], pad_id: int = 0) -> RolloutBatch:
        """Stack batches along B, padding all to the longest T."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        t = max(b.seq_len for b in batches)
        padded = [b.pad_to(t, pad_id=pad_id) for b in batches]
        return RolloutBatch(
            **{f.name: np.concatenate([getattr(b, f.name) for b in padded]) for f in fields(RolloutBatch)}
        )

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
