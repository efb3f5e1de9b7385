"""The vLLM sync's weights folder (no server): our params go through hf.write_weights; a flat {HF name: array}
mapping is written as is; an HF folder is used as is; anything else fails before the server is touched. And the
worker's repacking of a tied LM head after a reload, on torch modules shaped as vLLM's CPU layers."""

from __future__ import annotations

import socket

import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx

from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.models import hf
from mle_jax.models.hf import hf_host_tensors
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.safetensors_io import SafetensorsReader
from mle_jax.rl.learner import Learner
from mle_jax.sampling.vllm import VLLMSampler, weights_folder
from mle_jax.sampling.vllm_server import VLLMServer
from mle_jax.sampling.vllm_worker import _repack_cpu_weight_sharing_heads, is_orbax_item, iter_weights
from tests.rl.tiny import learner_config, make_models, mesh, random_batch, tiny_qwen2

CFG = tiny_qwen2(300, num_hidden_layers=2, tie_word_embeddings=False)  # 2 layers: 12 tensors each, counted below


def read_all(folder) -> dict[str, np.ndarray]:
    r = SafetensorsReader(folder / "model.safetensors")
    return {k: np.array(r.get(k)) for k in r.keys()}


@pytest.fixture(scope="module")
def model_and_reference(tmp_path_factory):
    model = Qwen2ForCausalLM(CFG, nnx.Rngs(0))
    return model, read_all(hf.save_pretrained(model, tmp_path_factory.mktemp("ref")))


def test_our_params_are_written_by_write_weights(model_and_reference, tmp_path):
    model, ref = model_and_reference
    out = weights_folder(nnx.state(model), tmp_path / "export")
    assert out == tmp_path / "export" and not (out / "config.json").exists()  # weights only
    got = read_all(out)
    assert sorted(got) == sorted(ref) and len(ref) == 2 + 2 * 12 + 1  # embed, norm, lm_head + 12/layer
    for name, value in ref.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_mapping_and_folder(model_and_reference, tmp_path):
    _, ref = model_and_reference
    out = weights_folder(ref, tmp_path / "from_mapping")
    assert weights_folder(out, tmp_path / "unused") == out  # a folder is used as is
    assert not (tmp_path / "unused").exists()
    got = read_all(out)
    assert sorted(got) == sorted(ref) and all(np.array_equal(got[k], v) for k, v in ref.items())
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in ref.items()}  # safetensors.numpy cannot write these
    got = read_all(weights_folder(bf16, tmp_path / "bf16"))
    assert all(got[k].dtype == ml_dtypes.bfloat16 and np.array_equal(got[k], v) for k, v in bf16.items())
    with pytest.raises(FileNotFoundError, match="safetensors"):
        weights_folder(tmp_path / "unused", tmp_path / "x")
    with pytest.raises(TypeError, match="sync"):
        weights_folder(3.0, tmp_path / "x")


def test_background_sync_writes_host_copies_and_raises_the_reload_error(model_and_reference, tmp_path):
    """sync returns once the weights are on the host; the export (what hf.write_weights writes for the model) and
    the reload run in a thread; the reload's failure (no server listens here) surfaces at wait_sync."""
    model, ref = model_and_reference
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    # server_wait_s=0: a dead server raises at once (a run waits for it to come back: tests/sampling/test_vllm_recovery)
    sampler = VLLMSampler(VLLMServer(f"http://127.0.0.1:{port}"), eos_ids=[0], export_dir=tmp_path, server_wait_s=0)
    sampler.sync(nnx.state(model), version=1)
    with pytest.raises(Exception, match="(?i)connect"):
        sampler.wait_sync()
    assert sampler.version == 0  # not tagged: the server never took the weights
    got = read_all(tmp_path / "v00000001")
    assert sorted(got) == sorted(ref)
    for name, value in ref.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    sampler.wait_sync()  # the error was raised once


def test_the_worker_reads_a_learner_checkpoint_in_hf_layout(tmp_path):
    """vllm_worker.iter_orbax over a real learner's orbax item gives hf_host_tensors of its policy, tensor for
    tensor (the jax-free layout table against the one the HF export uses)."""
    learner = Learner(learner_config(), *make_models(0), mesh())
    learner.update(random_batch(0))
    ckpt = Checkpointer(tmp_path / "ckpt", keep=1, async_save=False)
    learner.save(ckpt, 1, loop={"step": 1})
    item = ckpt.item_dir(1, "learner")
    assert is_orbax_item(item) and not is_orbax_item(tmp_path)
    expected = hf_host_tensors(learner.policy_state())
    got = {name: tensor.numpy() for name, tensor in iter_weights(item)}
    assert sorted(got) == sorted(expected)
    for name, x in expected.items():
        np.testing.assert_array_equal(got[name], x, err_msg=name)
    ckpt.close()


class _Method:
    """A CPU layer's quant method as vLLM's: processing after loading packs the layer's weight (counted here)."""

    def __init__(self) -> None:
        self.packed: list[torch.nn.Module] = []

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.packed.append(layer)


def _cpu_layer(weight: torch.nn.Parameter, method: _Method) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight, layer.quant_method, layer.cpu_linear = weight, method, object()
    return layer


@pytest.mark.parametrize("tied", [True, False])
def test_after_a_reload_only_a_head_that_shares_the_embedding_weight_is_packed_again(tied):
    """The reload processed every layer it loaded (the embedding, an untied head, the linears, which drop their weight
    after packing); a tied head was skipped, so it alone is packed again: once, not with the embedding."""
    method = _Method()
    model = torch.nn.Module()
    embedding = torch.nn.Parameter(torch.ones(8, 4), requires_grad=False)
    model.embed = _cpu_layer(embedding, method)
    model.linear = _cpu_layer(torch.nn.Parameter(torch.empty(0), requires_grad=False), method)  # packed, dropped
    model.norm = torch.nn.Module()
    model.norm.weight = torch.nn.Parameter(torch.ones(4), requires_grad=False)  # no kernel of its own
    head = embedding if tied else torch.nn.Parameter(torch.ones(8, 4), requires_grad=False)
    model.head = _cpu_layer(head, method)
    _repack_cpu_weight_sharing_heads(model)
    assert method.packed == ([model.head] if tied else [])
