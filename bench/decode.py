"""Decode throughput on CPU: our JaxSampler (jit, KV cache, while_loop) vs transformers' generate.

Same weights, batch 8 prompts, 256 new tokens each, greedy, no early stop. Compile time is excluded
(one warm-up call each); the two alternate for --rounds rounds and the medians are compared.
Prints tokens/s of each and the ratio ours / torch (goal >= 2.0).

    .venv/bin/python bench/decode.py [--batch 8 --new 256 --prompt 32 --threads 2 --rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch
import transformers
from model_step import CONFIG  # the same model (bench/ is on sys.path when run as a script)
from rich.console import Console

from mle_jax.models import hf
from mle_jax.sampling.jax_sampler import JaxSampler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    console = Console()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**CONFIG)).float().eval()
    with tempfile.TemporaryDirectory() as d:
        tm.save_pretrained(d)
        ours = hf.from_pretrained(d)
    sampler = JaxSampler.for_run(None, ours, eos_ids=[])  # a run's default sampler settings
    prompts = np.random.RandomState(0).randint(0, CONFIG["vocab_size"], (args.batch, args.prompt))
    t_prompts = torch.from_numpy(prompts).long()
    gen_kw = dict(do_sample=False, max_new_tokens=args.new, min_new_tokens=args.new, pad_token_id=0)

    with console.status("warm-up (compile)"):
        t0 = time.perf_counter()
        sampler.generate(prompts.tolist(), temperature=0.0, max_tokens=args.new)
        compile_s = time.perf_counter() - t0
        with torch.no_grad():
            tm.generate(t_prompts, **{**gen_kw, "max_new_tokens": 4, "min_new_tokens": 4})
    times_ours, times_torch = [], []
    for r in range(args.rounds):  # alternate so both see the same machine load
        with console.status(f"round {r + 1}/{args.rounds}: ours"):
            t0 = time.perf_counter()
            out = sampler.generate(prompts.tolist(), temperature=0.0, max_tokens=args.new)
            times_ours.append(time.perf_counter() - t0)
        with console.status(f"round {r + 1}/{args.rounds}: transformers generate"):
            t0 = time.perf_counter()
            with torch.no_grad():
                ref = tm.generate(t_prompts, **gen_kw)[:, args.prompt :].numpy()
            times_torch.append(time.perf_counter() - t0)
    ours_s, torch_s = statistics.median(times_ours), statistics.median(times_torch)
    got = np.stack([c.token_ids for c in out])
    n = args.batch * args.new
    console.print(
        f"decode  batch={args.batch} prompt={args.prompt} new={args.new}  cores={os.cpu_count()}"
        f"  torch threads={args.threads}  median of {args.rounds}"
    )
    console.print(f"  ours (JaxSampler)      : {n / ours_s:9.1f} tokens/s  (first call {compile_s:.1f}s)")
    console.print(f"  transformers generate  : {n / torch_s:9.1f} tokens/s")
    console.print(f"  ratio ours/torch = {torch_s / ours_s:.2f}  (goal >= 2.0)")
    console.print(f"  greedy tokens identical: {float((got == ref).mean()):.3f} of {got.size}")


if __name__ == "__main__":
    main()
