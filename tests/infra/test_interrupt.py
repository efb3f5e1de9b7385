"""Ctrl-C under `infra.interrupt.stop_on_sigint`: the first press is a stop request the warm start's SFT honours at
its next step (saved, then resumed by the next call), a second one exits at once even while the main thread is in
C code. The RL loop's stop, through the launcher, is in tests/test_launch_hostile.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flax import nnx

from configs import base
from mle_jax.infra import interrupt
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.warmstart.programs import generate_corpus
from mle_jax.warmstart.programs.pizza import PIZZA
from mle_jax.warmstart.settings import SFTSettings
from mle_jax.warmstart.sft import run_sft, train_task_tokenizer

REPO = Path(__file__).resolve().parents[2]

# the first Ctrl-C is a request; the second, sent while the main thread is in C code that has let go of the GIL (as
# in an XLA compile: no Python signal handler runs until it returns), ends the process
TWICE = """
import hashlib, os, signal, threading, time
from mle_jax.infra import interrupt
with interrupt.stop_on_sigint("first", "second"):
    os.kill(os.getpid(), signal.SIGINT)
    while not interrupt.requested():
        time.sleep(0.01)
    print("requested", flush=True)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    hashlib.pbkdf2_hmac("sha256", b"key", b"salt", 2**31 - 1)  # minutes, in OpenSSL without the GIL
"""


def test_a_second_ctrl_c_exits_at_once_even_inside_c_code():
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", TWICE], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == interrupt.EXIT_STATUS, done.stderr
    assert done.stdout == "requested\n" and done.stderr.splitlines() == ["first", "second"]
    assert time.monotonic() - t0 < 30


@pytest.mark.model
def test_ctrl_c_stops_the_sft_after_a_saved_step_and_the_next_call_resumes(tmp_path):
    items = generate_corpus(PIZZA, 4, seed=0)
    messages = [{"role": "user", "content": "Predict requester_received_pizza."}]
    tok = train_task_tokenizer([it.response() for it in items], [messages], 512, tmp_path / "tok")
    m = base.tiny_model()
    m.vocab_size, m.hidden_size, m.intermediate_size, m.num_hidden_layers = len(tok), 32, 64, 1
    m.num_attention_heads, m.num_key_value_heads, m.head_dim = 2, 1, 16
    config = Qwen2Config.from_model_config(m)
    examples = [(messages, it.plan) for it in items]
    cfg = SFTSettings(steps=4, batch_size=2, max_response_tokens=256, max_prompt_tokens=256, checkpoint_every=100)
    with interrupt.stop_on_sigint("stopping", "stopped"):
        os.kill(os.getpid(), signal.SIGINT)
        while not interrupt.requested():
            time.sleep(0.01)
        with pytest.raises(interrupt.Interrupted, match="after warm-start SFT step 1 of 4"):
            run_sft(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)), tok, examples, cfg, tmp_path, progress=False)
    assert not interrupt.requested()
    metrics = run_sft(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)), tok, examples, cfg, tmp_path, progress=False)
    assert metrics["resumed_from"] == 1 and metrics["steps"] == 4


def test_ctrl_c_stops_the_evaluation_while_its_runs_are_in_flight():
    """The evaluation waits on sandbox runs (a slow program can take the executor's whole timeout): a stop request is
    seen within its poll, not after every run has returned."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from rich.progress import Progress

    from mle_jax.env.driver import EpisodeDriver
    from mle_jax.env.evaluation import _run_round

    driver = EpisodeDriver(env=None)
    driver.in_flight.append(SimpleNamespace(done=False, future=Future()))  # a run that never returns
    with interrupt.stop_on_sigint("stopping", "stopped"):
        os.kill(os.getpid(), signal.SIGINT)
        while not interrupt.requested():
            time.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(interrupt.Interrupted, match="during the evaluation"), Progress(disable=True) as progress:
            _run_round(driver, 1, 0, progress, "eval: from scratch")
        assert time.monotonic() - t0 < 5
