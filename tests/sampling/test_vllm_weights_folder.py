"""The vLLM sync's weight export (no server): every accepted params form writes what hf.save_pretrained writes."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.sampling.vllm import export_hf

CFG = Qwen2Config(
    vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def model_and_reference(tmp_path_factory):
    model = Qwen2ForCausalLM(CFG, nnx.Rngs(0))
    ref_dir = hf.save_pretrained(model, tmp_path_factory.mktemp("ref"))
    return model, load_file(str(ref_dir / "model.safetensors"))


@pytest.mark.parametrize("form", ["module", "state", "params", "pure_dict"])
def test_export_matches_save_pretrained(form, model_and_reference, tmp_path):
    model, ref = model_and_reference
    params = {
        "module": lambda: model,
        "state": lambda: nnx.state(model),
        "params": lambda: nnx.state(model, nnx.Param),
        "pure_dict": lambda: nnx.to_pure_dict(nnx.state(model, nnx.Param)),
    }[form]()
    out = export_hf(params, tmp_path / "export")
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(ref) and len(ref) == 2 + 2 * 12 + 1  # embed, norm, lm_head + 12/layer
    for name, value in ref.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_export_hf_mapping_and_folder(model_and_reference, tmp_path):
    _, ref = model_and_reference
    out = export_hf(ref, tmp_path / "from_mapping")
    assert export_hf(out, tmp_path / "unused") == out  # a folder is used as is
    got = load_file(str(out / "model.safetensors"))
    assert all(np.array_equal(got[k], v) for k, v in ref.items())
    with pytest.raises(FileNotFoundError, match="safetensors"):
        export_hf(tmp_path / "unused", tmp_path / "x")
    with pytest.raises(TypeError, match="sync"):
        export_hf(3.0, tmp_path / "x")
