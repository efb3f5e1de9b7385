"""GGUF -> HF folder (mle_jax.models.convert) on tiny GGUF files written as llama.cpp writes them: the folder
holds the source model's weights (q/k permutation undone, quantised tensors dequantised), loads in our
from_pretrained and in transformers with the logits of transformers' own GGUF loader; its tokenizer is the
file's; bad files fail with one line naming the file and tensor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

from mle_jax.models import convert, hf
from mle_jax.models.convert import GGUFError
from mle_jax.models.safetensors_io import SafetensorsReader
from mle_jax.models.tokenizer import load_tokenizer, stop_token_ids, train_bpe_tokenizer
from tests.models.gguf_files import CHAT_TEMPLATE, dequantized_state, gguf_name, write_gguf
from tests.models.reference import jax_logits, torch_llama, torch_logits, torch_qwen2

pytestmark = pytest.mark.model

Q8, Q4_1 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1
CORPUS = [
    "import pandas as pd\nfrom sklearn.linear_model import LogisticRegression\n",
    "train = pd.read_csv('train.csv')\nmodel = LogisticRegression(C=0.5, max_iter=200)\nmodel.fit(X, y)\n",
    "print('validation auc:', 0.6123)\nsubmission.to_csv('submission.csv', index=False)\n",
] * 10
TEXTS = [
    "import numpy as np\nx = np.arange(12345) * 0.25\nprint(x[:3])",
    "model.fit(X_train, y_train)  # 2 epochs, 64 rows",
]
# Quantised rows need in-features that are a multiple of 32 (the Q8_0 / Q4_1 block).
SHAPE = dict(
    vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
)  # fmt: skip
TOKENS = np.random.RandomState(0).randint(0, 300, (2, 11))


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(CORPUS, vocab_size=300, out_dir=path)
    return path


@pytest.fixture(scope="module")
def llama(bpe_dir, tmp_path_factory):
    """(torch Llama, its F32 GGUF, the GGUF converted to an HF folder)."""
    tm = torch_llama(seed=1, tie_word_embeddings=True, rope_theta=100000.0, **SHAPE)
    root = tmp_path_factory.mktemp("llama")
    path = write_gguf(root / "tiny.gguf", tm, bpe_dir)
    return tm, path, convert.convert(path, root / "hf")


def test_f32_llama_file_converts_back_to_the_source_weights(llama):
    """Every tensor of the folder equals the torch model's: llama.cpp's q/k permutation is undone."""
    tm, _, folder = llama
    r = SafetensorsReader(folder / "model.safetensors")
    src = {k: v.detach().numpy() for k, v in tm.state_dict().items() if k != "lm_head.weight"}
    assert sorted(r.keys()) == sorted(src)
    for name, value in src.items():
        np.testing.assert_array_equal(r.get(name), value, err_msg=name)
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["model_type"], cfg["tie_word_embeddings"], cfg["attention_bias"]) == ("llama", True, False)
    assert (cfg["rope_theta"], cfg["num_key_value_heads"], cfg["head_dim"]) == (100000.0, 2, 16)
    ours = hf.from_pretrained(folder)
    assert np.abs(jax_logits(ours, TOKENS) - torch_logits(tm, TOKENS)).max() <= 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantised_file_matches_transformers_gguf_loader(bpe_dir, tmp_path, dtype):
    """Q8_0 and Q4_1 tensors (SmolLM2's file is Q4_1 + a Q8_0 embedding) with untied embeddings: our folder
    holds the dequantised values (in `dtype`); fp32 logits equal transformers loading the GGUF itself."""
    tm = torch_llama(seed=2, tie_word_embeddings=False, **SHAPE)
    quant = {"token_embd.weight": Q8, "attn_q.weight": Q4_1, "attn_k.weight": Q8, "ffn_down.weight": Q4_1}
    path = write_gguf(tmp_path / "q.gguf", tm, bpe_dir, quant=quant)
    folder = convert.convert(path, tmp_path / "hf", dtype=dtype)
    stored = dequantized_state(path)
    r = SafetensorsReader(folder / "model.safetensors")
    embed = r.get("model.embed_tokens.weight")
    assert embed.dtype == np.dtype(dtype if dtype == "float32" else ml_dtypes.bfloat16)
    np.testing.assert_array_equal(embed, stored["token_embd.weight"].astype(embed.dtype))
    assert not np.array_equal(stored["token_embd.weight"], tm.model.embed_tokens.weight.detach().numpy())
    if dtype == "bfloat16":
        return
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="q.gguf", dtype=torch.float32).eval()
    ours = hf.from_pretrained(folder)
    assert np.abs(jax_logits(ours, TOKENS) - torch_logits(ref, TOKENS)).max() <= 1e-5
    ref_folder = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert np.abs(torch_logits(ref_folder, TOKENS) - torch_logits(ref, TOKENS)).max() == 0.0


def test_qwen2_file_keeps_its_biases_and_row_order(bpe_dir, tmp_path):
    tm = torch_qwen2(seed=3, tie_word_embeddings=False, **SHAPE)
    folder = convert.convert(write_gguf(tmp_path / "qwen2.gguf", tm, bpe_dir, arch="qwen2"), tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
    ours = hf.from_pretrained(folder)
    assert np.abs(jax_logits(ours, TOKENS) - torch_logits(tm, TOKENS)).max() <= 1e-5


def test_tokenizer_is_the_files(llama, bpe_dir):
    """Same ids as the BPE the file was made from, the file's special tokens and chat template."""
    _, _, folder = llama
    src, tok = load_tokenizer(bpe_dir), load_tokenizer(folder)
    for text in [*TEXTS, CORPUS[1]]:
        assert tok.encode(text) == src.encode(text)
        assert tok.decode(tok.encode(text)) == text
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|endoftext|>",
    )
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == src.convert_tokens_to_ids("<|im_start|>")
    assert stop_token_ids(tok) == stop_token_ids(src)
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen == {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}


def test_pre_tokenizers_split_digits_as_llama_cpp_names_them():
    words = {
        pre: [w for w, _ in convert._pre_tokenizer(pre).pre_tokenize_str("x = 12345 abc")]
        for pre in ("smollm", "gpt2", "qwen2", "llama-bpe")
    }
    assert words["smollm"] == ["x", "Ġ=", "Ġ", "1", "2", "3", "4", "5", "Ġabc"]
    assert words["gpt2"] == ["x", "Ġ=", "Ġ12345", "Ġabc"]
    assert words["qwen2"] == ["x", "Ġ=", "Ġ", "1", "2", "3", "4", "5", "Ġabc"]
    assert words["llama-bpe"] == ["x", "Ġ=", "Ġ", "123", "45", "Ġabc"]
    assert convert._pre_tokenizer("some-new-model") is None


# ---- bad input -------------------------------------------------------------------------------


def test_other_architecture_is_named(bpe_dir, tmp_path):
    tm = torch_llama(seed=4, **SHAPE)
    path = write_gguf(tmp_path / "mamba.gguf", tm, bpe_dir)
    r = gguf.GGUFReader(path, "r+")  # a file that says it is another architecture
    field = r.fields["general.architecture"]
    field.parts[field.data[0]][:] = np.frombuffer(b"mamba", np.uint8)
    r.data.flush()
    with pytest.raises(GGUFError, match=rf"^{path}: architecture 'mamba' is not supported \(only llama, qwen2"):
        convert.convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_file_names_the_tensor(llama, tmp_path):
    _, path, _ = llama
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-64])
    last = gguf.GGUFReader(path).tensors[-1].name
    with pytest.raises(GGUFError, match=rf"^{cut}: tensor '{last}' \(F32, 64 values\) ends at byte \d+, past the end"):
        convert.convert(cut, tmp_path / "out")
    head = tmp_path / "head.gguf"
    head.write_bytes(path.read_bytes()[:200])
    with pytest.raises(GGUFError, match=rf"^{head}: not a readable GGUF file"):
        convert.convert(head, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_quantisation_type_names_the_tensor(llama, tmp_path):
    _, path, _ = llama
    bad = tmp_path / "badtype.gguf"
    bad.write_bytes(path.read_bytes())
    r = gguf.GGUFReader(bad, "r+")
    victim = r.tensors[3]
    victim.field.parts[4][0] = 250  # the tensor's ggml type
    r.data.flush()
    with pytest.raises(GGUFError, match=rf"^{bad}: tensor '{victim.name}': unknown quantisation type 250$"):
        convert.convert(bad, tmp_path / "out")


def test_type_gguf_cannot_dequantise_names_the_tensor(bpe_dir, tmp_path):
    tm = torch_llama(seed=5, tie_word_embeddings=True, **SHAPE)
    path = write_gguf(tmp_path / "i32.gguf", tm, bpe_dir)
    r = gguf.GGUFReader(path, "r+")  # F32 -> I32: same size, a type with no dequantiser
    victim = next(t for t in r.tensors if t.name == gguf_name("model.layers.1.mlp.up_proj.weight"))
    victim.field.parts[4][0] = int(gguf.GGMLQuantizationType.I32)
    r.data.flush()
    with pytest.raises(GGUFError, match=rf"^{path}: tensor 'blk\.1\.ffn_up\.weight': quantisation type I32 cannot"):
        convert.convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_cli_prints_one_line(llama, tmp_path):
    _, path, _ = llama
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-64])
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "mle_jax.models.convert", "--gguf", str(cut), "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"convert: {cut}: tensor ") and len(proc.stderr.strip().splitlines()) == 1
    ok = subprocess.run([*cmd[:4], str(path), "--out", str(tmp_path / "ok")], cwd=root, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
