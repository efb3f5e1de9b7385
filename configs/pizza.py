"""random-acts-of-pizza. `pizza.py` = the paper's setup; `pizza.py:cpu` = the embedded CPU run."""

from __future__ import annotations

import ml_collections

from configs import base


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
    c = base.get_config()
    c.task.id = "random-acts-of-pizza"
    c.workdir = "runs/pizza"
    if arg == "paper":
        return c
    if arg == "cpu":  # same code path, small settings: done in minutes on 2 cores
        c.workdir = "runs/pizza-cpu"
        c.model = base.tiny_model()
        c.model.vocab_size = 2048  # the task BPE saturates below this
        c.sampler.backend = "jax"
        c.sampler.max_tokens = 320  # warm-start programs are ~135 tokens in the task tokenizer
        c.prompt.max_prompt_tokens = 768
        c.instrument.mode = "ast"
        c.executor.backend = "bwrap"
        c.executor.slots = 2
        c.executor.timeout_s = 120.0
        c.executor.memory_mb = 4096
        c.executor.cpus = 1
        c.loop.batch_size = 8
        c.loop.in_flight_multiplier = 2
        c.loop.steps = 4
        c.ppo.mini_batch_size = 8
        c.ppo.micro_batch_size = 4
        c.optim.actor_lr = 1e-4
        c.optim.critic_lr = 1e-4
        c.warmstart.enabled = True
        c.warmstart.corpus_size = 64
        c.warmstart.steps = 200
        c.warmstart.lr = 3e-3
        c.warmstart.batch_size = 8
        c.warmstart.max_response_tokens = 320
        c.eval.samples = 16
        c.mesh.fsdp = 1
        return c
    raise ValueError(f"configs/pizza.py: unknown arg {arg!r}; use 'paper' or 'cpu'")
