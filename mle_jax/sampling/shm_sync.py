"""Weights to vLLM servers on the learner's host through shared memory (`sampler.sync_source="shm"`): no safetensors
serialisation, no disk.

The learner's side: `SharedWeights.write({HF name: array})` copies the tensors (in HF layout where they live:
`mle_jax.models.hf.hf_device_tensors`) from the device straight into one new POSIX shared-memory segment
(/dev/shm/<name>, `multiprocessing.shared_memory`), each at a 64-byte aligned offset: the device-to-host copy is the
one copy, and all the learner waits for. A manifest of [name, dtype, shape, offset] per tensor describes it.
The vLLM workers' side is vLLM's weight-transfer API with the engine `mle_jax.sampling.vllm_shm_engine` (driven
by `VLLMServer.load_shared`: `/start_weight_update`, `/update_weights`, `/finish_weight_update`): it maps the segment
and hands vLLM's layerwise reload zero-copy torch views of it; every server on the host reads the same segment.
Two segments take turns: a sync writes into the one of the version before the servers' current one (the current one
stays for a server that comes back and must be given it), so host memory holds two copies of the weights; both are
removed when the sampler closes, at the latest when the learner's process exits.

One host: a server on another host cannot map this host's memory (a multi-host run syncs by `hf` or `orbax` files on
shared storage). On a GPU node vLLM's own "ipc" and "nccl" engines take the same calls
(with `/init_weight_transfer_engine` first) with the learner's device arrays as the source; their learner side is
not built here (no GPU to test it on).

This module imports no jax.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

import numpy as np

ALIGN = 64  # bytes: every tensor starts at a multiple (cache lines; any dtype's alignment)
_names = itertools.count()


@dataclass
class SharedWeights:
    """One version of the policy's weights in a shared-memory segment.

    name: the segment's name (/dev/shm/<name> on Linux). manifest: [[HF name, dtype name, shape, byte offset], ...].
    nbytes: the tensors' bytes (the segment may be a little larger: alignment).
    """

    name: str
    manifest: list[list[Any]]
    nbytes: int
    _segment: shared_memory.SharedMemory | None = field(default=None, repr=False)

    @classmethod
    def write(
        cls, tensors: Mapping[str, Any], spare: SharedWeights | None = None, prefix: str = "mle_jax"
    ) -> SharedWeights:
        """A segment holding every tensor of {name: [*shape] array} (C order), and its manifest. A jax array is
        copied from its device into the segment (all transfers started first), a host array copied once.

        spare: a segment no server needs any more (the version before the one they hold): refilled in place when the
        tensors have its layout (the next version of the same model: its pages are mapped already, so the write is
        one memcpy, not fresh pages to allocate and zero), else removed; a new segment otherwise."""
        arrays = {n: x if hasattr(x, "copy_to_host_async") else np.ascontiguousarray(x) for n, x in tensors.items()}
        if not arrays:
            raise ValueError("no tensors to share")
        for x in arrays.values():
            if hasattr(x, "copy_to_host_async"):  # a jax array: every device-to-host transfer in flight at once
                x.copy_to_host_async()
        layout = [[n, x.dtype.name, list(x.shape)] for n, x in arrays.items()]
        if spare is not None and spare._segment is not None and [m[:3] for m in spare.manifest] == layout:
            spare._fill(arrays)
            return spare
        if spare is not None:
            spare.unlink()
        manifest, offset = [], 0
        for entry, x in zip(layout, arrays.values(), strict=True):
            manifest.append([*entry, offset])
            offset += -(-x.nbytes // ALIGN) * ALIGN
        name = f"{prefix}_{os.getpid()}_{next(_names)}"
        segment = shared_memory.SharedMemory(name=name, create=True, size=max(offset, 1))
        shared = cls(name, manifest, sum(x.nbytes for x in arrays.values()), segment)
        shared._fill(arrays)
        return shared

    def _fill(self, arrays: Mapping[str, Any]) -> None:
        """Copies arrays (in manifest order, of its dtypes and shapes) into the segment."""
        for (_, _, _, start), x in zip(self.manifest, arrays.values(), strict=True):
            view = np.ndarray(x.shape, dtype=x.dtype, buffer=self._segment.buf, offset=start)
            np.copyto(view, np.asarray(x), casting="no")
            del view  # no export of segment.buf may outlive close()

    def manifest_json(self) -> str:
        """The manifest as the string `/collective_rpc` carries to the workers."""
        return json.dumps(self.manifest, separators=(",", ":"))

    def unlink(self) -> None:
        """Removes the segment (a worker that has it mapped keeps its mapping until it lets go)."""
        if self._segment is not None:
            self._segment.close()
            self._segment.unlink()
            self._segment = None
