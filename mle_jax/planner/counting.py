"""What a program costs, counted: matmul FLOPs of a traced program, bytes per device of sharded shapes, XLA's memory
and cost analyses of a compiled one, and the traffic its collectives send between slices.

FLOPs: XLA's cost analysis counts a loop body once whatever its trip count (the update is loops: epochs,
mini-batches, micro-batches, scanned layers, logit chunks), so the plan's `flops_per_step` counts the matmul FLOPs
of the traced program with each scan's length (`matmul_flops`); XLA's own figure (`xla_flops`) is reported beside it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.sharding import Mesh

from mle_jax.infra import sharding as shd
from mle_jax.planner import hlo_collectives

GIB = 1024**3


def _sub_jaxprs(value: Any) -> list[jex_core.Jaxpr]:
    if isinstance(value, jex_core.ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, jex_core.Jaxpr):
        return [value]
    if isinstance(value, list | tuple):
        return [j for v in value for j in _sub_jaxprs(v)]
    return []


def matmul_flops(jaxpr: jex_core.Jaxpr) -> float:
    """FLOPs of every dot_general a program executes (2 per multiply-add), each scan's body times its length.

    jaxpr: a traced program (`jax.jit(f).trace(...).jaxpr.jaxpr`), before partitioning, so the count is the
    whole program's over all devices. Remat's recomputation is in the jaxpr and counted; a cond counts its
    costliest branch; a while loop's body counts once (its trip count is not static).
    """
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            contract = math.prod(lhs[i] for i in lhs_contract)
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * contract
            continue
        subs = [j for v in eqn.params.values() for j in _sub_jaxprs(v)]
        if not subs:
            continue
        if name == "cond":
            total += max(matmul_flops(j) for j in subs)
        else:
            trips = eqn.params.get("length", 1) if name == "scan" else 1
            total += trips * sum(matmul_flops(j) for j in subs)
    return total


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with shardings (the most any device holds)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


def memory_figures(compiled: jax.stages.Compiled) -> dict[str, float]:
    """XLA's memory analysis of a compiled program per device, in GiB, with `peak_gib` (empty: no analysis)."""
    m = compiled.memory_analysis()
    if m is None:
        return {}
    out = {
        "arguments_gib": m.argument_size_in_bytes / GIB,
        "outputs_gib": m.output_size_in_bytes / GIB,
        "aliased_gib": m.alias_size_in_bytes / GIB,
        "temporaries_gib": m.temp_size_in_bytes / GIB,
        "code_gib": m.generated_code_size_in_bytes / GIB,
        "host_arguments_gib": m.host_argument_size_in_bytes / GIB,
        "host_temporaries_gib": m.host_temp_size_in_bytes / GIB,
    }
    # what the program needs on the device while it runs: its inputs, its outputs that do not reuse an input
    # buffer (donation), its temporaries and its code
    out["peak_gib"] = out["arguments_gib"] + out["outputs_gib"] - out["aliased_gib"] + out["temporaries_gib"]
    out["peak_gib"] += out["code_gib"]
    return out


def out_of_memory_figures(message: str) -> dict[str, Any]:
    """libtpu's refusal ("... required for HLO temporaries (32.14G) exceeds available HBM (30.75G)") as figures:
    the compiler's own temporaries (its G taken as GiB) and its first line."""
    first = message.strip().splitlines()[0]
    out: dict[str, Any] = {"compile_error": first}
    m = re.search(r"required for ([\w ]+?) \(([\d.]+)([KMG])\) exceeds available HBM \(([\d.]+)([KMG])\)", first)
    if m:
        scale = {"K": 2**-20, "M": 2**-10, "G": 1.0}
        key = "temporaries_gib" if m.group(1).endswith("temporaries") else "required_gib"
        out[key] = float(m.group(2)) * scale[m.group(3)]
        out["available_hbm_gib"] = float(m.group(4)) * scale[m.group(5)]
    return out


def xla_flops(compiled: jax.stages.Compiled) -> float | None:
    """XLA's own FLOPs of a compiled program per device, each loop body counted once (None: no cost model)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 (backends without a cost model raise various errors)
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def dcn_traffic(found: list[hlo_collectives.Collective], mesh: Mesh, slices: int) -> dict[str, Any]:
    """What the compiled update sends between slices per step (one call): the collectives whose device groups
    span slices, by op and mesh axes, bytes per device (None for one slice: nothing crosses)."""
    if slices < 2:
        return {"slices": 1, "gib_per_device_per_step": 0.0, "by_op_and_axes": {}}
    flat = list(mesh.devices.flat)
    slice_of_device = {d.id: i for i, g in enumerate(shd.device_slices(flat, slices)) for d in g}
    crossing = hlo_collectives.crossing(found, [slice_of_device[d.id] for d in flat])
    out = hlo_collectives.summary(crossing)
    return {
        "slices": slices,
        "gib_per_device_per_step": out["gib_per_device_per_call"],
        "by_op_and_axes": out["by_op_and_axes"],
        "method": "collectives of the compiled update whose device groups span slices (hlo_collectives): "
        "result bytes on one device x runs per step (the known trip counts of the loops around them)",
    }
