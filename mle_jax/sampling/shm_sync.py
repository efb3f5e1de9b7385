"""Weights to vLLM servers on the learner's host through shared memory (`sampler.sync_source="shm"`): no safetensors
serialisation, no disk.

The learner's side: `SharedWeights.write({HF name: array})` copies the tensors (in HF layout where they live:
`mle_jax.models.hf.hf_device_tensors`) from the device straight into one new POSIX shared-memory segment
(/dev/shm/<name>, `multiprocessing.shared_memory`), each at a 64-byte aligned offset: the device-to-host copy is the
one copy, and all the learner waits for. A manifest of [name, dtype, shape, offset] per tensor describes it.
The vLLM workers' side (`mle_jax.sampling.vllm_worker.WeightReloadExtension.load_weights_from_shm`, called through
`/collective_rpc` like the folder reload) maps the segment and hands vLLM's in-place reload zero-copy torch views of
it; every server on the host reads the same segment. A segment is removed once the next version is loaded
everywhere (it stays while it is the version a returning server must be given), and at the latest when the learner's
process exits.

One host: a server on another host cannot map this host's memory (a multi-host run syncs by `hf` or `orbax` files on
shared storage). The seam is `ServerPool.load(source, version, reload)`: on a GPU node vLLM's own weight-transfer
engines (CUDA IPC on one node, NCCL across nodes: the `/init_weight_transfer_engine`, `/start_weight_update`,
`/update_weights`, `/finish_weight_update` endpoints of `vllm.entrypoints.rl.online`, vLLM >= 0.32) would be one more
`reload` there, with the learner's device arrays as the source; not built here (no GPU to test it on).

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
    def write(cls, tensors: Mapping[str, Any], prefix: str = "mle_jax") -> SharedWeights:
        """A new segment holding every tensor of {name: [*shape] array} (C order), and its manifest. A jax array is
        copied from its device into the segment (all transfers started first), a host array copied once."""
        manifest, offset = [], 0
        arrays = {n: x if hasattr(x, "copy_to_host_async") else np.ascontiguousarray(x) for n, x in tensors.items()}
        for x in arrays.values():
            if hasattr(x, "copy_to_host_async"):  # a jax array: every device-to-host transfer in flight at once
                x.copy_to_host_async()
        if not arrays:
            raise ValueError("no tensors to share")
        for name, x in arrays.items():
            manifest.append([name, x.dtype.name, list(x.shape), offset])
            offset += -(-x.nbytes // ALIGN) * ALIGN
        name = f"{prefix}_{os.getpid()}_{next(_names)}"
        segment = shared_memory.SharedMemory(name=name, create=True, size=max(offset, 1))
        for (_, _, _, start), x in zip(manifest, arrays.values(), strict=True):
            view = np.ndarray(x.shape, dtype=x.dtype, buffer=segment.buf, offset=start)
            np.copyto(view, np.asarray(x), casting="no")
            del view  # no export of segment.buf may outlive close()
        return cls(name, manifest, sum(x.nbytes for x in arrays.values()), segment)

    def manifest_json(self) -> str:
        """The manifest as the string `/collective_rpc` carries to the workers."""
        return json.dumps(self.manifest, separators=(",", ":"))

    def unlink(self) -> None:
        """Removes the segment (a worker that has it mapped keeps its mapping until it lets go)."""
        if self._segment is not None:
            self._segment.close()
            self._segment.unlink()
            self._segment = None
