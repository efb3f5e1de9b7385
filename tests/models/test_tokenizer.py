"""The BPE tokenizer trained on a corpus: ChatML specials, chat template, save/reload, byte fallback."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from mle_jax.models.tokenizer import load_tokenizer, train_bpe_tokenizer

CORPUS = [
    "import pandas as pd\nimport numpy as np\ntrain = pd.read_csv('./input/train.csv')\n",
    "from sklearn.linear_model import LogisticRegression\nmodel = LogisticRegression().fit(X, y)\n",
    "print('validation auc:', roc_auc_score(y_val, model.predict_proba(X_val)[:, 1]))\n",
] * 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return train_bpe_tokenizer(CORPUS, vocab_size=400, out_dir=out), out


def test_special_tokens_and_ids(trained):
    tok, _ = trained
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert 259 < len(tok) <= 400  # bytes + specials + learned merges
    ids = tok.encode("import pandas as pd")
    assert len(ids) < len("import pandas as pd")  # merges were learned


def test_round_trip_any_text_and_chat_template(trained):
    tok, _ = trained
    text = "naïve 数据 ✓ <tab>\t\n  end"
    assert tok.decode(tok.encode(text)) == text
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "solve it"}]
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nsolve it<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(rendered)
    assert ids.count(1) == 3 and ids.count(2) == 2  # specials are single tokens, never split
    assert tok.decode(ids, skip_special_tokens=True).startswith("system\nbe brief")


def test_reload_from_folder(trained):
    tok, out = trained
    again = load_tokenizer(out)
    text = "model = LogisticRegression()"
    assert again.encode(text) == tok.encode(text)
    assert again.eos_token_id == tok.eos_token_id == 2 and again.pad_token_id == 0
    msgs = [{"role": "user", "content": "hi"}]
    assert again.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer folder not found"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_bpe_tokenizer(CORPUS, vocab_size=100, out_dir=tmp_path / "t")


def test_reload_beside_a_qwen2_model_config_keeps_the_tokenization(tmp_path):
    """A policy folder holds the model's config.json (model_type qwen2) beside the tokenizer; loading
    must not swap in Qwen2Tokenizer's own pre-tokenizer (it re-tokenized a cross-word task BPE)."""
    from flax import nnx

    from mle_jax.models import hf
    from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
    from mle_jax.warmstart.sft import train_task_tokenizer

    code = "import pandas as pd\nfrom sklearn import linear_model\nmodel = linear_model.LogisticRegression(C=1.0)\n"
    tok = train_task_tokenizer([code] * 20, [], 400, tmp_path / "tok", 16)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=400,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        ),
        rngs=nnx.Rngs(0),
    )
    hf.save_pretrained(model, tmp_path / "policy")
    tok.save_pretrained(str(tmp_path / "policy"))
    again = load_tokenizer(tmp_path / "policy")
    assert again.encode(code) == tok.encode(code) and len(tok.encode(code)) < 20  # cross-word merges kept
    msgs = [{"role": "user", "content": code}]
    assert again.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
