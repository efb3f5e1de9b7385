"""A tiny byte-level BPE tokenizer with ChatML special tokens and chat template, for prompt tests.

The project's real tokenizer comes from mle_jax.models.tokenizer; this one is built here so the task tests
do not depend on it. Byte-level BPE encodes any text, so token counts are real.
"""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "import pandas as pd\nimport numpy as np\nfrom sklearn.linear_model import LogisticRegression\n",
    "train = pd.read_csv('/workdir/task/prepared/public/train.csv')\nmodel.fit(X_train, y_train)\n",
    "First outline your proposed solution in natural language (3-5 sentences), followed by a single "
    "markdown code block which implements this solution. You MUST produce a submission file.",
    "request_id,requester_received_pizza\nt3_i8iy4,0\nt3_1mfqi0,0\n",
    'print("loaded data")\nprint("trained model")\nprint("predicted test labels")\n',
]


@functools.lru_cache(maxsize=1)
def tiny_chat_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast
