"""The two programs a plan compiles, built abstractly (no weights: `nnx.eval_shape`, `jax.ShapeDtypeStruct`): the
run's real update of its `learner.algorithm` (policy, the critic where the objective has one, reference, optimizer
states, the micro-batch loop) and one decode step of the JAX sampler, each lowered and compiled for a mesh over the
target's devices, with their memory, FLOPs and compile times.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mle_jax.infra import sharding as shd
from mle_jax.models import hf
from mle_jax.models.decoding import sample_token
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.value import Qwen2ValueModel
from mle_jax.planner import hlo_collectives
from mle_jax.planner.counting import (
    GIB,
    matmul_flops,
    memory_figures,
    out_of_memory_figures,
    per_device_bytes,
    xla_flops,
)
from mle_jax.planner.errors import PlanError
from mle_jax.rl.learner import UpdateProgram
from mle_jax.run.settings import RunSettings


def model_config(s: RunSettings) -> Qwen2Config:
    """The architecture the run trains: the checkpoint's config.json, else the config's fresh shape."""
    if s.model.path:
        cfg = hf.read_config(s.model.path)
        return dataclasses.replace(cfg, **s.model.runtime_options())
    return s.model.architecture()


def abstract_models(s: RunSettings, cfg: Qwen2Config) -> tuple[Qwen2ForCausalLM, Qwen2ValueModel | None]:
    """Policy and critic as shapes only (nnx.eval_shape: no memory, no RNG work); no critic (None) for a
    critic-free learner.algorithm."""
    dtype = s.model.compute_dtype
    param_dtype = jnp.dtype(s.model.param_dtype) if not s.model.path else dtype  # as from_pretrained loads
    policy = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype))
    if not s.learner.objective.critic:
        return policy, None
    value = nnx.eval_shape(lambda: Qwen2ValueModel(cfg, nnx.Rngs(1), dtype=dtype, param_dtype=param_dtype))
    return policy, value


def compile_update(
    s: RunSettings, cfg: Qwen2Config, mesh: Mesh, batch: int, seq_len: int, donate: bool, compile: bool = True
) -> dict[str, Any]:
    """Lower and compile the update (of `learner.algorithm`) for a B x T batch; memory, FLOPs, compile time, state
    sizes, and the collectives of the compiled program. compile=False: traced only (FLOPs and state sizes, no XLA
    figures). A critic-free objective's state has no critic: its critic figures are 0."""
    policy, value = abstract_models(s, cfg)
    program = UpdateProgram(s.learner, policy, value, mesh, donate=donate)
    state, ref = program.abstract_state(), program.abstract_reference()
    stack = "scanned" if cfg.scan_layers else "unrolled"
    start = time.perf_counter()
    traced = program.fn.trace(state, ref, program.abstract_batch(batch, seq_len))
    # the model's parameters (with LoRA the trained state holds only the adapters: `trained_params`)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    n_trained = sum(math.prod(x.shape) for x in jax.tree.leaves(state.policy))
    ref_bytes = per_device_bytes(ref)
    compiled, lower_s, compile_s, found, oom = None, 0.0, 0.0, [], {}
    if compile:
        lowered = traced.lower()
        lower_s = time.perf_counter() - start
        what = f"the {s.learner.algorithm} update ({stack} layers)"
        print(f"compiling {what}, lowered in {lower_s:.1f} s", file=sys.stderr, flush=True)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:  # libtpu refuses a program that cannot fit its HBM
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise PlanError(f"compiling {what}: {str(e).strip().splitlines()[0]}") from None
            oom = out_of_memory_figures(str(e))
            oom["arguments_gib"] = (per_device_bytes(state) + (0 if program.reference_on_host else ref_bytes)) / GIB
            oom["peak_gib"] = oom["arguments_gib"] + oom.get("temporaries_gib", 0.0)
        compile_s = time.perf_counter() - start
        print(f"compiled {what} in {compile_s:.1f} s", file=sys.stderr, flush=True)
        if compiled:
            found, unknown = hlo_collectives.collectives(compiled.as_text(), mesh.devices.shape, mesh.axis_names)
            if unknown:
                print(f"note: {unknown} loops of unknown trip count in the update", file=sys.stderr, flush=True)
    return {
        "compile_s": compile_s,
        "lower_s": lower_s,
        "flops": matmul_flops(traced.jaxpr.jaxpr),
        "xla_flops_per_device_loop_bodies_once": xla_flops(compiled) if compiled else None,
        "xla": memory_figures(compiled) if compiled else (oom if compile else {}),
        "collectives": found,
        "policy_params": n_params,
        "trained_params": n_trained,
        "params_gib": {
            "policy": per_device_bytes(state.policy) / GIB,
            "critic": per_device_bytes(state.value) / GIB,
            "reference": 0.0 if program.reference_on_host else ref_bytes / GIB,
            "reference_on_host": ref_bytes / GIB if program.reference_on_host else 0.0,
        },
        "optimizer_gib": (per_device_bytes(state.policy_opt) + per_device_bytes(state.value_opt)) / GIB,
    }


def compile_decode(s: RunSettings, cfg: Qwen2Config, mesh: Mesh, batch: int, max_len: int) -> dict[str, Any]:
    """Lower and compile one decode step of the JAX sampler (a token for each of `batch` rows against a
    KV cache of `max_len` slots, then the draw): memory, FLOPs, compile time."""
    policy, _ = abstract_models(s, dataclasses.replace(cfg, scan_layers=False))
    graphdef, params = nnx.split(policy)
    param_sh = shd.param_shardings(params, mesh)
    cache = jax.eval_shape(lambda: policy.init_cache(batch, max_len))

    def cache_sharding(x: jax.ShapeDtypeStruct) -> NamedSharding:
        spec = PartitionSpec(shd.BATCH_AXES, *([None] * (x.ndim - 1))) if x.ndim else PartitionSpec()
        return NamedSharding(mesh, shd.fit_spec(spec, x.shape, mesh))

    cache_sh = jax.tree.map(cache_sharding, cache)
    row_sh = NamedSharding(mesh, shd.fit_spec(PartitionSpec(shd.BATCH_AXES), (batch,), mesh))
    rep = shd.replicated(mesh)

    def step(params, cache, tok, key):
        model = nnx.merge(graphdef, params)
        logits, cache = model(tok[:, None], attention_mask=jnp.ones((batch, 1), jnp.int32), cache=cache)
        new, lp = sample_token(logits[:, 0], key, jnp.float32(1.0), jnp.float32(1.0), jnp.int32(-1))
        return new, lp, cache

    fn = jax.jit(
        step,
        in_shardings=(param_sh, cache_sh, row_sh, rep),
        out_shardings=(row_sh, row_sh, cache_sh),
        donate_argnums=(1,),
    )
    args = (
        params,
        cache,
        jax.ShapeDtypeStruct((batch,), jnp.int32),
        jax.eval_shape(lambda: jax.random.key(0)),
    )
    start = time.perf_counter()
    traced = fn.trace(*args)
    try:
        compiled = traced.lower().compile()
    except jax.errors.JaxRuntimeError as e:
        raise PlanError(f"compiling the decode step: {str(e).strip().splitlines()[0]}") from None
    compile_s = time.perf_counter() - start
    weights = per_device_bytes(jax.tree.map(_abstract_with, nnx.to_pure_dict(params), nnx.to_pure_dict(param_sh)))
    cache_bytes = per_device_bytes(jax.tree.map(_abstract_with, cache, cache_sh))
    return {
        "compile_s": compile_s,
        "batch": batch,
        "cache_slots": max_len,
        "flops_per_step": matmul_flops(traced.jaxpr.jaxpr),
        "xla": memory_figures(compiled),
        "weights_gib": weights / GIB,
        "kv_cache_gib": cache_bytes / GIB,
    }


def _abstract_with(x: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    sh = sharding.get_value() if isinstance(sharding, nnx.Variable) else sharding
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sh)
