"""What a plan compiles for: N fake CPU devices, a GPU model through XLA's deviceless GPU compiler, or a TPU slice
through libtpu, with each device's bf16 peak, memory bandwidth and memory (`--target`, `--topology`).

    cpu (default)   N fake CPU devices. XLA:CPU's memory figures do not transfer to accelerators (it keeps far
                    more temporaries live); use it for layouts, FLOPs and the embedded CPU run.
    a100-40, a100-80, h100-80, h200
                    XLA's deviceless GPU compilation from a GPU target description through the CUDA PJRT
                    plugin (no GPU needed): buffer assignment as on the real device. Needs `make aot-env`
                    and the `.aot-venv` interpreter.
    --topology=v5p:2x2x2 (or any TPU topology)
                    compiled for the real TPU topology by libtpu on this host (as MaxText's train_compile.py
                    does). Needs `make aot-env` and the `.aot-venv` interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
from jax.experimental import topologies

from mle_jax.planner.counting import GIB
from mle_jax.planner.errors import PlanError

AOT_PYTHON = ".aot-venv/bin/python"  # `make aot-env`: .venv's packages plus libtpu and the CUDA compile plugin


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
