"""The BPE tokenizer trained on a corpus: ChatML specials, chat template, save/reload, byte fallback,
word-level and cross-word merges, stop tokens."""

from __future__ import annotations

import json

import pytest
from flax import nnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.tokenizer import SPECIAL_TOKENS, load_tokenizer, stop_token_ids, train_bpe_tokenizer
from mle_jax.warmstart.sft import train_task_tokenizer
from tests.rl.tiny import tiny_qwen2

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
    code = "import pandas as pd\nfrom sklearn import linear_model\nmodel = linear_model.LogisticRegression(C=1.0)\n"
    tok = train_task_tokenizer([code] * 20, [], 400, tmp_path / "tok", 16)
    model = Qwen2ForCausalLM(tiny_qwen2(vocab_size=400), rngs=nnx.Rngs(0))
    hf.save_pretrained(model, tmp_path / "policy")
    tok.save_pretrained(str(tmp_path / "policy"))
    again = load_tokenizer(tmp_path / "policy")
    assert again.encode(code) == tok.encode(code) and len(tok.encode(code)) < 20  # cross-word merges kept
    msgs = [{"role": "user", "content": code}]
    assert again.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)


def model_of(tok: PreTrainedTokenizerFast) -> dict:
    """The BPE model (vocab + merges) and pre-tokenizer of a tokenizer, from its tokenizer.json."""
    d = json.loads(tok.backend_tokenizer.to_str())
    return {"vocab": d["model"]["vocab"], "merges": d["model"]["merges"], "pre_tokenizer": d["pre_tokenizer"]}


def learned(tok: PreTrainedTokenizerFast) -> list[str]:
    """The merged tokens (not bytes, not specials), in byte-level characters (a space is 'Ġ')."""
    return [t for t, i in tok.get_vocab().items() if i >= 256 + len(SPECIAL_TOKENS)]


@pytest.mark.parametrize("max_token_length", [None, 8, 16])
def test_merges_are_those_of_the_byte_level_bpe_pipeline(max_token_length, tmp_path):
    """The trained tokenizer is the `tokenizers` pipeline the warm start has always used (the task tokenizer
    of mle_jax.warmstart.sft delegates here): same vocab, merges and pre-tokenizer for the same corpus."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=max_token_length is None)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    kw = {} if max_token_length is None else {"max_token_length": max_token_length}
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False, **kw,
    )  # fmt: skip
    core.train_from_iterator(CORPUS, trainer=trainer)
    reference = model_of(PreTrainedTokenizerFast(tokenizer_object=core))
    tok = train_bpe_tokenizer(CORPUS, 500, tmp_path / "bpe", max_token_length=max_token_length)
    assert model_of(tok) == reference
    assert model_of(load_tokenizer(tmp_path / "bpe")) == reference
    task = train_task_tokenizer(CORPUS, [], 500, tmp_path / "task", max_token_length)
    assert model_of(task) == reference


def test_max_token_length_lets_merges_cross_words(tmp_path):
    words = train_bpe_tokenizer(CORPUS, 400, tmp_path / "words")
    cross = train_bpe_tokenizer(CORPUS, 400, tmp_path / "cross", max_token_length=12)
    # word level: a space only ever starts a token; cross-word: some tokens hold a space inside
    assert not [t for t in learned(words) if "Ġ" in t.lstrip("Ġ")]
    assert [t for t in learned(cross) if "Ġ" in t.lstrip("Ġ")]
    assert max(len(t) for t in learned(cross)) <= 12 < max(len(t) for t in learned(words))
    line = CORPUS[0]
    assert len(cross.encode(line)) < len(words.encode(line))
    assert cross.decode(cross.encode(line)) == line
    with pytest.raises(ValueError, match="max_token_length=0 must be >= 1"):
        train_bpe_tokenizer(CORPUS, 400, tmp_path / "bad", max_token_length=0)


def test_stop_token_ids(trained, tmp_path):
    tok, _ = trained
    assert stop_token_ids(tok) == [0, 2]  # <|endoftext|>, <|im_end|> (eos)
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"], show_progress=False))
    plain = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>")  # no ChatML tokens
    assert stop_token_ids(plain) == [plain.convert_tokens_to_ids("</s>")]
    assert stop_token_ids(PreTrainedTokenizerFast(tokenizer_object=core)) == []
