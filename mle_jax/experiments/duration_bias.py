"""Duration bias in asynchronous RL, and its fix (paper §3.1, Fig. 2 / Fig. 8), simulated.

A task has solution kinds with different rewards and run times, e.g. "fail" (crashes at once,
-10 + partial credit), "fast" (logistic regression: quick, worse) and "slow" (gradient boosting:
long, better). A softmax policy with one logit per kind is trained with the project's PPO loss
(`mle_jax.rl.core`, `mle_jax.rl.duration`) through asynchronous batching on a simulated clock: m·B samples are in
flight, each tagged with the policy version that sampled it and its behaviour logprob; the learner takes the
first B to finish, updates, and refills the pool from the new policy. Fast kinds return more often,
so without duration weights they receive more updates and the policy drifts to them; weighting each
sample by Δt / mean Δt (mode batch_mean) removes the frequency bias and the policy moves to the
better kind.

What drives the bias here: while failures dominate, the critic's value sits below both working kinds, so
both get positive advantages and the fast kind, arriving ~Δt_slow/Δt_fast times as often, takes most
of the probability; afterwards the better kind's rare samples pull the policy back only slowly (with a
smaller --lr, e.g. 0.2, the plain arm peaks on "fast" around step 40 and recovers by step ~150). With
weights, the expected update is π_k (R_k - mean R) whatever the arrival rates and baseline.

    python -m mle_jax.experiments.duration_bias --steps 300 --out duration_bias.png \
        [--results docs/results/duration_bias.jsonl]   (appends the settings and final policies, stamped)
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from matplotlib.figure import Figure
from rich.progress import Progress

from mle_jax.reporting import provenance
from mle_jax.rl import core, duration
from mle_jax.rl.batch import RolloutBatch


@dataclass(frozen=True)
class Kind:
    """One family of solutions: mean reward and mean run time (seconds), each with noise."""

    name: str
    reward: float
    duration_s: float


@dataclass(frozen=True)
class SimConfig:
    kinds: tuple[Kind, ...]
    init_logits: tuple[float, ...]
    steps: int = 300
    batch_size: int = 32
    in_flight_multiplier: int = 4
    max_version_lag: int = 0  # 0: keep every sample however stale
    reward_noise: float = 0.05  # std of Gaussian noise on a kind's reward
    duration_noise: float = 0.3  # sigma of the log-normal noise on a kind's run time
    lr: float = 1.0
    # Algorithm 1's plain gradient step. Adam normalises each logit's step size, which with one logit per
    # kind hides exactly the gradient magnitudes the duration bias is about.
    optimizer: str = "sgd"  # "sgd" | "adam"
    epochs: int = 2
    clip_ratio: float = 0.2
    value_clip: float = 0.5
    entropy_coef: float = 0.001
    kl_coef: float = 0.001
    critic_lr: float = 0.1
    # Off by default: batch whitening divides by the batch's reward spread, which becomes tiny once
    # failures are gone, and so rescales the rare slow samples' updates (a learning-rate effect).
    whiten_advantages: bool = False
    seed: int = 0


@dataclass(order=True)
class InFlight:
    """A sample being executed: sorted by finish time (then submission order) in the event queue."""

    finish_s: float
    seq: int
    kind: int = field(compare=False)
    logprob: float = field(compare=False)
    reward: float = field(compare=False)
    duration_s: float = field(compare=False)
    version: int = field(compare=False)


@dataclass
class History:
    probs: list[np.ndarray] = field(default_factory=list)  # [K] policy probabilities after each step
    batch_mean_duration: list[float] = field(default_factory=list)
    policy_mean_duration: list[float] = field(default_factory=list)  # Σ π_k E[Δt_k]
    clock_s: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)


class SimulatedFleet:
    """The asynchronous batching of the RL loop on a simulated clock: first finished, first batched."""

    def __init__(self, kinds: Sequence[Kind], reward_noise: float, duration_noise: float, rng: np.random.Generator):
        self.kinds = list(kinds)
        self.reward_noise = reward_noise
        self.duration_noise = duration_noise
        self.rng = rng
        self.clock_s = 0.0
        self._queue: list[InFlight] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, logits: np.ndarray, version: int, n: int) -> None:
        """Sample n solutions from softmax(logits) now; each finishes after its noisy run time."""
        logp = logits - np.logaddexp.reduce(logits)
        for k in self.rng.choice(len(self.kinds), size=n, p=np.exp(logp)):
            kind = self.kinds[k]
            dur = kind.duration_s * float(
                np.exp(self.duration_noise * self.rng.standard_normal() - 0.5 * self.duration_noise**2)
            )
            reward = kind.reward + self.reward_noise * float(self.rng.standard_normal())
            heapq.heappush(
                self._queue,
                InFlight(self.clock_s + dur, next(self._seq), int(k), float(logp[k]), reward, dur, version),
            )

    def next_batch(self, batch_size: int, version: int, max_version_lag: int) -> list[InFlight]:
        """Advance the clock until `batch_size` samples have finished (dropping ones too stale)."""
        done: list[InFlight] = []
        while len(done) < batch_size:
            if not self._queue:
                raise RuntimeError("fleet ran dry: every in-flight sample was dropped as stale")
            s = heapq.heappop(self._queue)
            self.clock_s = s.finish_s
            if max_version_lag and version - s.version > max_version_lag:
                continue
            done.append(s)
        return done


def to_rollout_batch(samples: Sequence[InFlight]) -> RolloutBatch:
    """One prompt token (the task) and one response token (the kind) per sample."""
    return RolloutBatch.from_sequences(
        prompt_ids=[[0]] * len(samples),
        response_ids=[[s.kind] for s in samples],
        logprobs=[[s.logprob] for s in samples],
        rewards=[s.reward for s in samples],
        durations_s=[s.duration_s for s in samples],
        versions=[s.version for s in samples],
    )


def make_update(cfg: SimConfig, duration_mode: str, ref_logits: jax.Array):
    """Jitted PPO update of (policy logits, scalar critic) from one RolloutBatch's arrays."""
    if cfg.optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {cfg.optimizer!r}")
    policy_opt = optax.sgd(cfg.lr) if cfg.optimizer == "sgd" else optax.adam(cfg.lr)
    critic_opt = optax.adam(cfg.critic_lr)

    def loss_fn(params, tokens, mask, old_lp, old_values, advantages, returns, weights):
        logits = jnp.broadcast_to(params["logits"], (*tokens.shape, params["logits"].shape[0]))
        # logits at position t score token t+1, as in the language model
        lp = core.token_logprobs(logits, tokens)
        values = jnp.full(tokens.shape, params["value"])
        pl, pm = core.policy_loss(lp, old_lp, advantages, mask, weights, clip_ratio=cfg.clip_ratio)
        vl, _ = core.value_loss(values, old_values, returns, mask, value_clip=cfg.value_clip)
        ent = core.masked_mean(core.shift_right(core.entropy_from_logits(logits)), mask)
        return pl - cfg.entropy_coef * ent + vl, pm

    @jax.jit
    def update(params, opt_states, tokens, mask, behaviour_lp, rewards, durations):
        maskf = mask.astype(jnp.float32)
        ref_lp = core.token_logprobs(jnp.broadcast_to(ref_logits, (*tokens.shape, ref_logits.shape[0])), tokens)
        tok_r, _ = core.token_rewards(rewards, maskf, behaviour_lp, ref_lp * maskf, cfg.kl_coef)
        values = jnp.full(tokens.shape, params["value"]) * maskf
        adv, ret = core.gae(tok_r, values, maskf, 1.0, 1.0)
        if cfg.whiten_advantages:
            adv = core.masked_whiten(adv, maskf)
        weights = duration.duration_weights(durations, duration_mode)
        for _ in range(cfg.epochs):
            grads, metrics = jax.grad(loss_fn, has_aux=True)(
                params, tokens, maskf, behaviour_lp, values, adv, ret, weights
            )
            pu, p_state = policy_opt.update({"logits": grads["logits"]}, opt_states[0])
            cu, c_state = critic_opt.update({"value": grads["value"]}, opt_states[1])
            params = optax.apply_updates(params, {**pu, **cu})
            opt_states = (p_state, c_state)
        return params, opt_states, metrics

    def init(params):
        return (policy_opt.init({"logits": params["logits"]}), critic_opt.init({"value": params["value"]}))

    return init, update


def run_arm(cfg: SimConfig, duration_mode: str, progress=None) -> History:
    """Train one arm (duration weights `duration_mode`) for cfg.steps updates; returns its history."""
    rng = np.random.default_rng(cfg.seed)
    fleet = SimulatedFleet(cfg.kinds, cfg.reward_noise, cfg.duration_noise, rng)
    init_logits = jnp.asarray(cfg.init_logits, jnp.float32)
    params = {"logits": init_logits, "value": jnp.zeros((), jnp.float32)}
    init, update = make_update(cfg, duration_mode, init_logits)
    opt_states = init(params)
    means = np.array([k.duration_s for k in cfg.kinds])
    hist = History()
    version = 0
    fleet.submit(np.asarray(params["logits"]), version, cfg.batch_size * cfg.in_flight_multiplier)
    for _ in range(cfg.steps):
        samples = fleet.next_batch(cfg.batch_size, version, cfg.max_version_lag)
        batch = to_rollout_batch(samples)
        params, opt_states, _ = update(
            params,
            opt_states,
            batch.tokens,
            batch.response_mask,
            batch.behaviour_logprobs,
            batch.rewards,
            batch.durations_s,
        )
        version += 1
        logits = np.asarray(params["logits"], np.float64)
        fleet.submit(logits, version, cfg.batch_size * cfg.in_flight_multiplier - len(fleet))
        probs = np.exp(logits - np.logaddexp.reduce(logits))
        hist.probs.append(probs)
        hist.batch_mean_duration.append(float(batch.durations_s.mean()))
        hist.policy_mean_duration.append(float(probs @ means))
        hist.clock_s.append(fleet.clock_s)
        hist.lag.append(float(np.mean(version - 1 - batch.versions)))
        if progress is not None:
            progress()
    return hist


def plot(histories: dict[str, History], kinds: Sequence[Kind], out: str) -> None:
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    styles = {"off": "--", "batch_mean": "-"}
    for mode, h in histories.items():
        probs = np.stack(h.probs)
        steps = np.arange(1, len(probs) + 1)
        for k, kind in enumerate(kinds):
            axes[0].plot(
                steps,
                probs[:, k],
                styles.get(mode, ":"),
                color=f"C{k}",
                label=f"{kind.name} ({kind.reward:g}, {kind.duration_s:g}s) · weights {mode}",
            )
        axes[1].plot(
            steps,
            h.batch_mean_duration,
            styles.get(mode, ":"),
            color="C7" if mode == "off" else "C3",
            alpha=0.5,
            label=f"batch mean Δt · weights {mode}",
        )
        axes[1].plot(
            steps,
            h.policy_mean_duration,
            styles.get(mode, ":"),
            color="k" if mode == "off" else "C3",
            label=f"policy mean Δt · weights {mode}",
        )
    axes[0].set(xlabel="PPO step", ylabel="probability of kind", title="policy over solution kinds", ylim=(0, 1))
    axes[1].set(xlabel="PPO step", ylabel="seconds", title="execution time Δt", yscale="log")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.suptitle("duration-aware PPO (dashed: no weights, solid: Δt / mean Δt)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def run(
    cfg: SimConfig,
    modes: Sequence[str] = ("off", "batch_mean"),
    out: str | None = None,
    show_progress: bool = True,
) -> dict[str, History]:
    """Both arms on the same seed; writes the plot to `out` when given."""
    histories = {}
    with Progress(disable=not show_progress) as bar:
        for mode in modes:
            task = bar.add_task(f"weights {mode}", total=cfg.steps)
            histories[mode] = run_arm(cfg, mode, progress=lambda t=task: bar.advance(t))
    if out:
        plot(histories, cfg.kinds, out)
    return histories


def result_record(cfg: SimConfig, histories: dict[str, History]) -> dict:
    """What a results file keeps of a run: its settings and each arm's final policy over the kinds."""
    final = {
        mode: {
            "probs": {k.name: round(float(p), 4) for k, p in zip(cfg.kinds, h.probs[-1], strict=True)},
            "argmax": cfg.kinds[int(np.argmax(h.probs[-1]))].name,
            "policy_mean_duration_s": round(h.policy_mean_duration[-1], 3),
        }
        for mode, h in histories.items()
    }
    return {"settings": dataclasses.asdict(cfg), "final": final}


FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 300, "PPO updates per arm")
flags.DEFINE_integer("batch_size", 32, "B: samples per update")
flags.DEFINE_integer("in_flight_multiplier", 4, "m: m*B samples in flight")
flags.DEFINE_integer("max_version_lag", 0, "drop samples more than this many versions old (0: never)")
flags.DEFINE_list("kind_names", ["fail", "fast", "slow"], "solution kinds")
flags.DEFINE_list("rewards", ["-9.7", "0.64", "0.8"], "mean reward of each kind")
flags.DEFINE_list("durations", ["0.5", "1", "20"], "mean run time (s) of each kind")
flags.DEFINE_list("init_logits", ["1", "0", "0"], "initial policy logits")
flags.DEFINE_float("reward_noise", 0.05, "std of reward noise")
flags.DEFINE_float("duration_noise", 0.3, "log-normal sigma of run-time noise")
flags.DEFINE_float("lr", 1.0, "policy learning rate")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "adam"], "policy optimizer")
flags.DEFINE_bool("whiten", False, "whiten advantages over the batch")
flags.DEFINE_integer("epochs", 2, "PPO epochs per batch")
flags.DEFINE_integer("seed", 0, "random seed (same for both arms)")
flags.DEFINE_string("out", "duration_bias.png", "where to write the plot")
flags.DEFINE_string("results", "", "append the settings and final policies, with command and date, to this JSONL")


def config_from_flags() -> SimConfig:
    n = len(FLAGS.kind_names)
    for name in ("rewards", "durations", "init_logits"):
        if len(getattr(FLAGS, name)) != n:
            raise app.UsageError(f"--{name} needs {n} values (one per kind), got {getattr(FLAGS, name)}")
    kinds = tuple(
        Kind(k, float(r), float(d)) for k, r, d in zip(FLAGS.kind_names, FLAGS.rewards, FLAGS.durations, strict=True)
    )
    return SimConfig(
        kinds=kinds,
        init_logits=tuple(float(x) for x in FLAGS.init_logits),
        steps=FLAGS.steps,
        batch_size=FLAGS.batch_size,
        in_flight_multiplier=FLAGS.in_flight_multiplier,
        max_version_lag=FLAGS.max_version_lag,
        reward_noise=FLAGS.reward_noise,
        duration_noise=FLAGS.duration_noise,
        lr=FLAGS.lr,
        optimizer=FLAGS.optimizer,
        whiten_advantages=FLAGS.whiten,
        epochs=FLAGS.epochs,
        seed=FLAGS.seed,
    )


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    cfg = config_from_flags()
    histories = run(cfg, out=FLAGS.out)
    for mode, h in histories.items():
        probs = ", ".join(f"{k.name}={p:.3f}" for k, p in zip(cfg.kinds, h.probs[-1], strict=True))
        best = cfg.kinds[int(np.argmax(h.probs[-1]))].name
        print(
            f"weights {mode:>10}: final probabilities {probs}; argmax {best}; "
            f"policy mean Δt {h.policy_mean_duration[-1]:.2f}s; simulated clock {h.clock_s[-1]:.0f}s"
        )
    print(f"plot: {FLAGS.out}")
    if FLAGS.results:
        print(f"results: {provenance.append_jsonl(FLAGS.results, result_record(cfg, histories))}")


if __name__ == "__main__":
    app.run(main)
