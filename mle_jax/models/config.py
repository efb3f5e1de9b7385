"""The shape of a Qwen2 / Llama decoder (`Qwen2Config`, read from and written to an HF config.json) and the choices
of how it computes (attention implementation, what remat keeps)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

MODEL_TYPES = ("qwen2", "llama")
ROPE_TYPES = ("default",)  # rope scaling (linear, dynamic, yarn, llama3, ...) is not implemented


ATTENTION = {
    "blocked": "our causal attention in query blocks of attn_block (scores and softmax in float32)",
    "dot_product": "jax.nn.dot_product_attention: cuDNN's flash attention on a GPU in bf16/fp16, XLA's elsewhere; "
    "causal over each row's real tokens, which must come first (right padding, as every training batch here)",
}

# what `remat` keeps from a layer's forward for its backward (jax.checkpoint policies)
REMAT_POLICIES = {
    "full": "nothing: the backward recomputes the whole layer (least memory)",
    "dots": "the outputs of the layer's projections (matmuls without batch dims): the backward recomputes only "
    "the norms, activations, RoPE and attention, not the projection matmuls (more memory, fewer FLOPs)",
}


def remat_policy(name: str) -> Any:
    """`REMAT_POLICIES` name -> the jax.checkpoint policy (None: save nothing)."""
    return {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[name]


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """The fields of an HF Qwen2 or Llama `config.json` that define the network.

    attention_bias: biases on q/k/v (Qwen2: always; Llama: its `attention_bias`).
    attention_out_bias: a bias on o_proj (Llama's `attention_bias` sets both; Qwen2 has none).
    mlp_bias: biases on gate/up/down (Llama's `mlp_bias`; Qwen2 has none).
    """

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 11008
    num_hidden_layers: int = 36
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 128
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    model_type: str = "qwen2"
    attention_bias: bool = True
    attention_out_bias: bool = False
    mlp_bias: bool = False
    remat: bool = False
    remat_policy: str = "full"  # with remat: what the backward keeps from the forward (REMAT_POLICIES)
    scan_layers: bool = False  # training forward as one lax.scan over the stacked layer weights (compile time)
    attn_block: int = 64  # causal attention in query blocks of this size when training (0: one block)
    attention: str = "blocked"  # training attention: "blocked" (ours, above) or "dot_product" (see ATTENTION)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention={self.attention!r} is not one of {tuple(ATTENTION)}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r} is not one of {tuple(REMAT_POLICIES)}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type={self.model_type!r} is not one of {MODEL_TYPES}")
        biases = (self.attention_bias, self.attention_out_bias, self.mlp_bias)
        if self.model_type == "qwen2" and biases != (True, False, False):
            raise ValueError(
                "a qwen2 model has q/k/v biases and no others (attention_bias=True, attention_out_bias=False, "
                f"mlp_bias=False), got {biases}; use model_type='llama' for other bias layouts"
            )
        if self.model_type == "llama" and self.attention_bias != self.attention_out_bias:
            raise ValueError(
                f"a llama model has biases on all of q/k/v/o or on none (attention_bias={self.attention_bias}, "
                f"attention_out_bias={self.attention_out_bias})"
            )

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], source: str = "config") -> Qwen2Config:
        """Builds from an HF Qwen2 or Llama config dict (transformers 4 or 5 layout). Raises on other
        architectures and on features the network does not implement (rope scaling, sliding windows)."""
        model_type = d.get("model_type")
        archs = d.get("architectures") or []
        if model_type not in MODEL_TYPES:
            raise ValueError(
                f"{source}: model_type={model_type!r} (architectures={archs}) is not a Qwen2 or Llama config; "
                f"expected model_type in {MODEL_TYPES}"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act={d['hidden_act']!r}; only 'silu' is supported")
        if d.get("use_sliding_window", False):
            raise ValueError(f"{source}: use_sliding_window=True is not supported")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"{source}: rope_type={rope_type!r} (rope scaling) is not supported; only {ROPE_TYPES} "
                "(plain RoPE with rope_theta)"
            )
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        if model_type == "qwen2":
            biases = {"attention_bias": True, "attention_out_bias": False, "mlp_bias": False}
        else:
            bias = bool(d.get("attention_bias", False))
            biases = {"attention_bias": bias, "attention_out_bias": bias, "mlp_bias": bool(d.get("mlp_bias", False))}
        try:
            heads = int(d["num_attention_heads"])
            head_dim = d.get("head_dim") or int(d["hidden_size"]) // heads
            return cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=int(d["hidden_size"]),
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
                rope_theta=float(theta),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                model_type=model_type,
                **biases,
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=d.get("eos_token_id"),
            )
        except KeyError as e:
            raise ValueError(f"{source}: {model_type} config lacks the field {e.args[0]!r}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF `config.json` dict of this family that transformers (4.x and 5.x) and vLLM load."""
        common = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.model_type == "llama":
            return {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                **common,
                "attention_bias": self.attention_bias,
                "mlp_bias": self.mlp_bias,
                "pretraining_tp": 1,
            }
        return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **common, "use_sliding_window": False}

    def num_parameters(self) -> int:
        """How many parameters a model of this shape has (what its weight files hold), without building it."""
        d, f, hq, hkv, dh = (
            self.hidden_size, self.intermediate_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        )  # fmt: skip
        attention = d * dh * (2 * hq + 2 * hkv)  # q, k, v, o
        attention += dh * (hq + 2 * hkv) if self.attention_bias else 0
        attention += d if self.attention_out_bias else 0
        mlp = 3 * d * f + ((2 * f + d) if self.mlp_bias else 0)
        layer = attention + mlp + 2 * d  # two RMSNorm scales
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + d  # + the final norm

    @classmethod
    def from_model_config(cls, m: Any) -> Qwen2Config:
        """From the `model` section of the run config (configs/base.py: tiny_model(), qwen25_3b_model())."""
        get = m.get if hasattr(m, "get") else (lambda k, default=None: getattr(m, k, default))
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: get(k) for k in fields if get(k) is not None}
        return cls(**kwargs)
