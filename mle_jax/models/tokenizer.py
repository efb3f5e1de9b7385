"""Tokenizers: a real checkpoint's (AutoTokenizer, local folder only) or a byte-level BPE trained on
the task corpus for runs without a checkpoint. Both speak ChatML (<|im_start|>role ... <|im_end|>);
this module owns that format: its special tokens, its template and the tokens a response stops at."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# A sampled response ends at the end of the assistant turn or at the end of the text.
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")

# Qwen2.5's ChatML template (without tool calling); the default system prompt is Qwen's.
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer saved in a local folder (never the hub). Gives it the ChatML template if it has none."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    if (path / "tokenizer.json").is_file():
        # tokenizer.json is the whole pipeline. AutoTokenizer would pick a class from config.json's
        # model_type (qwen2 -> Qwen2Tokenizer), which rebuilds its own pre-tokenizer and silently
        # re-tokenizes a task BPE saved beside the model (policy folders, HF exports).
        tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    else:
        # imported here: transformers' Auto classes import its configuration module, which imports torch (about
        # 2 s of CPU for every process that imports this module, the launcher's included)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not tok.chat_template:
        tok.chat_template = CHATML_TEMPLATE
    return tok


def stop_token_ids(tokenizer: Any) -> list[int]:
    """The ids a sampler stops at: the tokenizer's eos id and the STOP_TOKENS in its vocabulary (sorted,
    unique; empty for a tokenizer with neither)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    return sorted(int(i) for i in ids | {vocab[t] for t in STOP_TOKENS if t in vocab})


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | Path, max_token_length: int | None = None
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2/Qwen style) with ChatML special tokens, saved to `out_dir`.

    Special tokens get ids 0, 1, 2 (<|endoftext|>, <|im_start|>, <|im_end|>); eos is <|im_end|> and pad
    is <|endoftext|>. Every byte is in the base alphabet, so any text round-trips. The size is at most
    vocab_size (BPE stops when no pair is left to merge).

    max_token_length=None: the text is pre-split into words (GPT-2's regex), so no token crosses a word.
    An int: the text is not pre-split, so merges may cross spaces and punctuation (`import pandas as pd`,
    `"request_id"`), up to tokens of that many characters; code then takes ~3x fewer tokens.
    """
    n_base = 256 + len(SPECIAL_TOKENS)
    if vocab_size < n_base:
        raise ValueError(f"vocab_size={vocab_size} is below the {n_base} byte + special tokens")
    if max_token_length is not None and max_token_length < 1:
        raise ValueError(f"max_token_length={max_token_length} must be >= 1 (or None for word-level merges)")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=max_token_length is None)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=max_token_length,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return tok
