"""The compiled plan of a run config (the library behind `python -m mle_jax.plan`).

Will a config fit, and how long will a step take, on hardware that is not here? The plan builds the run's
learner abstractly (no weights: `nnx.eval_shape`, `jax.ShapeDtypeStruct`), makes the config's mesh over the
target's devices, lowers and compiles the real update of its `learner.algorithm` (policy, the critic where the
objective has one, reference, optimizer states, the micro-batch loop) and the sampler's decode step, and reports
per device: parameters, optimizer states, XLA's memory analysis (arguments, outputs, temporaries), the sampler's
share, the total and whether it fits; per step: FLOPs and the projected step time at a stated MFU and peak.
`--config.a.b=v` overrides work as in `mle_jax.launch`.

Targets (`--target`, or `--topology` for a TPU slice) and how each number is produced (the JSON says which):

    cpu (default)   N fake CPU devices. XLA:CPU's memory figures do not transfer to accelerators (it keeps far
                    more temporaries live); use it for layouts, FLOPs and the embedded CPU run.
    a100-40, a100-80, h100-80, h200
                    XLA's deviceless GPU compilation from a GPU target description through the CUDA PJRT
                    plugin (no GPU needed): buffer assignment as on the real device. Needs `make aot-env`
                    and the `.aot-venv` interpreter.
    --topology=v5p:2x2x2 (or any TPU topology)
                    compiled for the real TPU topology by libtpu on this host (as MaxText's train_compile.py
                    does). Needs `make aot-env` and the `.aot-venv` interpreter.

FLOPs: XLA's cost analysis counts a loop body once whatever its trip count (the update is loops: epochs,
mini-batches, micro-batches, scanned layers, logit chunks), so `flops_per_step` counts the matmul FLOPs of
the traced program with each scan's length (`matmul_flops`); XLA's own figure is reported beside it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import topologies
from jax.extend import core as jex_core
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mle_jax.infra import sharding as shd
from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.value import Qwen2ValueModel
from mle_jax.planner import hlo_collectives
from mle_jax.rl.learner import UpdateProgram
from mle_jax.run.settings import RunSettings
from mle_jax.sampling.jax_sampler import sample_token

GIB = 1024**3
AOT_PYTHON = ".aot-venv/bin/python"  # `make aot-env`: .venv's packages plus libtpu and the CUDA compile plugin


class PlanError(ValueError):
    """A plan that cannot be made as asked; the message is one line naming the numbers that clash. `fix`: the
    config overrides that the message names, when there are ({"ppo.micro_batch_size": 16})."""

    def __init__(self, message: str, fix: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.fix = dict(fix or {})


@dataclass(frozen=True)
class GpuTarget:
    """A GPU model as XLA's GPU compiler needs it (a GpuTargetConfigProto) plus its bf16 peak and memory.

    The fields are the device's public specifications (NVIDIA data sheets; the same numbers XLA keeps in
    xla/backends/gpu/target_config/specs)."""

    name: str
    memory_gib: float
    peak_bf16_tflops: float  # dense
    hbm_gb_s: float
    cores: int
    compute_capability: tuple[int, int]
    clock_ghz: float
    l2_bytes: int
    shared_memory_per_core: int
    shared_memory_per_block_optin: int
    fpus_per_core: int

    def target_config(self) -> str:
        """The GpuTargetConfigProto text that the CUDA plugin compiles for."""
        memory = int(self.memory_gib * GIB)
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_core}
  threads_per_core_limit: 2048
  core_count: {self.cores}
  fpus_per_core: {self.fpus_per_core}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.hbm_gb_s * 1e9)}
  l2_cache_size: {self.l2_bytes}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {memory}
  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {self.compute_capability[0]} minor: {self.compute_capability[1]} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  device_vendor: "NVIDIA Corporation"
  name: "{self.name}"
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
device_description_str: "{self.name}"
"""


GPU_TARGETS = {
    "a100-40": GpuTarget("NVIDIA A100-SXM4-40GB", 40, 312, 1555, 108, (8, 0), 1.41, 40 << 20, 167936, 166912, 64),
    "a100-80": GpuTarget("NVIDIA A100-SXM4-80GB", 80, 312, 2039, 108, (8, 0), 1.41, 40 << 20, 167936, 166912, 64),
    "h100-80": GpuTarget("NVIDIA H100 80GB HBM3", 80, 989, 3352, 132, (9, 0), 1.98, 50 << 20, 233472, 232448, 128),
    "h200": GpuTarget("NVIDIA H200", 141, 989, 4800, 132, (9, 0), 1.98, 50 << 20, 233472, 232448, 128),
}


@dataclass(frozen=True)
class TpuChip:
    """One TPU generation as the planner needs it: per-chip figures from Google Cloud's TPU pages, and the
    device layout JAX uses on that hardware."""

    peak_bf16_tflops: float  # dense, per chip
    hbm_gib: float
    hbm_gb_s: float
    device_kind: str  # jax.Device.device_kind on this generation
    # two TensorCores per chip driven as one device (the runtime's default "megacore" mode on v4 and v5p);
    # v5e and v6e have one core per chip. Accelerator names count cores when megacore (v4-8: 4 chips)
    megacore: bool
    dims: int  # topology dimensions: 3 (a torus, AxBxC) or 2 (AxB)


TPU_CHIPS = {
    "v4": TpuChip(275, 32, 1200, "TPU v4", True, 3),
    "v5e": TpuChip(197, 16, 819, "TPU v5 lite", False, 2),
    "v5p": TpuChip(459, 95, 2765, "TPU v5", True, 3),
    "v6e": TpuChip(918, 32, 1640, "TPU v6 lite", False, 2),
}
# the slice shapes Cloud TPU offers, by chips (v5e and v6e: 2-D; v4 and v5p: 3-D)
_SLICE_SHAPES = {
    2: {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
    3: {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8", 512: "8x8x8"},
}


# --------------------------------------------------------------------------------------------
# Devices and the model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where the plan compiles for: the devices, and what the JSON says about them."""

    devices: list[Any]
    platform: str  # "cpu" | "gpu" | "tpu"
    name: str
    memory_method: str
    peak_tflops: float  # per device, dense bf16 (0: unknown)
    hbm_gb_s: float  # per device (0: unknown)
    memory_gib: float  # the device's own memory (0: unknown)


def cpu_target(n: int) -> Target:
    """n fake CPU devices (XLA:CPU). Must run before anything initialises JAX's CPU backend."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        pass  # the backend is up already (say, in a test process): use the devices it has
    devices = jax.devices("cpu")
    if len(devices) < n:
        raise PlanError(
            f"--devices={n} but this process has {len(devices)} CPU devices; run the plan in a fresh process"
        )
    return Target(devices[:n], "cpu", "cpu", "xla-cpu-compile (XLA:CPU buffer assignment)", 0.0, 0.0, 0.0)


def gpu_target(name: str, n: int) -> Target:
    """n GPUs of model `name` (GPU_TARGETS), compile-only: XLA's deviceless GPU compilation."""
    gpu = GPU_TARGETS[name]
    jax.config.update("jax_platforms", "cpu")  # never look for a real GPU: compile only
    hosts = max(1, math.ceil(n / 8))
    if n % hosts:
        raise PlanError(f"--devices={n} GPUs do not split evenly over {hosts} nodes of at most 8")
    topology = f"1x{hosts}x{n // hosts}"
    try:
        desc = topologies.get_topology_desc(topology, "cuda", target_config=gpu.target_config(), topology=topology)
    except NotImplementedError:
        raise PlanError(
            f"--target={name} compiles with JAX's CUDA plugin, which this interpreter lacks: run `make aot-env`, "
            f"then {AOT_PYTHON} -m mle_jax.plan ..."
        ) from None
    method = f"xla-gpu-deviceless-compile ({gpu.name} target description, CUDA PJRT plugin, no GPU)"
    return Target(list(desc.devices), "gpu", name, method, gpu.peak_bf16_tflops, gpu.hbm_gb_s, gpu.memory_gib)


@dataclass(frozen=True)
class TpuSlice:
    """A TPU slice asked for by topology (v5p:2x2x2) or accelerator type (v5p-16, v5e-8)."""

    generation: str
    shape: str  # "2x2x2"
    chips: int

    @property
    def topology(self) -> str:
        return f"{self.generation}:{self.shape}"

    @property
    def accelerator(self) -> str:
        """Cloud TPU's accelerator type: cores for megacore generations (v4-8 is 4 chips), else chips."""
        return f"{self.generation}-{self.chips * (2 if TPU_CHIPS[self.generation].megacore else 1)}"

    def larger(self) -> TpuSlice | None:
        """The next slice size Cloud TPU offers of this generation (twice the chips), or None."""
        shapes = _SLICE_SHAPES[TPU_CHIPS[self.generation].dims]
        bigger = sorted(c for c in shapes if c > self.chips)
        return TpuSlice(self.generation, shapes[bigger[0]], bigger[0]) if bigger else None


def tpu_slice(spec: str) -> TpuSlice:
    """'v5p:2x2x2' or 'v5p-16' -> TpuSlice; PlanError (one line) for an unknown generation or shape."""
    text = spec.strip().lower()
    gen, sep, rest = text.partition(":") if ":" in text else text.partition("-")
    gen = {"v5litepod": "v5e", "v5lite": "v5e", "v6litepod": "v6e"}.get(gen, gen)
    if gen not in TPU_CHIPS or not sep or not rest:
        raise PlanError(
            f"--topology={spec}: not a TPU slice of a known generation; use GEN:SHAPE or GEN-SIZE with GEN in "
            f"{sorted(TPU_CHIPS)}, e.g. v5p:2x2x2, v4-8, v5e-8"
        )
    chip = TPU_CHIPS[gen]
    shapes = _SLICE_SHAPES[chip.dims]
    if sep == "-":
        size = int(rest) if rest.isdigit() else 0
        chips = size // 2 if chip.megacore else size
        if chips not in shapes or (chip.megacore and size % 2):
            sizes = [c * (2 if chip.megacore else 1) for c in shapes]
            raise PlanError(f"--topology={spec}: {gen} slices come in sizes {sizes}")
        return TpuSlice(gen, shapes[chips], chips)
    dims = rest.split("x")
    if len(dims) != chip.dims or not all(d.isdigit() and int(d) > 0 for d in dims):
        example = "2x2x2" if chip.dims == 3 else "2x4"
        raise PlanError(f"--topology={spec}: a {gen} topology has {chip.dims} dimensions, e.g. {gen}:{example}")
    return TpuSlice(gen, rest, math.prod(int(d) for d in dims))


def tpu_target(topology: str, n: int, num_slices: int = 1) -> Target:
    """The chips of `num_slices` TPU slices of a topology such as v5p:2x2x2 (or v5p-16), compile-only through
    libtpu, one device per chip as JAX sees the hardware (megacore on v4 and v5p)."""
    sl = tpu_slice(topology)
    chip = TPU_CHIPS[sl.generation]
    jax.config.update("jax_platforms", "cpu")  # no device backends (nor the CUDA plugin's checks): compile only
    kwargs: dict[str, Any] = {"chip_config_name": "megacore"} if chip.megacore else {}
    if num_slices > 1:
        kwargs["num_slices"] = num_slices
    try:
        desc = topologies.get_topology_desc(sl.topology, "tpu", **kwargs)
    except Exception as e:  # noqa: BLE001 (libtpu reports a bad topology as RuntimeError, ValueError, ...)
        text = str(e).strip()
        if "not installed" in text or "No module named" in text:
            raise PlanError(
                f"--topology={topology} compiles with libtpu, which this interpreter lacks: run `make aot-env`, "
                f"then {AOT_PYTHON} -m mle_jax.plan ..."
            ) from None
        raise PlanError(f"--topology={topology}: libtpu: {(text.splitlines() or [type(e).__name__])[0]}") from None
    devices = list(desc.devices)
    if len(devices) != sl.chips * num_slices:
        raise PlanError(
            f"--topology={topology}: libtpu made {len(devices)} devices for {num_slices} x {sl.chips} chips"
        )
    if n and n != sl.chips:
        raise PlanError(f"--devices={n} but topology {sl.topology} has {sl.chips} chips")
    name = sl.accelerator if num_slices == 1 else f"{num_slices}x {sl.accelerator}"
    mode = ", megacore: one device per chip" if chip.megacore else ""
    slices = f", {num_slices} slices" if num_slices > 1 else ""
    method = f"xla-tpu-compile (libtpu, topology {sl.topology}{slices}{mode})"
    return Target(devices, "tpu", name, method, chip.peak_bf16_tflops, chip.hbm_gb_s, chip.hbm_gib)


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


# --------------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------------


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


def _memory(compiled: jax.stages.Compiled) -> dict[str, float]:
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


def _out_of_memory(message: str) -> dict[str, Any]:
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


def _xla_flops(compiled: jax.stages.Compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 (backends without a cost model raise various errors)
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


# --------------------------------------------------------------------------------------------
# The two programs
# --------------------------------------------------------------------------------------------


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
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state.policy))
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
            oom = _out_of_memory(str(e))
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
        "xla_flops_per_device_loop_bodies_once": _xla_flops(compiled) if compiled else None,
        "xla": _memory(compiled) if compiled else (oom if compile else {}),
        "collectives": found,
        "policy_params": n_params,
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
        "xla": _memory(compiled),
        "weights_gib": weights / GIB,
        "kv_cache_gib": cache_bytes / GIB,
    }


def _abstract_with(x: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    sh = sharding.get_value() if isinstance(sharding, nnx.Variable) else sharding
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sh)


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


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


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
    batch = s.loop.batch_size
    seq_len = s.rollout.prompt.max_prompt_tokens + s.rollout.sampling.max_tokens
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

    n_servers = 1 + (s.instrument.mode == "lm")
    sampler: dict[str, Any] = {"backend": s.sampler.backend}
    dec = compile_decode(s, cfg, mesh, batch, seq_len) if decode else None
    if s.sampler.backend == "vllm":
        sampler["servers_per_device"] = n_servers
        sampler["gpu_memory_utilization"] = s.sampler.vllm_gpu_memory_utilization
        sampler["gib"] = n_servers * s.sampler.vllm_gpu_memory_utilization * device_memory_gib
        sampler["method"] = "vllm servers: sampler.vllm_gpu_memory_utilization x device memory, each"
    else:
        sampler["gib"] = dec["xla"].get("peak_gib", 0.0) if dec else 0.0
        sampler["method"] = "the JAX sampler's decode step (XLA memory analysis: its weights, KV cache, temporaries)"
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
            "scan_layers": cfg.scan_layers,
            "dtype": s.model.dtype,
            "master_dtype": s.learner.optim.master_dtype,
            "layers": cfg.num_hidden_layers,
            "vocab": cfg.vocab_size,
        },  # fmt: skip
        "policy_params": update_info["policy_params"],
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
        f"plan: {p['config']['layers']}-layer model ({p['policy_params'] / 1e9:.2f} B params), {p['devices']} x "
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


def make_target(target: str, topology: str, devices: int, num_slices: int = 1) -> Target:
    """The devices to plan for: a TPU topology's chips (times num_slices), else `devices` (per slice) CPUs or
    GPUs of model `target`."""
    if num_slices < 1:
        raise PlanError(f"--num_slices must be >= 1, got {num_slices}")
    if topology:
        return tpu_target(topology, devices, num_slices)
    if devices < 1:
        raise PlanError("--devices must be >= 1 (or give --topology)")
    if target == "cpu":
        return cpu_target(devices * num_slices)
    if target not in GPU_TARGETS:
        raise PlanError(f"--target={target}: not one of cpu, {', '.join(GPU_TARGETS)}")
    return gpu_target(target, devices * num_slices)
