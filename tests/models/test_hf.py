"""HF checkpoints <-> our model: transformers-saved folders load, our folders load in transformers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from mle_jax.infra.sharding import fit_spec, logical_to_spec
from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.safetensors_io import SafetensorsError, SafetensorsReader, write_safetensors
from tests.models.reference import TINY, jax_logits, numpy_random_model, torch_logits, torch_qwen2
from tests.xla_flags import with_device_count

pytestmark = pytest.mark.model
TOKENS = np.random.RandomState(0).randint(0, TINY["vocab_size"], (2, 9))


def random_ours(tied: bool, seed: int = 0) -> Qwen2ForCausalLM:
    """Our model with every param random (biases, norms included)."""
    cfg = Qwen2Config(**{**TINY, "tie_word_embeddings": tied})

    return numpy_random_model(Qwen2ForCausalLM, cfg, seed)


@pytest.mark.parametrize("tied", [False, True])
def test_save_then_transformers_load_gives_same_logits(tied, tmp_path):
    ours = random_ours(tied)
    hf.save_pretrained(ours, tmp_path)
    tm = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert tm.config.tie_word_embeddings == tied
    got = jax_logits(ours, TOKENS)
    assert np.abs(torch_logits(tm, TOKENS) - got).max() <= 1e-4
    back = hf.from_pretrained(tmp_path)
    assert np.abs(jax_logits(back, TOKENS) - got).max() == 0.0


def test_sharded_checkpoints_both_ways(tmp_path):
    tm = torch_qwen2(seed=3)
    tm.save_pretrained(tmp_path / "torch", max_shard_size="30KB")
    assert (tmp_path / "torch" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "torch").glob("*.safetensors"))) > 1
    ours = hf.from_pretrained(tmp_path / "torch")
    ref = torch_logits(tm, TOKENS)
    assert np.abs(jax_logits(ours, TOKENS) - ref).max() <= 1e-4
    hf.save_pretrained(ours, tmp_path / "ours", max_shard_bytes=30_000)
    assert len(json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    assert len(list((tmp_path / "ours").glob("*.safetensors"))) > 1
    tm2 = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    assert np.abs(torch_logits(tm2, TOKENS) - ref).max() <= 1e-4


def test_bf16_checkpoint_loads_onto_mesh_with_logical_shardings(tmp_path):
    tm = torch_qwen2(seed=4).to(torch.bfloat16)
    tm.save_pretrained(tmp_path)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tensor"))
    ours = hf.from_pretrained(tmp_path, dtype=jnp.bfloat16, mesh=mesh)
    q = ours.model.layers[0].attn.q_proj[...]
    assert q.dtype == jnp.bfloat16
    assert q.sharding.mesh == mesh  # size-1 mesh axes may be left out of the spec: same placement
    assert q.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec("fsdp", "tensor", None)), q.ndim)
    emb = ours.model.embed_tokens[...]
    assert emb.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec("tensor", "fsdp")), emb.ndim)
    with torch.no_grad():
        ref = tm(torch.from_numpy(TOKENS)).logits.float().numpy()
    got = jax_logits(ours, TOKENS)
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()
    hf.save_pretrained(ours, tmp_path / "again")
    r = SafetensorsReader(tmp_path / "again" / "model.safetensors")
    assert r.dtype("model.layers.0.self_attn.q_proj.weight") == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        r.get("model.layers.0.self_attn.q_proj.weight").astype(np.float32),
        tm.model.layers[0].self_attn.q_proj.weight.detach().float().numpy(),
    )


def read_folder(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of an HF folder's safetensors files (sharded or not), as numpy."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        r = SafetensorsReader(f)
        out.update({k: np.array(r.get(k)) for k in r.keys()})
    return out


@pytest.mark.parametrize("form", ["module", "state", "params", "pure_dict"])
def test_write_weights_takes_every_form_of_our_params(form, tmp_path):
    """The model, its nnx.State (all of it or its Params) and their pure dicts: the same safetensors as
    save_pretrained, without config.json."""
    model = random_ours(tied=False)
    ref = read_folder(hf.save_pretrained(model, tmp_path / "ref"))
    params = {
        "module": lambda: model,
        "state": lambda: nnx.state(model),
        "params": lambda: nnx.state(model, nnx.Param),
        "pure_dict": lambda: nnx.to_pure_dict(nnx.state(model, nnx.Param)),
    }[form]()
    out = hf.write_weights(params, tmp_path / "w", dtype=jnp.bfloat16, max_shard_bytes=20_000)
    assert out == tmp_path / "w" and not (out / "config.json").exists()
    assert len(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]) == len(ref)
    got = read_folder(out)
    assert sorted(got) == sorted(ref) and len(ref) == 3 + 12 * TINY["num_hidden_layers"]
    for name, value in ref.items():
        assert got[name].dtype == np.dtype(ml_dtypes.bfloat16), name
        np.testing.assert_array_equal(got[name], value.astype(ml_dtypes.bfloat16), err_msg=name)


def test_write_weights_rejects_what_holds_no_params(tmp_path):
    with pytest.raises(TypeError, match="write_weights takes our Qwen2 model.*got float"):
        hf.write_weights(3.0, tmp_path)
    with pytest.raises(ValueError, match="holds no nnx.Param"):
        hf.write_weights(nnx.state(random_ours(tied=True), nnx.BatchStat), tmp_path)
    assert not any(tmp_path.iterdir())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_multihost_write_gathers_shards_and_process_0_writes(tmp_path):
    """2 processes x 2 devices, params sharded across both processes: each process holds half of a tensor,
    both join the gathers, process 0 writes the whole checkpoint (save_pretrained and write_weights)."""
    torch_qwen2(seed=8, num_key_value_heads=2).save_pretrained(tmp_path / "src")
    root = Path(__file__).resolve().parents[2]
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")},
        "XLA_FLAGS": with_device_count(2),
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(root),
    }
    cmd = [sys.executable, "-m", "tests.models.multihost_write_check", str(tmp_path / "src"), str(tmp_path / "out")]
    port = str(free_port())
    procs = [
        subprocess.Popen([*cmd, port, str(i)], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for i in range(2)
    ]  # fmt: skip
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-3000:] for _, err in results)
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    assert [r["process"] for r in reports] == [0, 1]
    assert not any(r["embed_addressable"] for r in reports)  # the embedding really is split across processes
    assert not (tmp_path / "out" / "p1").exists()  # process 1 only joined the gathers
    src = read_folder(tmp_path / "src")
    for folder in (tmp_path / "out" / "p0", tmp_path / "out" / "p0" / "sync"):
        got = read_folder(folder)
        assert sorted(got) == sorted(src), folder
        for name, value in src.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{folder}: {name}")
    assert len(list((tmp_path / "out" / "p0").glob("model-*-of-*.safetensors"))) > 1
    back = hf.from_pretrained(tmp_path / "out" / "p0")
    ref = torch_logits(torch_qwen2(seed=8, num_key_value_heads=2), TOKENS)
    assert np.abs(jax_logits(back, TOKENS) - ref).max() <= 1e-4


def test_sharding_spec_uses_each_mesh_axis_once_and_only_where_it_divides():
    mesh = AbstractMesh((2, 2), ("fsdp", "tensor"))
    rules = (("embed", "fsdp"), ("vocab", "fsdp"), ("mlp", "tensor"), ("kv_heads", "tensor"))
    assert fit_spec(logical_to_spec(("vocab", "embed"), rules), (8, 4), mesh) == PartitionSpec("fsdp", None)
    assert fit_spec(logical_to_spec(("embed", "mlp"), rules), (4, 8), mesh) == PartitionSpec("fsdp", "tensor")
    assert fit_spec(logical_to_spec(("embed", "kv_heads"), rules), (4, 1), mesh) == PartitionSpec("fsdp", None)


# ---- bad input -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    torch_qwen2(seed=5).save_pretrained(path)
    return path


def copy_dir(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_run_config_options_reach_the_loaded_model(good_dir):
    """remat, remat_policy, scan_layers, attn_block and attention are not in config.json: the run config's values
    must still apply on load."""
    from configs import base

    m = base.qwen25_3b_model()
    opts = hf.runtime_options(m)
    assert opts == {"remat": True, "remat_policy": "full", "scan_layers": m.scan_layers, "attn_block": 64,
                    "attention": "blocked"}  # fmt: skip
    model = hf.from_pretrained(
        good_dir, remat=True, remat_policy="dots", attn_block=7, scan_layers=True, attention="dot_product"
    )
    assert model.config.remat and model.config.attn_block == 7 and model.config.scan_layers
    assert model.config.remat_policy == "dots"
    assert model.config.attention == "dot_product"
    assert all(layer.attn.attn_block == 7 for layer in model.model.layers)
    assert hf.from_pretrained(good_dir).config.remat is False


def test_missing_folder_config_and_weights(good_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint folder not found"):
        hf.from_pretrained(tmp_path / "nope")
    d = copy_dir(good_dir, tmp_path / "noconfig")
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        hf.from_pretrained(d)
    d = copy_dir(good_dir, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        hf.from_pretrained(d)


def test_corrupt_safetensors_names_file_and_tensor(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "truncated")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(SafetensorsError, match=r"model\.safetensors: tensor '.+': data offsets"):
        hf.from_pretrained(d)
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(SafetensorsError, match=r"model\.safetensors: corrupt safetensors header"):
        hf.from_pretrained(d)


def test_other_family_config_is_rejected(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "gemma")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gemma"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: model_type='gemma'.*not a Qwen2 or Llama config"):
        hf.from_pretrained(d)


def test_qwen2_weights_under_a_llama_config_are_named(good_dir, tmp_path):
    """A Llama config without biases over Qwen2 weights: the first bias tensor has no place in the model."""
    d = copy_dir(good_dir, tmp_path / "llama")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"tensor 'model\.layers\.\d\.self_attn\.[qkv]_proj\.bias' has no place"):
        hf.from_pretrained(d)


def test_shape_mismatch_and_missing_tensor_are_named(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "shape")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (d / "config.json").write_text(json.dumps(cfg))
    pattern = r"model\.safetensors: tensor 'model\.layers\.\d\.mlp\.\w+_proj\.weight' has shape"
    with pytest.raises(ValueError, match=pattern):
        hf.from_pretrained(d)
    d = copy_dir(good_dir, tmp_path / "missing")
    r = SafetensorsReader(d / "model.safetensors")
    kept = {k: np.array(r.get(k)) for k in r.keys() if k != "model.layers.1.self_attn.k_proj.bias"}
    write_safetensors(d / "model.safetensors", kept)
    with pytest.raises(ValueError, match=r"lacks tensors \['model\.layers\.1\.self_attn\.k_proj\.bias'\]"):
        hf.from_pretrained(d)


def test_loads_onto_a_four_device_mesh(tmp_path):
    """4 fake CPU devices need a fresh process (XLA reads the flag once)."""
    torch_qwen2(seed=6, num_key_value_heads=1).save_pretrained(tmp_path)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "XLA_FLAGS": with_device_count(4), "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.sharded_load_check", str(tmp_path)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["max_diff"] <= 1e-5
    assert out["q_proj"] == ["fsdp", "tensor", None] and out["q_proj_devices"] == 4
    assert out["k_proj"] == ["fsdp", None, None]  # 1 KV head cannot split 2 ways
    assert out["down_proj"] == ["tensor", "fsdp"]
    assert out["shard_shape"] == [TINY["intermediate_size"] // 2, TINY["hidden_size"] // 2]
