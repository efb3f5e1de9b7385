"""The plan's memory for the embedded CPU run against the memory the run's learner and sampler actually take.

    python bench/plan_memory.py                      # configs/pizza.py:cpu on this machine's one CPU device

Builds the learner and the JAX sampler as the run does (random weights of the config's shape), runs one update
on the run's largest batch, 8 x (768 prompt + 320 response, padded to 1152) tokens, and one generation of the
batch, and reads the process's peak resident memory (VmHWM) before and after; then plans `configs/pizza.py:cpu`
on the same CPU device (`mle_jax.planner.plan.make_plan`: the compiled PPO update at that shape and the JAX
sampler's decode step). Prints both and their ratio (measured growth / planned total).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
from absl import app, logging
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs import pizza  # noqa: E402
from mle_jax.models.qwen2 import Qwen2ForCausalLM  # noqa: E402
from mle_jax.planner.plan import make_plan  # noqa: E402
from mle_jax.planner.programs import model_config  # noqa: E402
from mle_jax.planner.targets import Target  # noqa: E402
from mle_jax.rl.batch import RolloutBatch  # noqa: E402
from mle_jax.run.builders import local_sampler, make_learner  # noqa: E402
from mle_jax.run.settings import from_config  # noqa: E402

MIB = 1024**2


def peak_rss_bytes() -> int:
    """VmHWM: the most resident memory this process has held so far."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    s = from_config(pizza.get_config("cpu"))
    b, prompt = s.loop.batch_size, s.rollout.prompt.max_prompt_tokens
    t = prompt + s.rollout.sampling.max_tokens
    t += -t % s.learner.ppo.seq_bucket  # the learner pads to its bucket; the plan plans the same shape

    cfg = model_config(s)
    before = peak_rss_bytes()
    policy = Qwen2ForCausalLM(cfg, nnx.Rngs(s.seed), dtype=s.model.compute_dtype)
    learner = make_learner(s, policy)
    sampler = local_sampler(s.sampler)(policy, None, eos_ids=[], min_new_bucket=s.rollout.sampling.max_tokens)
    rng = np.random.default_rng(0)
    batch = RolloutBatch.from_sequences(
        [rng.integers(1, cfg.vocab_size, size=prompt).tolist() for _ in range(b)],
        [rng.integers(1, cfg.vocab_size, size=t - prompt).tolist() for _ in range(b)],
        [(-rng.uniform(1.0, 8.0, size=t - prompt)).tolist() for _ in range(b)],
        rng.normal(size=b).tolist(),
        rng.uniform(1.0, 60.0, size=b).tolist(),
        [0] * b,
    )
    learner.update(batch)
    sampler.generate([list(range(1, prompt)) for _ in range(b)], temperature=0.7,
                     max_tokens=s.rollout.sampling.max_tokens, seed=0)  # fmt: skip
    grown = peak_rss_bytes() - before
    del learner, sampler, policy
    target = Target(jax.devices()[:1], "cpu", "cpu", "xla-cpu-compile", 0.0, 0.0, 0.0)
    plan = make_plan(s, target, device_memory_gib=24.0)  # after the measurement: its compile takes memory
    d = plan["per_device"]
    planned = d["total_gib"] * 1024**3
    assert (plan["config"]["batch"], plan["config"]["seq_len"]) == (b, t)

    print(f"configs/pizza.py:cpu on 1 CPU device, batch {b} x {t} tokens, decode {b} x {t - prompt} new tokens")
    temps = d["xla"]["temporaries_gib"] * 1024
    print(f"plan:     learner {d['learner_gib'] * 1024:8.1f} MiB (XLA temporaries {temps:.1f})"
          f" + sampler {d['sampler_gib'] * 1024:6.1f} MiB = {planned / MIB:8.1f} MiB")  # fmt: skip
    print(f"measured: peak resident memory grew by {grown / MIB:8.1f} MiB building the learner and sampler, "
          f"one update and one generation (from {before / MIB:.0f} MiB after start-up)")  # fmt: skip
    print(f"ratio measured / planned: {grown / planned:.2f}")


if __name__ == "__main__":
    app.run(main)
