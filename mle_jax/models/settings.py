"""The `model` section of the run config: where the weights come from, or the shape of a fresh model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from mle_jax.models.lora import LoraSettings
from mle_jax.models.qwen2 import Qwen2Config


@dataclass(frozen=True)
class ModelSettings:
    """A checkpoint folder (`path`, an HF folder: its config.json decides the architecture), or, with no
    path, the architecture of a randomly initialised model (a tiny one for the embedded run). dtype, remat
    and attn_block shape the computation either way."""

    path: str = ""
    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    remat_policy: str = "full"  # with remat, what the backward keeps: full (nothing) | dots (projection outputs)
    scan_layers: bool = False  # training forward as one scan over the stacked layers (faster compile at depth)
    attn_block: int = 64  # training attention in causal query blocks of this many tokens (0: one block)
    attention: str = "blocked"  # training attention: blocked (ours) | dot_product (cuDNN flash attention on GPUs)
    lora: LoraSettings = LoraSettings()  # adapters over a frozen base (rank 0: every weight trained)

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):  # the config's section, or a saved run's config.json
            object.__setattr__(self, "lora", LoraSettings(**self.lora))
        for name in ("dtype", "param_dtype"):
            try:
                jnp.dtype(getattr(self, name))
            except TypeError:
                raise ValueError(
                    f"model.{name}={getattr(self, name)!r} is not a dtype (e.g. float32, bfloat16)"
                ) from None

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    def architecture(self) -> Qwen2Config:
        """The shape of a fresh model (used when there is no `path`)."""
        return Qwen2Config.from_model_config(self)

    def runtime_options(self) -> dict[str, Any]:
        """`from_pretrained` keyword arguments that are not in an HF config.json (remat, remat_policy, scan_layers,
        attn_block, attention)."""
        return {"remat": self.remat, "remat_policy": self.remat_policy, "scan_layers": self.scan_layers,
                "attn_block": self.attn_block, "attention": self.attention}  # fmt: skip

    def checkpoint_dir(self) -> Path | None:
        return Path(self.path) if self.path else None
