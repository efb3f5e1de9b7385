"""GGUF (llama.cpp) -> an HF checkpoint folder that our `hf.from_pretrained`, transformers and vLLM load.

    python -m mle_jax.models.convert --gguf FILE --out DIR [--dtype float32|bfloat16]

writes DIR/config.json, model.safetensors, tokenizer.json, tokenizer_config.json (with the file's chat
template), generation_config.json. The file is read with the `gguf` package (llama.cpp's own reader):
every tensor is dequantised to float32 (`gguf.quants.dequantize`: Q4_0, Q4_1, Q8_0, the K-quants, ...),
stored as float32 or bfloat16, one tensor at a time. llama.cpp's Llama converter permutes the rows of
q and k (and of their biases) from HF's rotate-half RoPE layout to its interleaved one; that permutation
is undone here, so the weights are HF's again. Qwen2 files are not permuted.

Architectures: `llama` (SmolLM2, Llama 2/3 without rope scaling) and `qwen2`. Tokenizers: byte-level
BPE (`tokenizer.ggml.model = gpt2`) with a pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`.
Anything else (another architecture, a truncated file, a quantisation type gguf cannot dequantise) is a
`GGUFError`: one line naming the file and, where there is one, the tensor.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import ml_dtypes
import numpy as np
from flax import nnx
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from mle_jax.models.hf_layout import ours_to_hf
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.safetensors_io import write_safetensors_streamed

ARCHITECTURES = ("llama", "qwen2")
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

# GGUF tensor name -> HF tensor name (the same for both architectures).
_GGUF_TO_HF = (
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", "model.layers.{}.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", "model.layers.{}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", "model.layers.{}.self_attn.q_proj.{}"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", "model.layers.{}.self_attn.k_proj.{}"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", "model.layers.{}.self_attn.v_proj.{}"),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", "model.layers.{}.self_attn.o_proj.{}"),
    (r"blk\.(\d+)\.ffn_gate\.(weight|bias)", "model.layers.{}.mlp.gate_proj.{}"),
    (r"blk\.(\d+)\.ffn_up\.(weight|bias)", "model.layers.{}.mlp.up_proj.{}"),
    (r"blk\.(\d+)\.ffn_down\.(weight|bias)", "model.layers.{}.mlp.down_proj.{}"),
)
_GGUF_TO_HF_COMPILED = tuple((re.compile(p + "$"), h) for p, h in _GGUF_TO_HF)

# tokenizer.ggml.pre -> the pre-tokenizer of the HF tokenizer.json that vocabulary was trained with
# (llama.cpp's llama-vocab.cpp regexes). GPT-2's split is ByteLevel(use_regex=True)'s built-in one.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str) -> Any:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):  # each digit alone, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("gpt2", "default", "mpt", "olmo"):
        return byte_level
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN2_SPLIT), "isolated"), no_regex])
    if pre in ("llama3", "llama-bpe", "llama-v3", "smaug-bpe"):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), "isolated"), no_regex])
    return None


class GGUFError(ValueError):
    """A GGUF file that cannot be converted; the message names the file (and the tensor, if one is at fault)."""


class GGUFFile(gguf.GGUFReader):
    """The gguf package's reader (memory-mapped; a tensor is read when its .data is used) that checks each
    tensor's type and extent before building its view, so that an unknown quantisation type or a truncated
    file is an error naming the tensor (the plain reader fails on them with a bare enum or reshape error)."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(path)

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        known = {int(t) for t in gguf.GGMLQuantizationType}
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            code = int(raw_dtype[0])
            if code not in known:
                raise GGUFError(f"{self.path}: tensor {name!r}: unknown quantisation type {code}")
            qtype = gguf.GGMLQuantizationType(code)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            n = int(np.prod(dims.astype(np.int64)))
            end = start_offs + int(offset[0]) + n * type_size // block
            if end > len(self.data):
                raise GGUFError(
                    f"{self.path}: tensor {name!r} ({qtype.name}, {n} values) ends at byte {end}, past the "
                    f"end of the file ({len(self.data)} bytes): truncated file"
                )
        super()._build_tensors(start_offs, fields)


def read_gguf(path: str | Path) -> GGUFFile:
    """The checked reader of the GGUF file at `path`; GGUFError naming the file if it cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    try:
        return GGUFFile(path)
    except GGUFError:
        raise
    except Exception as e:  # the reader raises ValueError/IndexError/... on a corrupt or truncated header
        raise GGUFError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def _field(reader: GGUFFile, key: str, default: Any = None, required: bool = False) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if required:
            raise GGUFError(f"{reader.path}: metadata field {key!r} is missing")
        return default
    value = f.contents()
    return value


def gguf_config(reader: GGUFFile) -> Qwen2Config:
    """Our config (HF Llama or Qwen2 fields) from the file's `<arch>.*` metadata and its tensor list."""
    arch = _field(reader, "general.architecture", required=True)
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{reader.path}: architecture {arch!r} is not supported (only {', '.join(ARCHITECTURES)}; "
            "general.architecture)"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    names = {t.name for t in reader.tensors}
    if scaling not in ("none", None) or "rope_freqs.weight" in names:
        raise GGUFError(f"{reader.path}: rope scaling ({scaling!r}, or a rope_freqs tensor) is not supported")

    def num(key: str, default: Any = None) -> Any:
        v = _field(reader, f"{arch}.{key}", default, required=default is None)
        if isinstance(v, list):  # per-layer values (some files): only uniform ones are supported
            if len(set(v)) != 1:
                raise GGUFError(f"{reader.path}: {arch}.{key} varies by layer ({v[:4]}...), which is not supported")
            v = v[0]
        return v

    hidden, heads = int(num("embedding_length")), int(num("attention.head_count"))
    head_dim = int(num("attention.key_length", num("rope.dimension_count", hidden // heads)))
    tokens = _field(reader, "tokenizer.ggml.tokens", [])
    try:
        return Qwen2Config(
            vocab_size=int(num("vocab_size", len(tokens) or None)),
            hidden_size=hidden,
            intermediate_size=int(num("feed_forward_length")),
            num_hidden_layers=int(num("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(num("attention.head_count_kv", heads)),
            head_dim=head_dim,
            max_position_embeddings=int(num("context_length")),
            rope_theta=float(num("rope.freq_base", 10000.0)),
            rms_norm_eps=float(num("attention.layer_norm_rms_epsilon")),
            tie_word_embeddings="output.weight" not in names,
            model_type=arch,
            attention_bias="blk.0.attn_q.bias" in names,
            attention_out_bias=arch == "llama" and "blk.0.attn_q.bias" in names,
            mlp_bias="blk.0.ffn_gate.bias" in names,
            bos_token_id=_special_id(reader, "bos"),
            eos_token_id=_special_id(reader, "eos"),
        )
    except ValueError as e:
        raise GGUFError(f"{reader.path}: {e}") from None


def hf_name(gguf_name: str) -> str | None:
    """GGUF tensor name -> HF tensor name; None for one that is not a Llama/Qwen2 decoder weight."""
    for pattern, template in _GGUF_TO_HF_COMPILED:
        m = pattern.match(gguf_name)
        if m:
            return template.format(*m.groups())
    return None


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: w [H*Dh, ...] with each head's rows in interleaved
    (re0, im0, re1, im1, ...) order -> HF's rotate-half order (re0, re1, ..., im0, im1, ...)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _expected_tensors(cfg: Qwen2Config) -> dict[str, tuple[int, ...]]:
    """HF name -> HF shape of every tensor our model of `cfg` needs."""
    abstract = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, nnx.Rngs(0)))
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        name, transform = ours_to_hf(tuple(path))
        out[name] = tuple(int(d) for d in transform.hf_shape(tuple(var.get_value().shape)))
    return out


def _dequantize(reader: GGUFFile, tensor: Any) -> np.ndarray:
    """One tensor as float32 in HF layout ([out, in] for a matrix)."""
    try:
        return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
    except NotImplementedError:
        raise GGUFError(
            f"{reader.path}: tensor {tensor.name!r}: quantisation type {tensor.tensor_type.name} cannot be "
            "dequantised by the gguf package"
        ) from None


def write_weights(reader: GGUFFile, cfg: Qwen2Config, out: Path, dtype: np.dtype) -> None:
    """out/model.safetensors from the file's tensors (dequantised, q/k unpermuted for Llama, cast to dtype)."""
    expected = _expected_tensors(cfg)
    by_hf: dict[str, Any] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None or name not in expected:
            raise GGUFError(f"{reader.path}: tensor {t.name!r} is not a weight of a {cfg.model_type} decoder")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        want = expected[name]
        if shape != want and not (len(want) == 1 and shape == (1, *want)):
            raise GGUFError(f"{reader.path}: tensor {t.name!r} has shape {shape}, but the metadata implies {want}")
        by_hf[name] = t
    missing = [n for n in expected if n not in by_hf]
    if missing:
        raise GGUFError(f"{reader.path}: the file lacks tensors for {missing[:4]}{' ...' if len(missing) > 4 else ''}")

    def produce(name: str) -> np.ndarray:
        t = by_hf[name]
        w = _dequantize(reader, t).reshape(expected[name])
        if cfg.model_type == "llama" and ".q_proj." in name:
            w = unpermute_rope_rows(w, cfg.num_attention_heads)
        elif cfg.model_type == "llama" and ".k_proj." in name:
            w = unpermute_rope_rows(w, cfg.num_key_value_heads)
        return w.astype(dtype)

    specs = [(name, expected[name], dtype) for name in expected]
    write_safetensors_streamed(out / "model.safetensors", specs, produce)


# our name -> the GGUF's (tokenizer.ggml.<name>_token_id)
_SPECIAL_IDS = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}


def _special_id(reader: GGUFFile, ours: str) -> int | None:
    i = _field(reader, f"tokenizer.ggml.{_SPECIAL_IDS[ours]}_token_id")
    return None if i is None else int(i)


def write_tokenizer(reader: GGUFFile, cfg: Qwen2Config, out: Path) -> None:
    """tokenizer.json (byte-level BPE: the file's vocabulary, merges, pre-tokenizer and control tokens),
    tokenizer_config.json (special tokens, chat template) and generation_config.json."""
    kind = _field(reader, "tokenizer.ggml.model", required=True)
    if kind != "gpt2":
        raise GGUFError(f"{reader.path}: tokenizer.ggml.model={kind!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    pre_tok = _pre_tokenizer(pre)
    if pre_tok is None:
        raise GGUFError(f"{reader.path}: tokenizer.ggml.pre={pre!r} is not a pre-tokenizer this converter knows")
    tokens = list(_field(reader, "tokenizer.ggml.tokens", required=True))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", required=True)]
    if len(tokens) > cfg.vocab_size:
        raise GGUFError(f"{reader.path}: {len(tokens)} tokens but vocab_size={cfg.vocab_size}")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tok
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, kind in zip(tokens, types, strict=True) if kind == 3]  # llama.cpp: 3 CONTROL
    user = [t for t, kind in zip(tokens, types, strict=True) if kind == 4]  # 4 USER_DEFINED
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    core.save(str(out / "tokenizer.json"))

    ids = {k: _special_id(reader, k) for k in _SPECIAL_IDS}
    specials = {k: tokens[i] for k, i in ids.items() if i is not None and 0 <= i < len(tokens)}
    tok_cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json is the whole pipeline: no rebuilt one
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        **{f"{k}_token": v for k, v in specials.items()},
        "additional_special_tokens": [t for t in control if t not in specials.values()],
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_position_embeddings,
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        tok_cfg["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False))
    gen = {f"{k}_token_id": i for k, i in ids.items() if k != "unk" and i is not None}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


def convert(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Writes the HF folder of the GGUF file at `gguf_path` to `out_dir` (created; files overwritten).

    dtype: storage dtype of the weights, "float32" or "bfloat16" (dequantised in float32 first).
    Raises GGUFError (one line naming the file and tensor) on a file it cannot convert; writes nothing then.
    """
    if dtype not in DTYPES:
        raise GGUFError(f"dtype={dtype!r}: use one of {sorted(DTYPES)}")
    reader = read_gguf(gguf_path)
    cfg = gguf_config(reader)
    out = Path(out_dir)
    staging = out.with_name(out.name + ".partial")  # written whole, then moved: no half folder under out
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write_weights(reader, cfg, staging, DTYPES[dtype])
        write_tokenizer(reader, cfg, staging)
        hf_cfg = cfg.to_hf_dict()
        hf_cfg["torch_dtype"] = hf_cfg["dtype"] = dtype
        pad = _special_id(reader, "pad")
        if pad is not None:
            hf_cfg["pad_token_id"] = pad
        (staging / "config.json").write_text(json.dumps(hf_cfg, indent=2))
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(staging.iterdir(), key=lambda f: f.name == "config.json"):  # config.json last: a folder
            f.replace(out / f.name)  # with one is complete (make smol-model's target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mle_jax.models.convert --gguf FILE --out DIR [--dtype float32|bfloat16]`."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", required=True, help="a llama.cpp GGUF file (llama or qwen2)")
    p.add_argument("--out", required=True, help="the HF folder to write")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    a = p.parse_args(argv)
    try:
        out = convert(a.gguf, a.out, a.dtype)
    except GGUFError as e:
        print(f"convert: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({', '.join(sorted(f.name for f in out.iterdir()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
