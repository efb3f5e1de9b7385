"""The `loop` section of the run config as typed settings, apart from the loop itself so that reading a config (the
launcher, the planner) loads no RL loop."""

from __future__ import annotations

from dataclasses import dataclass

SYNC_SOURCES = ("hf", "orbax")


@dataclass(frozen=True)
class LoopSettings:
    """The `loop` section of the run config, with the sync and checkpoint cadence and the seed."""

    batch_size: int = 128  # B: samples per update
    group_size: int = 1  # n: samples of each prompt, sampled together; an update trains on B / n whole groups
    in_flight_multiplier: int = 2  # m: m*B samples kept in flight
    max_version_lag: int = 0  # > 0: re-sample prompts whose programs still wait in the queue after this many versions
    steps: int = 100
    improve_buffer_size: int = 256
    max_consecutive_infra_failures: int = 32  # this many executor failures in a row stop the run
    sync_every: int = 1  # sync weights to the sampler every k learner steps
    # "hf": export the policy as HF safetensors for the sampler; "orbax": the sampler loads the learner's own
    # checkpoint of that step (saved at every sync; vLLM only; BUILD.md "Weight sync at 3B scale")
    sync_source: str = "hf"
    checkpoint_every: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"loop.steps must be >= 0 (0: no RL, the warm-started policy), got {self.steps}")
        if self.batch_size < 1 or self.in_flight_multiplier < 1:
            raise ValueError(
                f"loop.batch_size and loop.in_flight_multiplier must be >= 1, got {self.batch_size}, "
                f"{self.in_flight_multiplier}"
            )
        if self.group_size < 1:
            raise ValueError(f"sampler.group_size must be >= 1, got {self.group_size}")
        if self.batch_size % self.group_size:
            raise ValueError(
                f"loop.batch_size B={self.batch_size} is not a multiple of sampler.group_size n={self.group_size}: "
                f"an update trains on whole groups (pick n dividing B)"
            )
        if self.sync_source not in SYNC_SOURCES:
            raise ValueError(f"sampler.sync_source must be one of {SYNC_SOURCES}, got {self.sync_source!r}")
        if self.sync_every < 1 or self.checkpoint_every < 1 or self.max_consecutive_infra_failures < 1:
            raise ValueError(
                "sampler.sync_every, checkpoint.every and loop.max_consecutive_infra_failures must be >= 1"
            )
