"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them (with the gguf package's
writer): an HF torch model's tensors under GGUF names, Llama q/k rows permuted to llama.cpp's interleaved
RoPE layout, some tensors quantised, and a byte-level BPE tokenizer's vocabulary and merges."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in _HF_TO_GGUF:
        return _HF_TO_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.<i>.<rest>
    for hf_part, g_part in _HF_TO_GGUF.items():
        if rest.startswith(hf_part):
            return f"blk.{layer}.{g_part}{rest[len(hf_part) :]}"
    raise KeyError(hf_name)


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF rotate-half rows -> interleaved rows, per head."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    path: Path,
    torch_model,
    tokenizer_dir: Path,
    arch: str = "llama",
    quant: Mapping[str, gguf.GGMLQuantizationType] | None = None,
    pre: str = "gpt2",
) -> Path:
    """Writes `torch_model` (an HF Llama or Qwen2) and the BPE tokenizer in `tokenizer_dir` as a GGUF file.

    quant: GGUF tensor-name suffix -> quantisation type (e.g. {"ffn_up.weight": Q8_0}); others stay F32.
    """
    cfg = torch_model.config
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny test model")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant else gguf.LlamaFileType.ALL_F32)

    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    tokens += [f"[PAD{i}]" for i in range(len(tokens), cfg.vocab_size)]  # llama.cpp pads to the model's rows
    special = {a["content"]: a["id"] for a in tok["added_tokens"]}
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    types[len(vocab) :] = [gguf.TokenType.UNUSED] * (cfg.vocab_size - len(vocab))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special["<|im_start|>"])
    w.add_eos_token_id(special["<|im_end|>"])
    w.add_unk_token_id(special["<|endoftext|>"])
    w.add_pad_token_id(special["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    quant = dict(quant or {})
    for name, p in torch_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = p.detach().float().numpy()
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            a = llama_cpp_permute(a, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        g = gguf_name(name)
        qtype = next((q for suffix, q in quant.items() if g.endswith(suffix)), None)
        if qtype is None:
            w.add_tensor(g, np.ascontiguousarray(a, np.float32))
        else:
            w.add_tensor(g, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantized_state(path: Path) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 values as stored (dequantised, still in llama.cpp's row order)."""
    r = gguf.GGUFReader(path)
    return {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32) for t in r.tensors}
