"""vLLM worker extension: reload policy weights from an HF safetensors folder without a restart.

This module is imported INSIDE the vLLM worker processes (the `.vllm-venv` interpreter, or the
GPU node's vLLM install) as the worker extension every server gets (`vllm_server.WORKER_EXTENSION`).
It must stay free of jax and of any mle_jax module that imports jax: only torch, safetensors, numpy
and the standard library, which every vLLM install has, plus tensorstore for the orbax sync source.

Two sources: an HF safetensors folder (the default sync: the learner exports its weights), or the learner's
own orbax checkpoint item (`<workdir>/checkpoints/<step>/learner`, `sampler.sync_source="orbax"`): its policy
arrays are read with tensorstore and put in HF layout with the jax-free table of `mle_jax.models.hf_layout`,
so the learner never writes its weights a second time. A third: a shared-memory segment of the learner's host
(`sampler.sync_source="shm"`, `mle_jax.sampling.shm_sync`): raw tensors and a manifest, mapped, no file at all; it
goes through vLLM's own weight-transfer API as the engine `SHM_BACKEND` (`mle_jax.sampling.vllm_shm_engine`, which
every server loads as its worker extension: it registers the engine and re-exports `WeightReloadExtension`).

vLLM mixes this class into its Worker, so `self` is the worker (`self.model_runner`,
`self.vllm_config`). The client calls it through the dev endpoint
`POST /collective_rpc {"method": "load_weights_from_dir", "args": [path]}` between `/pause` and
`/resume` (see `VLLMServer.reload_weights` in mle_jax/sampling/vllm_server.py).
"""

from __future__ import annotations

import json
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors import safe_open

from mle_jax.models.hf_layout import ours_to_hf


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, object]]:
    """Yields (HF tensor name, CPU torch tensor) for every tensor of every *.safetensors file in path."""

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, fh.get_tensor(name)


def is_orbax_item(path: str | Path) -> bool:
    """Whether `path` is an orbax checkpoint item (an OCDBT array store) rather than an HF folder."""
    return (Path(path) / "manifest.ocdbt").is_file()


def _torch(x: np.ndarray):
    import torch  # optional dependency (every vLLM install has it; mle_jax's own deps do not)

    if x.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: torch reads its bits
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def iter_orbax(path: str | Path, prefix: str = "policy") -> Iterator[tuple[str, object]]:
    """Yields (HF tensor name, CPU torch tensor in HF layout) for every array under `prefix` of the orbax
    checkpoint item at `path` (e.g. the learner item of a step, whose "policy" subtree is our Param tree)."""
    import tensorstore as ts  # optional dependency: the orbax sync source needs it in the vLLM venv

    base = {"driver": "file", "path": str(Path(path).resolve()) + "/"}
    store = ts.KvStore.open({"driver": "ocdbt", "base": base}).result()
    arrays = {}  # dotted array path -> tensorstore driver (orbax writes zarr v2 or v3 metadata)
    for key in store.list().result():
        name, _, leaf = key.decode().rpartition("/")
        if name.startswith(prefix + ".") and leaf in (".zarray", "zarr.json"):
            arrays[name] = "zarr" if leaf == ".zarray" else "zarr3"
    if not arrays:
        raise FileNotFoundError(f"no arrays under {prefix!r} in the orbax item {path}")
    for name, driver in sorted(arrays.items()):
        hf_name, transform = ours_to_hf(tuple(name.split(".")[1:]))
        spec = {"driver": driver, "kvstore": {"driver": "ocdbt", "base": base, "path": name + "/"}}
        x = ts.open(spec, open=True).result().read().result()
        yield hf_name, _torch(np.ascontiguousarray(transform.to_hf(x)))


def iter_weights(path: str | Path) -> Iterator[tuple[str, object]]:
    """The tensors of an HF safetensors folder or of a learner's orbax checkpoint item, in HF names."""
    return iter_orbax(path) if is_orbax_item(path) else iter_safetensors(path)


SHM_BACKEND = (
    "mle_jax_shm"  # the shared-memory engine's name in vLLM's weight-transfer factory (--weight-transfer-config)
)
SHM_DIR = Path("/dev/shm")  # where POSIX shared memory (multiprocessing.shared_memory) lives on Linux


def iter_shm(name: str, manifest: str) -> Iterator[tuple[str, object]]:
    """Yields (HF tensor name, CPU torch tensor) for every entry of `manifest` (JSON [[name, dtype, shape, offset]],
    `shm_sync.SharedWeights.manifest_json`): zero-copy views of the shared-memory segment `name`, mapped copy-on-write
    (writable views, nothing copied unless written). Each view holds the mapping: it is unmapped with the last one."""
    import torch  # optional dependency (every vLLM install has it; mle_jax's own deps do not)

    path = SHM_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"no shared-memory segment {path}: sync_source=shm needs servers on the learner's host")
    with open(path, "rb") as fh:
        mapping = mmap.mmap(fh.fileno(), os.fstat(fh.fileno()).st_size, access=mmap.ACCESS_COPY)
    data = np.frombuffer(mapping, dtype=np.uint8)  # numpy (and torch.from_numpy) keep the mapping alive
    for tensor_name, dtype, shape, offset in json.loads(manifest):
        bits = np.dtype(np.uint16 if dtype == "bfloat16" else dtype)  # numpy has no bfloat16: torch reads its bits
        count = int(np.prod(shape, dtype=np.int64))
        x = torch.from_numpy(data[offset : offset + count * bits.itemsize].view(bits).reshape(shape))
        yield tensor_name, x.view(torch.bfloat16) if dtype == "bfloat16" else x


def _repack_cpu_weight_sharing_heads(model) -> None:
    """Rebuilds the CPU GEMM kernel of each layer that shares its weight with an earlier one (a tied LM head).

    On CPU, vLLM packs each linear weight for oneDNN after loading. A tied LM head has no tensor of
    its own in the checkpoint, so the layerwise reload skips it ("ParallelLMHead: Failed to load
    weights") and it keeps multiplying by the packed *old* embedding, although the shared weight
    itself was updated in place. Re-running its post-load processing packs the current weight.
    The embedding that owns the weight was loaded, and an untied head (Qwen2.5-Coder-0.5B's folder) too, so
    the reload processed them already: repacking every layer that keeps its weight (as before 2026-11-29) packed
    the vocabulary matrix once or twice more per sync (17 % of a Qwen load's samples in py-spy). Linear layers
    drop their weight after packing (numel 0) and were re-packed by the reload; on GPU no layer has
    `cpu_linear`, so this is a no-op there.
    """
    owners = set()  # storage of every weight met so far, in module order (the embedding before the head)
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if weight is None or not hasattr(weight, "data_ptr") or weight.numel() == 0:
            continue
        method = getattr(module, "quant_method", None)
        if weight.data_ptr() in owners and hasattr(module, "cpu_linear") and method is not None:
            method.process_weights_after_loading(module)
        owners.add(weight.data_ptr())


class WeightReloadExtension:
    """Methods added to vLLM's Worker; names are prefixed-unique so they never shadow Worker's own."""

    def load_weights_from_dir(self, path: str) -> dict[str, int | str]:
        """Loads every tensor of the HF safetensors folder (or learner orbax item) `path` into the running model,
        in place. Returns {"path", "tensors", "numel", "seconds"} so the client can check that something was loaded
        (the version of these weights is vLLM's own, set by the client: `VLLMServer.reload_weights`).
        """
        return self._mle_jax_load(iter_weights(path), str(path))

    def _mle_jax_load(self, weights: Iterator[tuple[str, object]], path: str) -> dict:
        """Loads (HF name, CPU tensor) pairs into the running model in place; {"path", "tensors", "numel",
        "seconds"} (seconds: the worker's own, reading the tensors and vLLM's reload).

        Uses vLLM's layerwise in-place reload where the worker has it (vLLM >= 0.11): it restores
        each layer to checkpoint format, loads, and re-runs the kernel-specific post-processing
        (the CPU backend repacks linear weights for oneDNN and drops the original tensor, so a bare
        `param.copy_` would not reach the kernels). Storage is kept, so captured CUDA graphs stay valid.
        """
        counts = {"tensors": 0, "numel": 0}
        start = time.perf_counter()

        def counted() -> Iterator[tuple[str, object]]:
            for name, tensor in weights:
                counts["tensors"] += 1
                counts["numel"] += int(tensor.numel())
                yield name, tensor

        reload = getattr(self, "reload_weights", None)
        if reload is not None:
            reload(weights_iterator=counted(), is_checkpoint_format=True)
        else:  # older vLLM: weights are used as loaded (no repacking), a plain load_weights suffices
            import torch  # optional dependency (every vLLM install has it; mle_jax's own deps do not)

            with torch.no_grad():
                self.model_runner.model.load_weights(counted())
        _repack_cpu_weight_sharing_heads(self.model_runner.model)
        if counts["tensors"] == 0:
            raise RuntimeError(f"no tensors were loaded from {path}")
        return {"path": path, **counts, "seconds": round(time.perf_counter() - start, 4)}
