"""HF checkpoints <-> our model: transformers-saved folders load, our folders load in transformers."""

from __future__ import annotations

import json
import os
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
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.safetensors_io import SafetensorsError, SafetensorsReader, write_safetensors
from tests.models.reference import TINY, jax_logits, numpy_random_model, torch_logits, torch_qwen2

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


def test_sharding_spec_uses_each_mesh_axis_once_and_only_where_it_divides():
    from jax.sharding import AbstractMesh

    from mle_jax.sharding import fit_spec, logical_to_spec

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
    """remat and attn_block are not in config.json: the run config's values must still apply on load."""
    from configs import base

    opts = hf.runtime_options(base.qwen25_3b_model())
    assert opts == {"remat": True, "attn_block": 64}
    model = hf.from_pretrained(good_dir, remat=True, attn_block=7)
    assert model.config.remat and model.config.attn_block == 7
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


def test_non_qwen2_config_is_rejected(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "llama")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: model_type='llama'.*not a Qwen2 config"):
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
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHONPATH": str(root)}
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
