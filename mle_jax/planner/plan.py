"""The compiled plan of a run config (the library behind `python -m mle_jax.plan`).

Will a config fit, and how long will a step take, on hardware that is not here? The plan builds the run's
learner abstractly (no weights: `nnx.eval_shape`, `jax.ShapeDtypeStruct`), makes the config's mesh over the
target's devices (`planner.targets`), lowers and compiles the real update of its `learner.algorithm` (policy, the
critic where the objective has one, reference, optimizer states, the micro-batch loop) and the sampler's decode step
(`planner.programs`), and reports per device: parameters, optimizer states, XLA's memory analysis (arguments,
outputs, temporaries), the sampler's share, the total and whether it fits; per step: FLOPs (`planner.counting`) and
the projected step time at a stated MFU and peak. `--config.a.b=v` overrides work as in `mle_jax.launch`.

`planner.targets` says how each target's memory figures are produced, `planner.counting` how the FLOPs are counted;
the JSON's `method` says which applied.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mle_jax.infra import sharding as shd
from mle_jax.models.qwen2 import Qwen2Config
from mle_jax.planner.counting import GIB, dcn_traffic
from mle_jax.planner.errors import PlanError
from mle_jax.planner.programs import compile_decode, compile_update, model_config
from mle_jax.planner.targets import Target
from mle_jax.run.settings import RunSettings
from mle_jax.sampling import registry as samplers


def check_layout(s: RunSettings, cfg: Qwen2Config, mesh_shape: tuple[int, int, int], batch: int) -> list[str]:
    """Raise PlanError (one line, the clashing numbers) when the mesh cannot hold the model and batch; returns
    notes on weights that stay replicated along an axis that does not divide them."""
    data, fsdp, tensor = mesh_shape
    if cfg.num_attention_heads % tensor:
        raise PlanError(
            f"model.num_attention_heads={cfg.num_attention_heads} is not a multiple of mesh.tensor={tensor}: "
            "pick a tensor size that divides the heads"
        )
    if cfg.intermediate_size % tensor:
        raise PlanError(f"model.intermediate_size={cfg.intermediate_size} is not a multiple of mesh.tensor={tensor}")
    ppo, div = s.learner.ppo, data * fsdp
    mini = min(ppo.mini_batch_size, batch)
    micro = min(ppo.micro_batch_size, mini)
    if batch % mini or mini % micro:
        raise PlanError(
            f"loop.batch_size={batch}, ppo.mini_batch_size={mini}, ppo.micro_batch_size={micro} do not nest"
        )
    if micro % div:
        fixed = math.lcm(micro, div)
        fix = {"ppo.micro_batch_size": fixed}
        if mini % fixed:
            fix["ppo.mini_batch_size"] = math.lcm(mini, fixed)
        hint = " ".join(f"--config.{k}={v}" for k, v in fix.items())
        if batch % fix.get("ppo.mini_batch_size", mini):
            fix, hint = {}, f"a batch that {div} devices divide, or devices on mesh.tensor"
        raise PlanError(
            f"ppo.micro_batch_size={micro} is not a multiple of mesh data*fsdp = {data}*{fsdp} = {div}: set {hint}",
            fix,
        )
    notes = []
    if cfg.num_key_value_heads % tensor:
        notes.append(
            f"{cfg.num_key_value_heads} kv heads over tensor={tensor}: k/v projections stay replicated on that axis"
        )
    if cfg.vocab_size % tensor:
        notes.append(f"vocab {cfg.vocab_size} over tensor={tensor}: embeddings stay replicated on that axis")
    return notes


def make_plan(
    s: RunSettings,
    target: Target,
    device_memory_gib: float,
    mfu: float = 0.4,
    peak_tflops: float | None = None,
    compare_scan: bool = False,
    decode: bool = True,
    update: bool = True,
) -> dict[str, Any]:
    """The plan of run settings `s` on `target`'s devices (see the module docstring); a JSON-able dict.
    update=False traces the PPO update without compiling it (FLOPs and state sizes; no learner memory, no fit)."""
    cfg = model_config(s)
    n = len(target.devices)
    try:
        mesh_shape = shd.mesh_shape(s.mesh, n)
    except ValueError as e:
        raise PlanError(f"mesh: {e}") from None
    # the learner's rows: B episodes, one row each (one turn, or a conversation with "episode" credit) or one per turn
    # ("episode" credit in the state context), or B turns ("turn" credit); a conversation of K turns is K responses and
    # K - 1 observations long (agent.turns)
    batch = s.loop.batch_size * s.rollout.agent.rows_per_batch_item
    seq_len = s.rollout.max_sequence_tokens
    bucket = s.learner.ppo.seq_bucket
    if bucket and seq_len % bucket:
        seq_len += bucket - seq_len % bucket
    notes = check_layout(s, cfg, mesh_shape, batch)
    try:
        mesh = shd.make_mesh(s.mesh, target.devices)
    except (ValueError, AssertionError, NotImplementedError) as e:  # mesh_utils asserts on layouts it cannot map
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PlanError(f"mesh {dict(zip(shd.MESH_AXES, mesh_shape, strict=True))} on {target.name}: {first}") from None
    donate = target.platform != "cpu"
    upd = compile_update(s, cfg, mesh, batch, seq_len, donate, compile=update)
    layer_stack = {("scanned" if cfg.scan_layers else "unrolled"): _stack_entry(upd)} if update else {}
    if compare_scan and update:
        other = dataclasses.replace(cfg, scan_layers=not cfg.scan_layers)
        layer_stack[("scanned" if other.scan_layers else "unrolled")] = _stack_entry(
            compile_update(s, other, mesh, batch, seq_len, donate)
        )
    update_info = upd
    learner_gib = upd["xla"].get("peak_gib", 0.0)

    n_samplers = 1 + (s.instrument.mode == "lm")  # the policy's and the LM instrumenter's
    dec = compile_decode(s, cfg, mesh, batch, seq_len) if decode else None
    decode_gib = dec["xla"].get("peak_gib", 0.0) if dec else 0.0
    # the sampler's own estimate (its registered class's `memory`: vLLM's share of the device, the JAX decode step)
    memory = samplers.resolve(s.sampler.backend).memory(s.sampler, n_samplers, device_memory_gib, decode_gib)
    sampler: dict[str, Any] = {"backend": s.sampler.backend, **memory}
    total = learner_gib + sampler["gib"]

    peak = peak_tflops if peak_tflops is not None else target.peak_tflops
    flops = update_info["flops"]
    step_s = flops / (n * peak * 1e12 * mfu) if peak else None
    tokens = batch * seq_len
    per_device = {
        "params_gib": update_info["params_gib"],
        "optimizer_gib": update_info["optimizer_gib"],
        "xla": update_info["xla"],
        "learner_gib": learner_gib,
        "sampler_gib": sampler["gib"],
        "total_gib": total,
        "device_memory_gib": device_memory_gib,
    }
    plan = {
        "config": {
            "algorithm": s.learner.algorithm,
            "batch": batch,
            "seq_len": seq_len,
            "micro_batch": s.learner.ppo.micro_batch_size,
            "mini_batch": s.learner.ppo.mini_batch_size,
            "epochs": s.learner.ppo.epochs,
            "logits_chunk": s.learner.ppo.logits_chunk,
            "remat": cfg.remat,
            "remat_policy": cfg.remat_policy,
            "fused_logprobs": s.learner.ppo.fused_logprobs,
            "scan_layers": cfg.scan_layers,
            "dtype": s.model.dtype,
            "master_dtype": s.learner.optim.master_dtype,
            "layers": cfg.num_hidden_layers,
            "vocab": cfg.vocab_size,
        },  # fmt: skip
        "policy_params": update_info["policy_params"],
        "trained_params": update_info.get("trained_params", update_info["policy_params"]),
        "devices": n,
        "device_kind": target.devices[0].device_kind,
        "slices": int(s.mesh.dcn_data),
        "target": target.name,
        "platform": target.platform,
        "mesh": dict(zip(shd.MESH_AXES, mesh_shape, strict=True)),
        "fits": (total <= device_memory_gib and "compile_error" not in upd["xla"]) if update else None,
        "update_compiled": update,
        "per_device": per_device,
        "sampler": sampler,
        "flops_per_step": flops,
        "xla_flops_per_device_loop_bodies_once": update_info["xla_flops_per_device_loop_bodies_once"],
        "tokens_per_step": tokens,
        "mfu": mfu,
        "peak_tflops_per_device": peak,
        "projected_step_s": step_s,
        "projected_tokens_per_s": tokens / step_s if step_s else None,
        "compile_s": update_info["compile_s"],
        "layer_stack": layer_stack,
        "decode": dec,
        "method": {
            "memory": target.memory_method,
            "params_and_optimizer": "shapes x dtypes / the shards each device holds (exact)",
            "sampler": sampler["method"],
            "flops": "matmul FLOPs of the traced update, each scan's body times its length (matmul_flops)",
            "step_time": f"flops_per_step / (devices x {peak} TFLOP/s peak x MFU {mfu}) (assumed MFU)",
        },
        "notes": notes,
        "dcn": dcn_traffic(upd["collectives"], mesh, int(s.mesh.dcn_data))
        if update and "compile_error" not in upd["xla"]
        else None,
    }
    if dec and target.hbm_gb_s:
        step = (dec["weights_gib"] + dec["kv_cache_gib"]) * GIB / (target.hbm_gb_s * 1e9)
        dec["projected_tokens_per_s_hbm_bound"] = batch / step
    return plan


def _stack_entry(update: dict[str, Any]) -> dict[str, float]:
    return {
        "compile_s": update["compile_s"],
        "lower_s": update["lower_s"],
        "temporaries_gib": update["xla"].get("temporaries_gib", 0.0),
        "peak_gib": update["xla"].get("peak_gib", 0.0),
    }


def format_plan(p: dict[str, Any]) -> str:
    """The plan as a table for the terminal."""
    d = p["per_device"]
    x = d["xla"]
    gib = lambda v: f"{v:8.2f} GiB"  # noqa: E731
    rows = [
        f"plan: {p['config']['layers']}-layer model ({p['policy_params'] / 1e9:.2f} B params"
        + (
            ""
            if p.get("trained_params", p["policy_params"]) == p["policy_params"]
            else f", {p['trained_params'] / 1e6:.2f} M trained: LoRA"
        )
        + f"), {p['devices']} x "
        f"{p['target']} ({p['platform']}), mesh {p['mesh']}, batch {p['config']['batch']} x {p['config']['seq_len']}, "
        f"learner.algorithm {p['config'].get('algorithm', 'ppo')}",
        "per device",
        f"  policy params (master)      {gib(d['params_gib']['policy'])}",
        f"  critic params (master)      {gib(d['params_gib']['critic'])}",
        f"  reference params            {gib(d['params_gib']['reference'])}",
        f"  optimizer states            {gib(d['optimizer_gib'])}",
        f"  XLA arguments               {gib(x.get('arguments_gib', 0))}",
        f"  XLA outputs (not aliased)   {gib(x.get('outputs_gib', 0) - x.get('aliased_gib', 0))}",
        f"  XLA temporaries             {gib(x.get('temporaries_gib', 0))}",
        f"  learner peak                {gib(d['learner_gib'])}",
        f"  sampler ({p['sampler']['backend']:>4})               {gib(d['sampler_gib'])}",
        f"  total                       {gib(d['total_gib'])}  of {d['device_memory_gib']:.1f} GiB: "
        + {True: "FITS", False: "DOES NOT FIT", None: "the update was not compiled (--noupdate)"}[p["fits"]],
        "per step",
        f"  FLOPs                       {p['flops_per_step']:.3e}",
    ]
    if p["projected_step_s"]:
        rows.append(
            f"  projected step              {p['projected_step_s']:8.2f} s at MFU {p['mfu']} of "
            f"{p['peak_tflops_per_device']} TFLOP/s ({p['projected_tokens_per_s']:.0f} tokens/s)"
        )
    for name, e in p["layer_stack"].items():
        rows.append(
            f"  compile ({name:>8})          {e['compile_s']:8.1f} s  (temporaries {e['temporaries_gib']:.2f} GiB)"
        )
    if p["decode"]:
        dec = p["decode"]
        rows.append(
            f"decode step (batch {dec['batch']}, {dec['cache_slots']} slots): weights {dec['weights_gib']:.2f} GiB, "
            f"KV cache {dec['kv_cache_gib']:.2f} GiB, temporaries {dec['xla'].get('temporaries_gib', 0):.2f} GiB, "
            f"compile {dec['compile_s']:.1f} s"
        )
    if p.get("dcn") and p["dcn"]["slices"] > 1:
        dcn = p["dcn"]
        rows.append(
            f"across {dcn['slices']} slices (DCN), per device per step: {dcn['gib_per_device_per_step']:.3f} GiB in "
            + ", ".join(f"{k} (x{v['runs_per_call']})" for k, v in dcn["by_op_and_axes"].items())
        )
    if x.get("compile_error"):
        rows.append(f"the compiler: {x['compile_error']}")
    rows += [f"note: {n}" for n in p["notes"]]
    rows.append(f"memory method: {p['method']['memory']}")
    return "\n".join(rows)
