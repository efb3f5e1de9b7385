"""Run as one of 2 processes x 2 fake CPU devices (XLA_FLAGS and JAX_PLATFORMS set by the caller):
    python -m tests.models.multihost_write_check CHECKPOINT OUT PORT PROCESS_ID
loads CHECKPOINT onto a 2x2 (fsdp, tensor) mesh spanning both processes, then each calls
hf.save_pretrained(OUT/p<PROCESS_ID>) and hf.write_weights(OUT/p<PROCESS_ID>/sync): a folder per
process, so the caller sees which process wrote.
Prints one JSON line: this process's index and whether the embedding is addressable from here alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from mle_jax.infra.sharding import maybe_initialize_distributed
from mle_jax.models import hf

checkpoint, out, port, process_id = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
assert maybe_initialize_distributed(f"127.0.0.1:{port}", 2, process_id)
assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("fsdp", "tensor"))
model = hf.from_pretrained(checkpoint, mesh=mesh)
mine = out / f"p{process_id}"
hf.save_pretrained(model, mine, max_shard_bytes=30_000)
hf.write_weights(model, mine / "sync")
print(
    json.dumps(
        {"process": jax.process_index(), "embed_addressable": model.model.embed_tokens[...].is_fully_addressable}
    ),
    flush=True,
)
jax.distributed.shutdown()
