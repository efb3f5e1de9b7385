"""The shared-memory sync (`sampler.sync_source="shm"`) as a vLLM weight-transfer engine: the learner's tensors reach
the workers through vLLM's documented weight-transfer API, the seam vLLM's own CUDA-IPC and NCCL engines plug into.

vLLM >= 0.32 builds one engine per worker from `--weight-transfer-config '{"backend": NAME}'` and drives it through
the dev endpoints `/start_weight_update`, `/update_weights {"update_info": {...}}` and `/finish_weight_update
{"weight_version": V}` (`VLLMServer.load_shared` sends them between `/pause` and `/resume`). This engine's update
names a POSIX shared-memory segment of the learner's host and its manifest (`shm_sync.SharedWeights`); the worker
maps it and hands vLLM's layerwise reload zero-copy views (`vllm_worker.iter_shm`), so the CPU backend repacks its
linear weights as after any reload, and a tied LM head is repacked at the end (`_repack_cpu_weight_sharing_heads`).
On a GPU node the same calls carry vLLM's "ipc" or "nccl" engines with their own update info (not built here: their
trainer side needs CUDA tensors or an NCCL group on the learner's side).

Imported inside the vLLM workers only (it imports vllm): every server we start names this module's
`WeightReloadExtension` (`vllm_worker`'s, re-exported) as its worker extension, so vLLM imports it, and so registers
the engine (`register`, at import), before the worker builds its engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from mle_jax.sampling.vllm_worker import (
    SHM_BACKEND,
    WeightReloadExtension,
    _repack_cpu_weight_sharing_heads,
    iter_shm,
)

__all__ = ["SHM_BACKEND", "ShmWeightTransferEngine", "WeightReloadExtension", "register"]


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    """Nothing to set up: every update names its own segment (a server that restarts needs no handshake)."""


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    """One update: the segment's name (/dev/shm/<name>) and its manifest as JSON ([[name, dtype, shape, offset]])."""

    name: str
    manifest: str


class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """Loads shared-memory segments of the learner's host into the worker's model, in place (layerwise reload)."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tensors = 0  # loaded since the update started

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.tensors = 0
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        import torch
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        def counted():
            for name, tensor in iter_shm(update_info.name, update_info.manifest):
                self.tensors += 1
                yield name, tensor

        with torch.no_grad(), disable_mtp_completeness_check():
            self.model.load_weights(counted())

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        _repack_cpu_weight_sharing_heads(self.model)
        if self.tensors == 0:
            raise RuntimeError("the weight update loaded no tensor")

    def shutdown(self) -> None:
        pass


def register() -> None:
    """Registers the engine under `SHM_BACKEND` with vLLM's engine factory (once per process)."""
    try:
        WeightTransferEngineFactory.register_engine(SHM_BACKEND, ShmWeightTransferEngine)
    except ValueError:  # registered already (the module imported twice in one process)
        pass


register()
