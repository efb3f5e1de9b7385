"""Run in a subprocess with 4 fake CPU devices (XLA_FLAGS set by the caller): loads a checkpoint onto a
2x2 (fsdp, tensor) mesh and prints the max logit difference to the unsharded load, plus shardings."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh

from mle_jax.models import hf
from tests.models.reference import jax_logits

path = sys.argv[1]
assert len(jax.devices()) == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("fsdp", "tensor"))
sharded = hf.from_pretrained(path, mesh=mesh)
plain = hf.from_pretrained(path)
tokens = np.random.RandomState(0).randint(0, plain.config.vocab_size, (4, 8))
layer = sharded.model.layers[0]


def spec(param) -> list:
    """The PartitionSpec padded to the array's rank (a spec may omit trailing Nones)."""
    s = list(param[...].sharding.spec)
    return s + [None] * (param[...].ndim - len(s))


print(
    json.dumps(
        {
            "max_diff": float(np.abs(jax_logits(sharded, tokens) - jax_logits(plain, tokens)).max()),
            "q_proj": spec(layer.attn.q_proj),
            "q_proj_devices": len(layer.attn.q_proj[...].sharding.device_set),
            "k_proj": spec(layer.attn.k_proj),
            "down_proj": spec(layer.mlp.down_proj),
            "shard_shape": list(layer.mlp.down_proj[...].addressable_shards[0].data.shape),
        }
    )
)
