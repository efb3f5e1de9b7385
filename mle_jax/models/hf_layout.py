"""The HF <-> ours layout table of Qwen2/Llama weights, free of jax (numpy and regexes only).

One table, `HF_RULES`: an HF tensor name pattern, the path of our Param, and a layout transform (HF nn.Linear
stores [out, in]; we store [in, heads, head_dim] and friends). `mle_jax.models.hf` reads and writes HF folders
with it; the vLLM worker (`mle_jax.sampling.vllm_worker`, in an interpreter without jax) uses it to load the
learner's orbax checkpoint directly.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np

# --------------------------------------------------------------------------------------------
# Layout transforms: hf -> ours (given our shape), ours -> hf, and the HF shape for a given our shape
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Transform:
    to_ours: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]]


IDENTITY = Transform(lambda a, s: a, lambda a: a, lambda s: s)
TRANSPOSE = Transform(lambda a, s: a.T, lambda a: a.T, lambda s: s[::-1])
# q/k/v: HF [H*Dh, D] <-> ours [D, H, Dh]
IN_HEADS = Transform(
    lambda a, s: a.T.reshape(s),
    lambda a: a.reshape(a.shape[0], -1).T,
    lambda s: (s[1] * s[2], s[0]),
)
# q/k/v bias: HF [H*Dh] <-> ours [H, Dh]
BIAS_HEADS = Transform(lambda a, s: a.reshape(s), lambda a: a.reshape(-1), lambda s: (s[0] * s[1],))
# o_proj: HF [D, H*Dh] <-> ours [H, Dh, D]
OUT_HEADS = Transform(
    lambda a, s: a.T.reshape(s),
    lambda a: a.reshape(-1, a.shape[-1]).T,
    lambda s: (s[2], s[0] * s[1]),
)

_L = r"model\.layers\.(\d+)\."
HF_RULES: tuple[tuple[str, tuple[str, ...], Transform], ...] = (
    (r"model\.embed_tokens\.weight", ("model", "embed_tokens"), IDENTITY),
    (r"model\.norm\.weight", ("model", "norm", "scale"), IDENTITY),
    (r"lm_head\.weight", ("lm_head",), TRANSPOSE),
    (_L + r"input_layernorm\.weight", ("model", "layers", "{0}", "input_layernorm", "scale"), IDENTITY),
    (
        _L + r"post_attention_layernorm\.weight",
        ("model", "layers", "{0}", "post_attention_layernorm", "scale"),
        IDENTITY,
    ),
    (_L + r"self_attn\.q_proj\.weight", ("model", "layers", "{0}", "attn", "q_proj"), IN_HEADS),
    (_L + r"self_attn\.k_proj\.weight", ("model", "layers", "{0}", "attn", "k_proj"), IN_HEADS),
    (_L + r"self_attn\.v_proj\.weight", ("model", "layers", "{0}", "attn", "v_proj"), IN_HEADS),
    (_L + r"self_attn\.q_proj\.bias", ("model", "layers", "{0}", "attn", "q_bias"), BIAS_HEADS),
    (_L + r"self_attn\.k_proj\.bias", ("model", "layers", "{0}", "attn", "k_bias"), BIAS_HEADS),
    (_L + r"self_attn\.v_proj\.bias", ("model", "layers", "{0}", "attn", "v_bias"), BIAS_HEADS),
    (_L + r"self_attn\.o_proj\.weight", ("model", "layers", "{0}", "attn", "o_proj"), OUT_HEADS),
    (_L + r"self_attn\.o_proj\.bias", ("model", "layers", "{0}", "attn", "o_bias"), IDENTITY),
    (_L + r"mlp\.gate_proj\.weight", ("model", "layers", "{0}", "mlp", "gate_proj"), TRANSPOSE),
    (_L + r"mlp\.up_proj\.weight", ("model", "layers", "{0}", "mlp", "up_proj"), TRANSPOSE),
    (_L + r"mlp\.down_proj\.weight", ("model", "layers", "{0}", "mlp", "down_proj"), TRANSPOSE),
    (_L + r"mlp\.gate_proj\.bias", ("model", "layers", "{0}", "mlp", "gate_bias"), IDENTITY),
    (_L + r"mlp\.up_proj\.bias", ("model", "layers", "{0}", "mlp", "up_bias"), IDENTITY),
    (_L + r"mlp\.down_proj\.bias", ("model", "layers", "{0}", "mlp", "down_bias"), IDENTITY),
)
_COMPILED = tuple((re.compile(p + r"$"), path, t) for p, path, t in HF_RULES)
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def hf_to_ours(name: str) -> tuple[tuple[str | int, ...], Transform] | None:
    """HF tensor name -> (our Param path, transform); None for a name that is not a Qwen2/Llama weight."""
    for pattern, path, transform in _COMPILED:
        m = pattern.match(name)
        if m:
            return tuple(int(m.group(1)) if p == "{0}" else p for p in path), transform
    return None


def ours_to_hf(path: tuple[str | int, ...]) -> tuple[str, Transform]:
    """Our Param path -> (HF tensor name, transform)."""
    for _, rule_path, transform in HF_RULES:
        if len(rule_path) == len(path) and all(r == "{0}" or r == p for r, p in zip(rule_path, path, strict=True)):
            name = _hf_name_template(rule_path)
            layer = next((p for r, p in zip(rule_path, path, strict=True) if r == "{0}"), None)
            return name.format(layer), transform
    raise KeyError(f"no HF name for param path {path}")


def _hf_name_template(rule_path: tuple[str, ...]) -> str:
    for pattern, path, _ in HF_RULES:
        if path == rule_path:
            return pattern.replace(_L, "model.layers.{}.").replace("\\.", ".")
    raise KeyError(rule_path)
