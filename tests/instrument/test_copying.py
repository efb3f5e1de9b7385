"""Copy-constrained decoding of the LM instrumenter: the source's lines are copied, the model's inserted
progress prints kept, anything else it writes replaced by the source line, on scripted continuations (each
test decides what the model writes) and on a real (random) tiny Qwen2 through the JaxSampler."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from mle_jax.instrument import instrument_batch
from mle_jax.instrument.copying import CopyState, advance, copy_decode, is_progress_print_line
from mle_jax.instrument.fallback import ast_instrument
from mle_jax.instrument.verify import verify
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.protocol import Completion
from tests.rl.tiny import tiny_qwen2
from tests.tasks.chat_tokenizer import tiny_chat_tokenizer

CODE = "import pandas as pd\ndf = pd.read_csv('train.csv')\nfor i in range(3):\n    x = i\ndf.to_csv('submission.csv')"
SRC = CODE.split("\n")


def test_progress_print_lines():
    assert is_progress_print_line('    print("loaded data")')
    assert is_progress_print_line('print("training loss:", loss)')
    assert not is_progress_print_line('print("hello")')
    assert not is_progress_print_line("x = 1")
    assert not is_progress_print_line('print("loaded data"')  # does not parse


def test_copies_matching_lines_and_keeps_inserted_prints():
    s = CopyState.of(CODE)
    advance(s, f'{SRC[0]}\nprint("imported packages")\n{SRC[1]}\n{SRC[2]}', finished=False)
    assert s.out == [SRC[0], 'print("imported packages")', SRC[1]] and s.j == 2  # SRC[2] unfinished: not decided
    assert s.prefix().endswith(SRC[1])  # the model writes the next newline itself
    advance(s, f'\n{SRC[2]}\n    print("training loss:", x)\n{SRC[3]}\n{SRC[4]}\n```', finished=True)
    assert s.done and s.out == [
        SRC[0],
        'print("imported packages")',
        *SRC[1:3],
        '    print("training loss:", x)',
        *SRC[3:],
    ]
    assert verify(CODE, s.response().removeprefix("```python\n").removesuffix("\n```")).n_inserted == 2


def test_a_divergent_line_is_replaced_by_the_source_line():
    s = CopyState.of(CODE)
    advance(s, f"{SRC[0]}\ndf = pd.read_csv('test.csv')\n{SRC[2]}\n", finished=False)  # wrong file name
    assert s.out == SRC[:2] and s.j == 2  # the source's line, and what followed the wrong one is dropped
    advance(s, "no newline first", finished=False)  # continues the decided line: a divergence too
    assert s.out == SRC[:3]
    advance(s, "", finished=False)  # nothing complete: the next source line
    assert s.out == SRC[:4] and not s.done


def test_prints_per_gap_are_bounded_and_the_end_is_detected():
    s = CopyState.of("x = 1")
    advance(s, 'x = 1\nprint("loaded data")\nprint("loaded data")\nprint("loaded data")\n', finished=False)
    assert s.out == ["x = 1", 'print("loaded data")', 'print("loaded data")']  # the third print is a divergence
    assert s.done  # past the last source line, a divergence ends the program
    early = CopyState.of(CODE)
    advance(early, f"{SRC[0]}\n```", finished=True)  # closed before the end: the source goes on
    assert early.out == SRC[:2] and not early.done


class Oracle:
    """A model that writes the AST-instrumented program but gets the file name wrong once."""

    version = 0

    def __init__(self, tok, code: str):
        self.tok, self.target, self.calls = tok, ast_instrument(code).replace("train.csv", "tr.csv", 1), 0

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, top_k=-1, seed=None):
        out = []
        for p in prompts:
            self.calls += 1
            text = self.tok.decode(p)
            written = text[text.rindex("```python\n") + len("```python\n") :]
            lines_done = written.count("\n") + 1 if written else 0
            rest = "\n".join(self.target.split("\n")[lines_done:])  # the target after as many lines
            reply = ("\n" if written else "") + rest + "\n```"
            out.append(
                Completion(np.asarray(p, np.int32), np.zeros(1, np.int32), np.zeros(1, np.float32), reply, "stop", 0)
            )
        return out

    def sync(self, params, version):
        pass


def test_copy_decoding_through_instrument_batch_recovers_from_a_divergence():
    tok = tiny_chat_tokenizer()
    oracle = Oracle(tok, CODE)
    [free] = instrument_batch([CODE], "lm", Oracle(tok, CODE), tok, decoding="free")
    assert free.path == "fallback"  # the free-written program changed a constant
    [copied] = instrument_batch([CODE], "lm", oracle, tok, decoding="copy", copy_window=64)
    assert copied.path == "lm", copied.reason
    assert "train.csv" in copied.code and "tr.csv'" not in copied.code
    assert copied.code.count("print(") >= 3 and oracle.calls >= 2


@pytest.fixture(scope="module")
def random_tiny():
    tok = tiny_chat_tokenizer()
    cfg = tiny_qwen2(len(tok), num_hidden_layers=2, max_position_embeddings=2048)
    return Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), tok


def test_a_real_model_can_only_insert_lines(random_tiny):
    model, tok = random_tiny
    sampler = JaxSampler(model, tok)
    prompt = tok.encode("<|im_start|>user\ninstrument<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    [state] = copy_decode([prompt], [CODE], sampler, tok, window=8)
    assert state.done
    body = state.response().removeprefix("```python\n").removesuffix("\n```").split("\n")
    kept = [line for line in body if not is_progress_print_line(line)]
    assert kept == SRC  # a random model writes no print: the program comes back line for line
