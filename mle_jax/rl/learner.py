"""The PPO learner: policy and critic train states sharded over a device mesh, one jitted update.

`Learner.update(batch)` runs, inside ONE jitted function of (state, reference params, batch, rng):
reference logprobs and critic values (forward passes over micro-batches), token rewards (terminal
reward minus the KL penalty to the frozen reference), GAE, optional advantage whitening, duration
weights, then PPO epochs x shuffled mini-batches x micro-batches with gradient accumulation and one
AdamW step per mini-batch for the policy and for the critic.

Params live in the train state as nested dicts of arrays with string keys (what optax and orbax
handle best); `ParamTree` converts them to and from the models' `nnx.State`. Every array is placed
with a NamedSharding from the weights' logical axes (mle_jax.sharding), batches are split along
(data, fsdp), and the same code runs on one CPU, fake CPU devices, GPUs and multi-host TPU.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mle_jax import sharding as shd
from mle_jax.rl import ppo
from mle_jax.rl.batch import RolloutBatch

Nested = dict[str, Any]
_BATCH_KEYS = ("tokens", "attention_mask", "response_mask", "behaviour_logprobs", "rewards", "durations_s")


class ParamTree:
    """Converts an nnx.State of Params to nested string-keyed dicts of arrays and back.

    The template keeps each Variable's type and metadata (logical axes), so `to_state` rebuilds a
    State that `nnx.merge` accepts, also on tracers inside jit.
    """

    def __init__(self, state: nnx.State):
        self._flat = list(nnx.to_flat_state(state))
        self.paths = [tuple(str(k) for k in path) for path, _ in self._flat]

    def to_nested(self, state: nnx.State) -> Nested:
        out: Nested = {}
        for path, var in nnx.to_flat_state(state):
            node = out
            for k in path[:-1]:
                node = node.setdefault(str(k), {})
            node[str(path[-1])] = var.get_value() if isinstance(var, nnx.Variable) else var
        return out

    def to_state(self, nested: Nested, model_dtypes: bool = False) -> nnx.State:
        """Nested dict -> nnx.State; with model_dtypes, each array is cast to the template's dtype (e.g. the
        bf16 of the model the learner was built from, when the learner keeps float32 master params)."""
        pairs = []
        for (path, var), spath in zip(self._flat, self.paths, strict=True):
            node = nested
            for k in spath:
                node = node[k]
            if model_dtypes:
                node = node.astype(var.get_value().dtype)
            pairs.append((path, var.replace(node)))
        return nnx.from_flat_state(pairs)

    def map_variables(self, fn: Callable[[nnx.Variable], Any]) -> Nested:
        """Nested dict of fn(template variable), e.g. its sharding."""
        out: Nested = {}
        for (_, var), spath in zip(self._flat, self.paths, strict=True):
            node = out
            for k in spath[:-1]:
                node = node.setdefault(k, {})
            node[spath[-1]] = fn(var)
        return out


@struct.dataclass
class TrainState:
    """Everything the update changes. Params are nested dicts (see ParamTree)."""

    step: jax.Array  # [] int32, number of updates done
    policy: Nested
    value: Nested
    policy_opt: Any
    value_opt: Any


@dataclasses.dataclass(frozen=True)
class PPOSettings:
    """The static knobs of the update (hashable; part of the jit cache key)."""

    gamma: float = 1.0
    lam: float = 1.0
    clip_ratio: float = 0.2
    dual_clip: float = 0.0
    value_clip: float = 0.5
    entropy_coef: float = 0.001
    kl_coef: float = 0.001
    kl_estimator: str = "k1"
    whiten_advantages: bool = True
    loss_agg: str = "token-mean"
    duration_mode: str = "batch_mean"
    duration_max_weight: float | None = 10.0
    epochs: int = 1
    mini_batch_size: int = 128
    micro_batch_size: int = 8
    temperature: float = 1.0
    shuffle: bool = True

    @classmethod
    def from_config(cls, cfg: Any) -> PPOSettings:
        p = cfg.ppo
        temperature = float(cfg.sampler.temperature) if "sampler" in cfg else 1.0
        return cls(
            gamma=float(p.gamma),
            lam=float(p.lam),
            clip_ratio=float(p.clip_ratio),
            dual_clip=float(p.dual_clip),
            value_clip=float(p.value_clip),
            entropy_coef=float(p.entropy_coef),
            kl_coef=float(p.kl_coef),
            kl_estimator=str(p.kl_estimator),
            whiten_advantages=bool(p.whiten_advantages),
            loss_agg=str(p.loss_agg),
            duration_mode=str(p.duration_weights),
            duration_max_weight=float(p.duration_max_weight) if p.duration_max_weight else None,
            epochs=int(p.epochs),
            mini_batch_size=int(p.mini_batch_size),
            micro_batch_size=int(p.micro_batch_size),
            temperature=temperature,
            shuffle=bool(p.get("shuffle", True)),
        )

    def validate(self) -> None:
        if self.kl_estimator not in ppo.KL_ESTIMATORS:
            raise ValueError(f"ppo.kl_estimator must be one of {ppo.KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.loss_agg not in ppo.LOSS_AGGS:
            raise ValueError(f"ppo.loss_agg must be one of {ppo.LOSS_AGGS}, got {self.loss_agg!r}")
        if self.duration_mode not in ppo.DURATION_MODES:
            raise ValueError(f"ppo.duration_weights must be one of {ppo.DURATION_MODES}, got {self.duration_mode!r}")
        if self.epochs < 1 or self.mini_batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("ppo.epochs, mini_batch_size and micro_batch_size must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"sampler temperature must be > 0 for logprobs, got {self.temperature}")


def make_optimizer(lr: float, optim: Any) -> optax.GradientTransformation:
    """clip_by_global_norm(grad_clip) then AdamW(lr, weight_decay), with optional linear warmup."""
    warmup = int(optim.get("warmup_steps", 0) or 0)
    schedule = optax.linear_schedule(0.0, lr, warmup) if warmup > 0 else lr
    return optax.chain(
        optax.clip_by_global_norm(float(optim.grad_clip)),
        optax.adamw(schedule, eps=float(optim.get("adam_eps", 1e-8)), weight_decay=float(optim.weight_decay)),
    )


def split_micro(x: jax.Array, n: int) -> jax.Array:
    """[B, ...] -> [n, B // n, ...]; chunk k holds rows k, k + n, k + 2n, ... so that every chunk is spread
    evenly over the devices that hold contiguous blocks of the batch dimension."""
    b = x.shape[0]
    return jnp.swapaxes(x.reshape(b // n, n, *x.shape[1:]), 0, 1)


def merge_micro(x: jax.Array) -> jax.Array:
    """Inverse of split_micro: [n, m, ...] -> [m * n, ...]."""
    return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _constrain(tree: Any, mesh: Mesh, leading: int) -> Any:
    """Shard dimension `leading` of every leaf over the batch axes (keeps micro-batches spread out)."""

    def one(x):
        spec = [None] * x.ndim
        spec[leading] = shd.BATCH_AXES
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

    return jax.tree.map(one, tree)


def ppo_update(
    state: TrainState,
    ref_params: Nested,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    s: PPOSettings,
    policy_apply: Callable[[Nested, jax.Array, jax.Array], jax.Array],
    value_apply: Callable[[Nested, jax.Array, jax.Array], jax.Array],
    policy_tx: optax.GradientTransformation,
    value_tx: optax.GradientTransformation,
    mesh: Mesh,
    ref_device_shardings: Any = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One PPO update on a batch of B samples (pure; jitted by Learner).

    batch: tokens, attention_mask, response_mask, behaviour_logprobs [B, T]; rewards, durations_s [B].
    policy_apply(params, tokens, attention_mask) -> logits [b, T, V]; value_apply -> values [b, T].
    Returns the new state and scalar metrics.
    """
    b = batch["tokens"].shape[0]
    mini = min(s.mini_batch_size, b)
    micro = min(s.micro_batch_size, mini)
    n_mini, n_micro = b // mini, mini // micro
    mask = batch["response_mask"].astype(jnp.float32)
    behaviour_lp = batch["behaviour_logprobs"] * mask
    if ref_device_shardings is not None:  # reference kept in host memory: bring it over for this update
        ref_params = jax.tree.map(jax.device_put, ref_params, ref_device_shardings)

    # ---- forward passes with the frozen reference and the critic, micro-batch by micro-batch
    def score(mb):
        ref_logits = policy_apply(ref_params, mb["tokens"], mb["attention_mask"])
        ref_lp = ppo.token_logprobs(ref_logits, mb["tokens"], s.temperature)
        values = ppo.shift_right(value_apply(state.value, mb["tokens"], mb["attention_mask"]))
        return ref_lp, values.astype(jnp.float32)

    fwd_in = {k: split_micro(batch[k], b // micro) for k in ("tokens", "attention_mask")}
    ref_lp, values = jax.lax.map(score, _constrain(fwd_in, mesh, 1))
    ref_lp, values = merge_micro(ref_lp) * mask, merge_micro(values) * mask

    # ---- rewards, advantages, duration weights over the whole batch
    tok_rewards, kl = ppo.token_rewards(batch["rewards"], mask, behaviour_lp, ref_lp, s.kl_coef, s.kl_estimator)
    advantages, returns = ppo.gae(tok_rewards, values, mask, s.gamma, s.lam)
    if s.whiten_advantages:
        advantages = ppo.masked_whiten(advantages, mask)
    weights = ppo.duration_weights(batch["durations_s"], s.duration_mode, s.duration_max_weight)
    data = {
        "tokens": batch["tokens"],
        "attention_mask": batch["attention_mask"],
        "mask": mask,
        "old_logprobs": behaviour_lp,
        "old_values": values,
        "advantages": advantages,
        "returns": returns,
        "weights": weights,
    }

    def policy_loss_fn(params, mb, denom):
        logits = policy_apply(params, mb["tokens"], mb["attention_mask"])
        lp = ppo.token_logprobs(logits, mb["tokens"], s.temperature) * mb["mask"]
        pg, m = ppo.policy_loss(
            lp, mb["old_logprobs"], mb["advantages"], mb["mask"], mb["weights"],
            s.clip_ratio, s.dual_clip, s.loss_agg, denom,
        )  # fmt: skip
        entropy_tok = ppo.shift_right(ppo.entropy_from_logits(logits / s.temperature))
        entropy = ppo.aggregate_loss(entropy_tok, mb["mask"], s.loss_agg, denom)
        n_tok = jnp.sum(mb["mask"])
        sums = {"pg_loss": pg, "entropy": entropy}
        sums |= {k: v * n_tok for k, v in m.items()}  # masked means -> masked sums
        return pg - s.entropy_coef * entropy, sums

    def value_loss_fn(params, mb, denom):
        v = ppo.shift_right(value_apply(params, mb["tokens"], mb["attention_mask"]).astype(jnp.float32))
        vl, m = ppo.value_loss(v, mb["old_values"], mb["returns"], mb["mask"], s.value_clip, s.loss_agg, denom)
        return vl, {"vf_loss": vl, "vf_clipfrac": m["vf_clipfrac"] * jnp.sum(mb["mask"])}

    def minibatch_step(st: TrainState, mb_data):
        if s.loss_agg == "token-mean":
            denom = jnp.sum(mb_data["mask"])
        else:
            denom = jnp.sum(jnp.any(mb_data["mask"] > 0, axis=-1)).astype(jnp.float32)
        micros = _constrain(jax.tree.map(lambda x: split_micro(x, n_micro), mb_data), mesh, 1)

        def micro_step(acc, mb):
            pg_grads, p_sums = jax.grad(policy_loss_fn, has_aux=True)(st.policy, mb, denom)
            v_grads, v_sums = jax.grad(value_loss_fn, has_aux=True)(st.value, mb, denom)
            acc = jax.tree.map(jnp.add, acc, (pg_grads, v_grads))
            return acc, p_sums | v_sums

        zeros = jax.tree.map(jnp.zeros_like, (st.policy, st.value))
        (pg_grads, v_grads), sums = jax.lax.scan(micro_step, zeros, micros)
        sums = jax.tree.map(jnp.sum, sums)
        n_tok = jnp.maximum(jnp.sum(mb_data["mask"]), 1.0)
        p_upd, p_opt = policy_tx.update(pg_grads, st.policy_opt, st.policy)
        v_upd, v_opt = value_tx.update(v_grads, st.value_opt, st.value)
        st = st.replace(
            policy=optax.apply_updates(st.policy, p_upd),
            value=optax.apply_updates(st.value, v_upd),
            policy_opt=p_opt,
            value_opt=v_opt,
        )
        metrics = {
            "actor/pg_loss": sums["pg_loss"],
            "actor/entropy": sums["entropy"],
            "actor/clipfrac": sums["clipfrac"] / n_tok,
            "actor/ppo_kl": sums["approx_kl"] / n_tok,
            "actor/ratio": sums["ratio"] / n_tok,
            "actor/grad_norm": optax.tree.norm(pg_grads),
            "critic/vf_loss": sums["vf_loss"],
            "critic/vf_clipfrac": sums["vf_clipfrac"] / n_tok,
            "critic/grad_norm": optax.tree.norm(v_grads),
        }
        return st, metrics

    def epoch(st: TrainState, epoch_rng):
        order = jax.random.permutation(epoch_rng, b) if s.shuffle else jnp.arange(b)
        shuffled = jax.tree.map(lambda x: jnp.take(x, order, axis=0), data)
        minis = jax.tree.map(lambda x: split_micro(x, n_mini), shuffled)
        return jax.lax.scan(minibatch_step, st, minis)

    state, metrics = jax.lax.scan(epoch, state, jax.random.split(rng, s.epochs))
    metrics = jax.tree.map(jnp.mean, metrics)
    n_tokens = jnp.sum(mask)
    seq_any = jnp.any(mask > 0, axis=-1)
    metrics |= {
        "rollout/reward_mean": jnp.mean(batch["rewards"]),
        "rollout/kl_ref": jnp.sum(kl) / jnp.maximum(n_tokens, 1.0),
        "rollout/response_length": jnp.mean(jnp.sum(mask, axis=-1)),
        "rollout/advantages_mean": jnp.sum(advantages) / jnp.maximum(n_tokens, 1.0),
        "rollout/returns_mean": jnp.sum(returns) / jnp.maximum(n_tokens, 1.0),
        "critic/values_mean": jnp.sum(values) / jnp.maximum(n_tokens, 1.0),
        "duration/mean_s": jnp.mean(batch["durations_s"]),
        "duration/weight_max": jnp.max(weights),
        "duration/weight_min": jnp.min(weights),
        "rollout/empty_responses": jnp.sum(~seq_any).astype(jnp.float32),
    }
    return state.replace(step=state.step + 1), metrics


def _cast_tree(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


class Learner:
    """Policy + critic train states on a mesh; `update(RolloutBatch) -> metrics`.

    cfg: the run config (sections ppo, optim, mesh, sampler.temperature, seed).
    policy: Qwen2ForCausalLM (its current weights become the frozen reference unless `reference` is given).
    value: Qwen2ValueModel (values [B, T]).
    mesh: a (data, fsdp, tensor) mesh; default make_mesh(cfg.mesh).
    """

    def __init__(
        self,
        cfg: Any,
        policy: nnx.Module,
        value: nnx.Module,
        mesh: Mesh | None = None,
        reference: nnx.Module | None = None,
    ):
        self.cfg = cfg
        self.mesh = mesh if mesh is not None else shd.make_mesh(cfg.mesh)
        self.settings = PPOSettings.from_config(cfg)
        self.settings.validate()
        master = cfg.optim.get("master_dtype", "float32") or None
        self._master_dtype = jnp.dtype(master) if master else None

        self._policy_graph, policy_params, self._policy_rest = nnx.split(policy, nnx.Param, ...)
        self._value_graph, value_params, self._value_rest = nnx.split(value, nnx.Param, ...)
        self.policy_tree = ParamTree(policy_params)
        self.value_tree = ParamTree(value_params)
        self._policy_shardings = self._param_shardings(self.policy_tree)
        self._value_shardings = self._param_shardings(self.value_tree)

        self.policy_tx = make_optimizer(float(cfg.optim.actor_lr), cfg.optim)
        self.value_tx = make_optimizer(float(cfg.optim.critic_lr), cfg.optim)

        policy_nested = self._master(self.policy_tree.to_nested(policy_params))
        value_nested = self._master(self.value_tree.to_nested(value_params))
        policy_nested = self._place(policy_nested, self._policy_shardings)
        value_nested = self._place(value_nested, self._value_shardings)
        p_opt_sh = self._opt_shardings(self.policy_tx, policy_nested, self._policy_shardings)
        v_opt_sh = self._opt_shardings(self.value_tx, value_nested, self._value_shardings)
        rep = shd.replicated(self.mesh)
        self._state_shardings = TrainState(rep, self._policy_shardings, self._value_shardings, p_opt_sh, v_opt_sh)
        self.state = TrainState(
            step=shd.put_global(np.zeros((), np.int32), rep),
            policy=policy_nested,
            value=value_nested,
            policy_opt=jax.jit(self.policy_tx.init, out_shardings=p_opt_sh)(policy_nested),
            value_opt=jax.jit(self.value_tx.init, out_shardings=v_opt_sh)(value_nested),
        )

        # frozen reference: a copy of the initial policy (or the given model), optionally in host memory
        if reference is not None:
            _, ref_state, _ = nnx.split(reference, nnx.Param, ...)
            ref_nested = self.policy_tree.to_nested(ref_state)
        else:
            ref_nested = self.policy_tree.to_nested(policy_params)
        self._ref_on_host = bool(cfg.mesh.get("reference_on_host", False))
        self._ref_device_shardings = None
        ref_shardings = self._policy_shardings
        if self._ref_on_host:
            self._ref_device_shardings = self._policy_shardings
            ref_shardings = jax.tree.map(lambda sh: sh.with_memory_kind("pinned_host"), self._policy_shardings)
        self._ref_shardings = ref_shardings
        self.reference = self._place(ref_nested, ref_shardings)

        self._rng = np.asarray(jax.random.key_data(jax.random.key(int(cfg.get("seed", 0)))), np.uint32)
        self._update_fn = self._build_update()

    # ---------------------------------------------------------------- placement helpers
    def _param_shardings(self, tree: ParamTree) -> Nested:
        return tree.map_variables(lambda var: shd.variable_sharding(var, self.mesh))

    def _master(self, nested: Nested) -> Nested:
        return nested if self._master_dtype is None else _cast_tree(nested, self._master_dtype)

    def _place(self, tree: Any, shardings: Any) -> Any:
        """Copies of `tree`'s arrays with `shardings`. Always fresh buffers: the update donates the state on
        accelerators, which must never free the caller's model weights."""

        def one(x, sh):
            if isinstance(x, jax.Array) and not x.is_fully_addressable:
                return jax.jit(lambda y: y, out_shardings=sh)(x)  # reshard across processes
            if isinstance(x, jax.Array) and sh.is_fully_addressable:
                return jax.device_put(x, sh, may_alias=False)
            return shd.put_global(np.asarray(jax.device_get(x)), sh)  # host copy onto a multi-process mesh

        return jax.tree.map(one, tree, shardings)

    def _opt_shardings(self, tx: optax.GradientTransformation, params: Nested, param_sh: Nested) -> Any:
        abstract = jax.eval_shape(tx.init, params)
        rep = shd.replicated(self.mesh)
        return optax.tree_map_params(tx, lambda _, sh: sh, abstract, param_sh, transform_non_params=lambda _: rep)

    def _apply_fn(self, graph: Any, tree: ParamTree, rest: Any, kind: str):
        def apply(params: Nested, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
            model = nnx.merge(graph, tree.to_state(params), rest)
            out = model(tokens, attention_mask=attention_mask)
            expected = 3 if kind == "policy" else 2
            if out.ndim != expected:
                raise ValueError(f"{kind} model returned shape {out.shape}, expected {expected} dims")
            return out

        return apply

    def _build_update(self):
        fn = functools.partial(
            ppo_update,
            s=self.settings,
            policy_apply=self._apply_fn(self._policy_graph, self.policy_tree, self._policy_rest, "policy"),
            value_apply=self._apply_fn(self._value_graph, self.value_tree, self._value_rest, "value"),
            policy_tx=self.policy_tx,
            value_tx=self.value_tx,
            mesh=self.mesh,
            ref_device_shardings=self._ref_device_shardings,
        )
        rep = shd.replicated(self.mesh)
        batch_sh = {k: shd.batch_sharding(self.mesh, 2 if k not in ("rewards", "durations_s") else 1)
                    for k in _BATCH_KEYS}  # fmt: skip
        donate = (0,) if jax.default_backend() != "cpu" else ()  # CPU cannot donate; avoid the warning
        return jax.jit(
            fn,
            in_shardings=(self._state_shardings, self._ref_shardings, batch_sh, rep),
            out_shardings=(self._state_shardings, rep),
            donate_argnums=donate,
        )

    # ---------------------------------------------------------------- public API
    @property
    def step(self) -> int:
        return int(shd.to_host(self.state.step))

    def check_batch(self, batch: RolloutBatch) -> None:
        """Raise ValueError when B does not split into mini/micro-batches over the mesh."""
        b, s = batch.batch_size, self.settings
        mini = min(s.mini_batch_size, b)
        micro = min(s.micro_batch_size, mini)
        div = shd.batch_divisor(self.mesh)
        if b % mini:
            raise ValueError(f"batch size {b} is not a multiple of ppo.mini_batch_size {mini}")
        if mini % micro:
            raise ValueError(f"mini-batch {mini} is not a multiple of ppo.micro_batch_size {micro}")
        if micro % div:
            raise ValueError(f"micro-batch {micro} is not a multiple of mesh data*fsdp = {div}")

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """One PPO update (epochs x mini-batches) on `batch`; returns scalar metrics."""
        self.check_batch(batch)
        bucket = int(self.cfg.ppo.get("seq_bucket", 0) or 0)
        if bucket and batch.seq_len % bucket:
            batch = batch.pad_to(batch.seq_len + bucket - batch.seq_len % bucket)
        arrays = shd.put_batch({k: getattr(batch, k) for k in _BATCH_KEYS}, self.mesh)
        keys = np.asarray(jax.random.split(self._rng), np.uint32)
        self._rng = keys[0]
        rng = shd.put_global(keys[1], shd.replicated(self.mesh))
        self.state, metrics = self._update_fn(self.state, self.reference, arrays, rng)
        out = {k: float(shd.to_host(v)) for k, v in metrics.items()}
        out["learner/step"] = float(self.step)
        out["rollout/version_mean"] = float(np.mean(batch.versions))
        out["perf/tokens"] = float(np.sum(batch.attention_mask))
        return out

    def policy_state(self, model_dtypes: bool = True) -> nnx.State:
        """The current policy params as an nnx.State (what Sampler.sync and nnx.update take), cast to the
        policy model's param dtypes unless model_dtypes is False (then the learner's master copies)."""
        return self.policy_tree.to_state(self.state.policy, model_dtypes)

    def policy_model(self) -> nnx.Module:
        """A policy module holding the current params (for sampling, evaluation and HF export)."""
        return nnx.merge(self._policy_graph, self.policy_state(), self._policy_rest)

    def value_model(self) -> nnx.Module:
        return nnx.merge(self._value_graph, self.value_tree.to_state(self.state.value), self._value_rest)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same run: params, optimizer states, step, RNG."""
        return {
            "step": self.state.step,
            "policy": self.state.policy,
            "value": self.state.value,
            "policy_opt": self.state.policy_opt,
            "value_opt": self.state.value_opt,
            "rng": self._rng.copy(),
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Inverse of state_dict (e.g. from Checkpointer.restore(step, {"learner": learner.state_dict()}))."""
        missing = {"step", "policy", "value", "policy_opt", "value_opt", "rng"} - set(d)
        if missing:
            raise KeyError(f"learner state lacks {sorted(missing)}")
        state = TrainState(d["step"], d["policy"], d["value"], d["policy_opt"], d["value_opt"])
        if jax.tree.structure(state) != jax.tree.structure(self.state):
            raise ValueError("learner state does not match this learner's structure (different model or optimizer?)")
        self.state = self._place(state, self._state_shardings)
        self._rng = np.asarray(jax.device_get(d["rng"]), np.uint32).copy()
