"""The learner: a thin stateful shell around the pure update (`rl/update.py`).

It holds the policy train state (and the critic's, for an objective with one: `config.learner.algorithm`,
rl/objectives.py) sharded over a device mesh and the frozen reference, jits the update once per batch shape, and
converts between the models and the states.

Params live in the train state as nested dicts of arrays with string keys (what optax and orbax
handle best); `ParamTree` converts them to and from the models' `nnx.State`. Every array is placed
with a NamedSharding from the weights' logical axes (mle_jax.infra.sharding), batches are split along
(data, fsdp), and the same code runs on one CPU, fake CPU devices, GPUs and multi-host TPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from mle_jax.infra import sharding as shd
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.models import lora
from mle_jax.rl import objectives
from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.settings import LearnerSettings
from mle_jax.rl.update import BATCH_KEYS, INT_KEYS, SAMPLE_KEYS, Nested, TrainState, update_step


class ParamTree:
    """Converts an nnx.State of Params to nested string-keyed dicts of arrays and back.

    The template keeps each Variable's type and metadata (logical axes), so `to_state` rebuilds a
    State that `nnx.merge` accepts, also on tracers inside jit.
    """

    def __init__(self, state: nnx.State):
        # shapes and dtypes only: a template that held the arrays would keep the model it was built from alive (the
        # critic's initial copy of the policy: 0.5 GB for SmolLM2) for as long as the learner
        self._flat = [
            (path, var.replace(jax.ShapeDtypeStruct(np.shape(var.get_value()), var.get_value().dtype)))
            for path, var in nnx.to_flat_state(state)
        ]
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


def check_batch_arrays(arrays: Mapping[str, np.ndarray]) -> None:
    """The learner batch contract, checked where the batch enters the learner: tokens, attention_mask,
    response_mask int32 [B, T]; behaviour_logprobs float32 [B, T]; rewards, durations_s float32 [B]; group_ids,
    task_ids int32 [B]."""
    chex.assert_rank([arrays[k] for k in BATCH_KEYS], [1 if k in SAMPLE_KEYS else 2 for k in BATCH_KEYS])
    chex.assert_type([arrays[k] for k in BATCH_KEYS], [np.int32 if k in INT_KEYS else np.float32 for k in BATCH_KEYS])
    chex.assert_equal_shape([arrays[k] for k in ("tokens", "attention_mask", "response_mask", "behaviour_logprobs")])
    chex.assert_equal_shape_prefix([arrays[k] for k in BATCH_KEYS], 1)


def _cast_tree(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def check_value_model(algorithm: str, value: nnx.Module | None) -> None:
    """ValueError unless a value model is given exactly when the objective has a critic."""
    if objectives.has_critic(algorithm) and value is None:
        raise ValueError(f"learner.algorithm={algorithm} trains a critic: pass a value model")
    if not objectives.has_critic(algorithm) and value is not None:
        raise ValueError(f"learner.algorithm={algorithm} has no critic: pass value=None")


class UpdateProgram:
    """The jitted update of a policy (and, for an objective with a critic, its value model) on a mesh, with the
    shardings of its arguments; it holds no weights, so it builds from concrete models or abstract ones
    (`nnx.eval_shape`): `Learner` runs it, `mle_jax.plan` lowers and compiles it for devices that are not here.

    settings: LearnerSettings; policy: Qwen2ForCausalLM; value: Qwen2ValueModel, or None for a critic-free
    objective (`settings.algorithm`); mesh: (data, fsdp, tensor).
    donate: whether the update donates the train state, updating it in place (default True: the new state then
    needs no second copy of the params and optimizer moments, 3.2 GB for SmolLM2 and its critic; a plan passes
    whether its target can).
    """

    def __init__(
        self,
        settings: LearnerSettings,
        policy: nnx.Module,
        value: nnx.Module | None,
        mesh: Mesh,
        donate: bool | None = None,
    ):
        check_value_model(settings.algorithm, value)
        self.mesh = mesh
        self.donate = True if donate is None else donate
        self.settings = settings.ppo
        self.objective = settings.objective
        self.critic = self.objective.critic
        self.seed = int(settings.seed)
        optim = settings.optim
        self.master_dtype = jnp.dtype(optim.master_dtype) if optim.master_dtype else None
        self.lora = settings.lora
        self.policy_graph, policy_params, self.policy_rest = nnx.split(policy, nnx.Param, ...)
        self.policy_tree = ParamTree(policy_params)
        # the model's params' shardings (the reference's); the state's are the adapters' with LoRA
        self.model_shardings = self.policy_tree.map_variables(lambda var: shd.variable_sharding(var, mesh))
        rep = shd.replicated(mesh)
        self.policy_abstract = self.abstract_params(self.policy_tree)
        self.policy_shardings = self.model_shardings
        if self.lora.enabled:  # small: replicated
            self.policy_abstract = self.abstract_adapters(self.policy_abstract)
            self.policy_shardings = jax.tree.map(lambda _: rep, self.policy_abstract)
        self.policy_tx = optim.optimizer(optim.actor_lr)
        p_opt_sh = self._opt_shardings(self.policy_tx, self.policy_abstract, self.policy_shardings)
        # no critic: no value tree, optimizer or shardings (the state's value fields are None)
        self.value_tree = self.value_shardings = self.value_tx = self.value_abstract = v_opt_sh = None
        if self.critic:
            self.value_graph, value_params, self.value_rest = nnx.split(value, nnx.Param, ...)
            self.value_tree = ParamTree(value_params)
            self.value_shardings = self.value_tree.map_variables(lambda var: shd.variable_sharding(var, mesh))
            self.value_abstract = self.abstract_params(self.value_tree)
            if self.lora.enabled:  # the backbone's adapters (replicated) and the head, trained whole
                head = {k: v for k, v in self.value_abstract.items() if k != "model"}
                self.value_abstract = {"model": self.abstract_adapters(self.value_abstract["model"]), **head}
                self.value_shardings = {
                    "model": jax.tree.map(lambda _: rep, self.value_abstract["model"]),
                    **{k: self.value_shardings[k] for k in head},
                }
            self.value_tx = optim.optimizer(optim.critic_lr)
            v_opt_sh = self._opt_shardings(self.value_tx, self.value_abstract, self.value_shardings)
        self.state_shardings = TrainState(rep, self.policy_shardings, self.value_shardings, p_opt_sh, v_opt_sh)
        self.reference_on_host = settings.reference_on_host
        self.ref_device_shardings = self.model_shardings if self.reference_on_host else None
        self.ref_shardings = self.model_shardings
        if self.reference_on_host:
            self.ref_shardings = jax.tree.map(lambda sh: sh.with_memory_kind("pinned_host"), self.model_shardings)
        self.fn = self._build_update()

    # ---------------------------------------------------------------- abstract arguments
    def abstract_params(self, tree: ParamTree, master: bool = True) -> Nested:
        """ShapeDtypeStructs of a model's params as the train state holds them (master dtype unless not
        `master`: then the model's param dtype, as the frozen reference keeps it)."""

        def one(var: nnx.Variable) -> jax.ShapeDtypeStruct:
            x = var.get_value()
            dtype = x.dtype
            if master and self.master_dtype is not None and jnp.issubdtype(dtype, jnp.floating):
                dtype = self.master_dtype
            return jax.ShapeDtypeStruct(np.shape(x), dtype)

        return tree.map_variables(one)

    def abstract_adapters(self, params: Nested) -> Nested:
        """ShapeDtypeStructs of the LoRA adapters of `params` (a nested dict of ShapeDtypeStructs)."""
        return jax.eval_shape(lambda: lora.init_adapters(params, self.lora, jax.random.key(0), self.trained_dtype))

    @property
    def trained_dtype(self) -> Any:
        return self.master_dtype or jnp.float32

    def policy_params(self, trained: Nested, base: Nested, merged: bool = False) -> Nested:
        """The policy's params from what the state trains: with LoRA the base (the reference) with the adapters on
        it (`lora.adapted`: applied unmerged, as the update trains them; `merged`: added into the weights, for the
        sampler and the export); else the trained params themselves."""
        if not self.lora.enabled:
            return trained
        return (lora.merge if merged else lora.adapted)(base, trained, self.lora.scale)

    def value_params(self, trained: Nested, base: Nested, merged: bool = False) -> Nested:
        """The critic's params from what the state trains (LoRA: the policy's base backbone, adapted, + the head)."""
        if not self.lora.enabled:
            return trained
        return (lora.merge if merged else lora.adapted)({"model": base["model"]}, trained, self.lora.scale)

    def abstract_state(self) -> TrainState:
        """The train state as ShapeDtypeStructs with their shardings (no memory allocated)."""
        policy = self.policy_abstract
        value = self.value_abstract if self.critic else None
        state = TrainState(
            step=jax.ShapeDtypeStruct((), jnp.int32),
            policy=policy,
            value=value,
            policy_opt=jax.eval_shape(self.policy_tx.init, policy),
            value_opt=jax.eval_shape(self.value_tx.init, value) if self.critic else None,
        )
        return _with_shardings(state, self.state_shardings)

    def abstract_reference(self) -> Nested:
        return _with_shardings(self.abstract_params(self.policy_tree, master=False), self.ref_shardings)

    def abstract_batch(self, batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        """The update's batch arguments for B x T tokens (the learner's batch contract), sharded over the batch."""
        out = {}
        for k in BATCH_KEYS:
            shape = (batch_size,) if k in SAMPLE_KEYS else (batch_size, seq_len)
            dtype = jnp.int32 if k in INT_KEYS else jnp.float32
            out[k] = jax.ShapeDtypeStruct(shape, dtype, sharding=shd.batch_sharding(self.mesh, len(shape)))
        return out

    def lower(self, batch_size: int, seq_len: int) -> jax.stages.Lowered:
        """The update traced and lowered for a B x T batch (compile it with `.compile()`)."""
        return self.fn.lower(self.abstract_state(), self.abstract_reference(), self.abstract_batch(batch_size, seq_len))

    # ---------------------------------------------------------------- building blocks
    def _opt_shardings(self, tx: optax.GradientTransformation, params: Nested, param_sh: Nested) -> Any:
        abstract = jax.eval_shape(tx.init, params)
        rep = shd.replicated(self.mesh)
        return optax.tree_map_params(tx, lambda _, sh: sh, abstract, param_sh, transform_non_params=lambda _: rep)

    def _model(self, graph: Any, tree: ParamTree, rest: Any, params: Nested) -> nnx.Module:
        return nnx.merge(graph, tree.to_state(params), rest)

    def _policy_apply(self, params: Nested, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """[b, T] tokens -> [b, T, D] final hidden states of the policy."""
        model = self._model(self.policy_graph, self.policy_tree, self.policy_rest, params)
        return model.hidden_states(tokens, attention_mask=attention_mask)[0]

    def _policy_head(self, params: Nested) -> jax.Array:
        """The policy's output head [D, V] in its compute dtype (logits = hidden states @ it)."""
        return self._model(self.policy_graph, self.policy_tree, self.policy_rest, params).head_weight()

    def _value_apply(self, params: Nested, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
        out = self._model(self.value_graph, self.value_tree, self.value_rest, params)(
            tokens, attention_mask=attention_mask
        )
        if out.ndim != 2:
            raise ValueError(f"value model returned shape {out.shape}, expected [B, T]")
        return out

    def _build_update(self):
        fn = functools.partial(
            update_step,
            s=self.settings,
            seed=self.seed,
            objective=self.objective,
            policy_apply=self._policy_apply,
            policy_head=self._policy_head,
            value_apply=self._value_apply if self.critic else None,
            policy_tx=self.policy_tx,
            value_tx=self.value_tx,
            mesh=self.mesh,
            ref_device_shardings=self.ref_device_shardings,
            policy_params=self.policy_params if self.lora.enabled else None,
            value_params=self.value_params if self.lora.enabled else None,
        )
        rep = shd.replicated(self.mesh)
        batch_sh = {k: shd.batch_sharding(self.mesh, 1 if k in SAMPLE_KEYS else 2) for k in BATCH_KEYS}
        return jax.jit(
            fn,
            in_shardings=(self.state_shardings, self.ref_shardings, batch_sh),
            out_shardings=(self.state_shardings, rep),
            donate_argnums=(0,) if self.donate else (),
        )


def _with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), abstract, shardings)


class Learner:
    """Policy (+ critic) train states on a mesh; `update(RolloutBatch) -> metrics`.

    settings: LearnerSettings (the objective, the PPO knobs, optimizers, reference placement, seed).
    policy: Qwen2ForCausalLM (its current weights become the frozen reference unless `reference` is given).
    value: Qwen2ValueModel (values [B, T]) for an objective with a critic; None for a critic-free one (nothing of a
    critic is built, updated or checkpointed).
    mesh: a (data, fsdp, tensor) mesh (`sharding.make_mesh`).
    """

    def __init__(
        self,
        settings: LearnerSettings,
        policy: nnx.Module,
        value: nnx.Module | None,
        mesh: Mesh,
        reference: nnx.Module | None = None,
    ):
        self.mesh = mesh
        self.settings = settings.ppo
        self.algorithm = settings.algorithm
        self.program = program = UpdateProgram(settings, policy, value, mesh)
        self.critic = program.critic
        self.policy_tree, self.value_tree = program.policy_tree, program.value_tree
        self._master_dtype = program.master_dtype
        self.lora = program.lora
        _, policy_params, _ = nnx.split(policy, nnx.Param, ...)
        if self.lora.enabled and reference is not None:
            raise ValueError("with LoRA the reference is the policy's base (adapters off): pass no other reference")
        key = jax.random.key(settings.seed)
        policy_nested = self.policy_tree.to_nested(policy_params)
        if self.lora.enabled:  # the policy trains adapters over its initial weights (the reference)
            policy_nested = lora.init_adapters(policy_nested, self.lora, key, program.trained_dtype)
        policy_nested = self._place(self._master(policy_nested), program.policy_shardings)
        sh = program.state_shardings
        value_nested = value_opt = None
        if self.critic:
            _, value_params, _ = nnx.split(value, nnx.Param, ...)
            value_full = self.value_tree.to_nested(value_params)
            if self.lora.enabled:  # the backbone is the policy's base: only its adapters and the head are trained
                adapters = lora.init_adapters(
                    value_full["model"], self.lora, jax.random.fold_in(key, 1), program.trained_dtype
                )
                value_full = {"model": adapters, **{k: v for k, v in value_full.items() if k != "model"}}
            value_nested = self._place(self._master(value_full), program.value_shardings)
            value_opt = jax.jit(program.value_tx.init, out_shardings=sh.value_opt)(value_nested)
        self.state = TrainState(
            step=shd.put_global(np.zeros((), np.int32), sh.step),
            policy=policy_nested,
            value=value_nested,
            policy_opt=jax.jit(program.policy_tx.init, out_shardings=sh.policy_opt)(policy_nested),
            value_opt=value_opt,
        )
        # frozen reference: a copy of the initial policy (or the given model), optionally in host memory
        if reference is not None:
            _, ref_state, _ = nnx.split(reference, nnx.Param, ...)
            ref_nested = self.policy_tree.to_nested(ref_state)
        else:
            ref_nested = self.policy_tree.to_nested(policy_params)
        # the update donates only the state, whose params are copies (or, with LoRA, adapters): the reference shares the
        # model's buffers where their placement is already the reference's (one copy of the initial weights for the
        # model, the reference and the frozen instrumenter), else it is placed anew
        self.reference = self._place(ref_nested, program.ref_shardings, copy=False)
        self._update_fn = program.fn

    # ---------------------------------------------------------------- placement helpers
    def _master(self, nested: Nested) -> Nested:
        return nested if self._master_dtype is None else _cast_tree(nested, self._master_dtype)

    def _place(self, tree: Any, shardings: Any, copy: bool = True) -> Any:
        """Copies of `tree`'s arrays with `shardings`. Fresh buffers unless not `copy`: the update donates the state
        on accelerators, which must never free the caller's model weights."""

        def one(x, sh):
            if not copy and isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sh, x.ndim):
                return x
            if isinstance(x, jax.Array) and not x.is_fully_addressable:
                return jax.jit(lambda y: y, out_shardings=sh)(x)  # reshard across processes
            if isinstance(x, jax.Array) and sh.is_fully_addressable:
                # a copy by computation: device_put(may_alias=False) can hand back the source's buffers for a
                # replicated sharding, and the state and the reference, placed from the same arrays, then share
                # buffers that the donating update frees
                return jax.jit(jnp.copy, out_shardings=sh)(x)
            return shd.put_global(np.asarray(jax.device_get(x)), sh)  # host copy onto a multi-process mesh

        return jax.tree.map(one, tree, shardings)

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
        """One update (epochs x mini-batches) of the objective on `batch`; returns scalar metrics."""
        self.check_batch(batch)
        bucket = self.settings.seq_bucket
        if bucket and batch.seq_len % bucket:
            batch = batch.pad_to(batch.seq_len + bucket - batch.seq_len % bucket)
        host = {k: getattr(batch, k) for k in BATCH_KEYS}
        check_batch_arrays(host)
        arrays = shd.put_batch(host, self.mesh)
        lag = version_lags(self.step, batch.versions, batch.durations_s, batch.task_ids)
        self.state, metrics = self._update_fn(self.state, self.reference, arrays)
        out = {k: float(shd.to_host(v)) for k, v in metrics.items()}
        out["learner/step"] = float(self.step)
        out["rollout/version_mean"] = float(np.mean(batch.versions))
        out["perf/tokens"] = float(np.sum(batch.attention_mask))
        return out | lag

    def policy_state(self, model_dtypes: bool = True) -> nnx.State:
        """The current policy params as an nnx.State (what Sampler.sync and nnx.update take), cast to the
        policy model's param dtypes unless model_dtypes is False (then the learner's master copies). Copies when
        the update donates the state: whoever holds them keeps them through the next update."""
        params = self.program.policy_params(self.state.policy, self.reference, merged=True)
        return self._own(self.policy_tree.to_state(params, model_dtypes))

    def _own(self, tree: Any) -> Any:
        """`tree` (params derived from the state) as buffers the update will not donate: copies when it donates the
        state, unless with LoRA, whose merged weights are computed anew and whose other leaves are the reference's."""
        return jax.tree.map(jnp.copy, tree) if self.program.donate and not self.lora.enabled else tree

    def policy_model(self) -> nnx.Module:
        """A policy module holding the current params (for sampling, evaluation and HF export)."""
        return nnx.merge(self.program.policy_graph, self.policy_state(), self.program.policy_rest)

    def value_model(self) -> nnx.Module | None:
        """The critic holding its current params; None for a critic-free objective."""
        if not self.critic:
            return None
        params = self.program.value_params(self.state.value, self.reference, merged=True)
        state = self._own(self.value_tree.to_state(params))
        return nnx.merge(self.program.value_graph, state, self.program.value_rest)

    def memory_parts(self) -> dict[str, Any]:
        """What the learner holds, by part (infra.metrics.memory_breakdown): the trained params (all of the policy, or
        its LoRA adapters), their optimizer moments, the critic's, and the frozen reference."""
        parts = {"policy": self.state.policy, "policy_opt": self.state.policy_opt}
        if self.critic:
            parts |= {"critic": self.state.value, "critic_opt": self.state.value_opt}
        return parts | {"reference": self.reference}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same run: params, optimizer states, step (the update's RNG is
        derived from the seed and the step). A critic-free learner's has no value entries."""
        out = {"step": self.state.step, "policy": self.state.policy, "policy_opt": self.state.policy_opt}
        if self.critic:
            out |= {"value": self.state.value, "value_opt": self.state.value_opt}
        return out

    def save(self, checkpointer: Checkpointer, step: int, **items: Any) -> None:
        """Checkpoints the learner state as step `step`, beside JSON-able `items` (e.g. the loop's state)."""
        checkpointer.save(step, {"learner": self.state_dict(), **items})

    def restore_latest(self, checkpointer: Checkpointer) -> dict[str, Any] | None:
        """Loads the newest checkpoint's learner state; returns its other items (None: no checkpoint)."""
        found = checkpointer.restore_latest({"learner": self.state_dict()})
        if found is None:
            return None
        _, items = found
        self.load_state_dict(items.pop("learner"))
        return items

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Inverse of state_dict (e.g. from Checkpointer.restore(step, {"learner": learner.state_dict()}))."""
        keys = {"step", "policy", "policy_opt"} | ({"value", "value_opt"} if self.critic else set())
        missing = keys - set(d)
        if missing:
            raise KeyError(f"learner state lacks {sorted(missing)}")
        extra = {"value", "value_opt"} & set(d) - keys
        if extra:
            raise ValueError(
                f"learner state holds a critic ({sorted(extra)}) but learner.algorithm={self.algorithm} has none"
            )
        state = TrainState(d["step"], d["policy"], d.get("value"), d["policy_opt"], d.get("value_opt"))
        if jax.tree.structure(state) != jax.tree.structure(self.state):
            raise ValueError("learner state does not match this learner's structure (different model or optimizer?)")
        self.state = self._place(state, self.program.state_shardings)


def version_lags(
    step: int, versions: np.ndarray, durations_s: np.ndarray, task_ids: np.ndarray | None = None
) -> dict[str, float]:
    """`stale/version_lag_{slow,fast}`: how many updates behind the learner (at `step`, before this update) the
    policy that sampled each sample is, averaged over the slow samples (Δt above the mean of its task in the batch,
    as the update's slow flag) and the fast ones; NaN where there is none (each task's Δt all equal).
    versions, durations_s, task_ids: [B] (task_ids None: one task)."""
    lag = step - np.asarray(versions, np.float64)
    d = np.asarray(durations_s, np.float64)
    tasks = np.zeros(d.shape, np.int64) if task_ids is None else np.asarray(task_ids)
    slow = np.zeros(d.shape, bool)
    for task in np.unique(tasks):
        rows = tasks == task
        slow[rows] = d[rows] > d[rows].mean()
    return {
        f"stale/version_lag_{name}": float(lag[rows].mean()) if rows.any() else float("nan")
        for name, rows in (("slow", slow), ("fast", ~slow))
    }
