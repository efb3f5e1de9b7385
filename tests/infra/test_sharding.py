"""Mesh shapes from config, logical-axis rules and their fit to weight shapes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from mle_jax.infra import sharding as shd
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from tests.rl.tiny import tiny_qwen2

REPO = Path(__file__).resolve().parents[2]


def mesh_cfg(data, fsdp, tensor):
    return shd.MeshSettings(data, fsdp, tensor)


def test_mesh_shape():
    assert shd.mesh_shape(mesh_cfg(1, -1, 1), 8) == (1, 8, 1)
    assert shd.mesh_shape(mesh_cfg(2, -1, 2), 8) == (2, 2, 2)
    assert shd.mesh_shape(mesh_cfg(1, 1, -1), 4) == (1, 1, 4)
    with pytest.raises(ValueError, match="at most one"):
        shd.mesh_shape(mesh_cfg(-1, -1, 1), 4)
    with pytest.raises(ValueError, match="cannot be split"):
        shd.mesh_shape(mesh_cfg(3, -1, 1), 4)
    with pytest.raises(ValueError, match="needs 8 devices"):
        shd.mesh_shape(mesh_cfg(2, 2, 2), 4)
    with pytest.raises(ValueError, match="positive"):
        shd.mesh_shape(mesh_cfg(0, -1, 1), 4)


def test_mesh_shape_over_slices():
    """mesh.dcn_data slices multiply the data axis; -1 takes what remains of one slice."""
    assert shd.mesh_shape(shd.MeshSettings(1, -1, 1, dcn_data=2), 8) == (2, 4, 1)
    assert shd.mesh_shape(shd.MeshSettings(2, -1, 2, dcn_data=2), 16) == (4, 2, 2)
    with pytest.raises(ValueError, match="6 devices do not split into mesh.dcn_data = 4 slices"):
        shd.mesh_shape(shd.MeshSettings(1, -1, 1, dcn_data=4), 6)
    with pytest.raises(ValueError, match="must be >= 1"):
        shd.mesh_shape(shd.MeshSettings(1, -1, 1, dcn_data=0), 4)


def test_make_mesh_on_this_host():
    mesh = shd.make_mesh(mesh_cfg(1, -1, 1))
    assert mesh.axis_names == shd.MESH_AXES and mesh.size == jax.device_count()
    assert shd.batch_divisor(mesh) == jax.device_count()


def test_logical_rules_and_fit():
    assert shd.logical_to_spec(("embed", "mlp")) == PartitionSpec("fsdp", "tensor")
    assert shd.logical_to_spec(("q_heads", "head_dim", "embed")) == PartitionSpec("tensor", None, "fsdp")
    assert shd.logical_to_spec(None) == PartitionSpec()
    with pytest.raises(KeyError, match="no rule"):
        shd.logical_to_spec(("experts",))
    mesh = AbstractMesh((1, 4, 4), shd.MESH_AXES)
    # 2 KV heads cannot be split 4 ways: that dimension stays replicated
    spec = shd.fit_spec(shd.logical_to_spec(("embed", "kv_heads", "head_dim")), (128, 2, 32), mesh)
    assert spec == PartitionSpec("fsdp", None, None)
    assert shd.fit_spec(PartitionSpec("fsdp", "tensor"), (128, 384), mesh) == PartitionSpec("fsdp", "tensor")
    assert shd.fit_spec(PartitionSpec("fsdp", "tensor"), (6, 384), mesh) == PartitionSpec(None, "tensor")
    # size-1 axes are dropped (no-op sharding), an axis is never used twice
    one = AbstractMesh((1, 1, 4), shd.MESH_AXES)
    assert shd.fit_spec(PartitionSpec("fsdp", "tensor"), (8, 8), one) == PartitionSpec(None, "tensor")
    assert shd.fit_spec(PartitionSpec("tensor", "tensor"), (8, 8), one) == PartitionSpec("tensor", None)


def test_param_shardings_follow_logical_axes():
    cfg = tiny_qwen2(vocab_size=64)
    state = nnx.state(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    mesh = shd.make_mesh(mesh_cfg(1, -1, 1))
    shardings = shd.param_shardings(state, mesh)
    gate = shardings["model"]["layers"][0]["mlp"]["gate_proj"].get_value()
    n = jax.device_count()
    assert gate.spec == (PartitionSpec("fsdp", None) if n > 1 else PartitionSpec(None, None))
    leaves = jax.tree.leaves(shardings)
    assert len(leaves) == len(jax.tree.leaves(state)) and all(s.mesh == mesh for s in leaves)


def test_put_batch_and_to_host():
    mesh = shd.make_mesh(mesh_cfg(1, -1, 1))
    arrays = shd.put_batch({"tokens": np.arange(8 * jax.device_count()).reshape(-1, 2)}, mesh)
    assert arrays["tokens"].sharding.spec == PartitionSpec(shd.BATCH_AXES, None)
    np.testing.assert_array_equal(shd.to_host(arrays["tokens"]), np.arange(8 * jax.device_count()).reshape(-1, 2))


def test_no_distributed_without_settings(monkeypatch):
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "MLE_JAX_DISTRIBUTED"):
        monkeypatch.delenv(var, raising=False)
    assert shd.maybe_initialize_distributed() is False
    assert jax.process_count() == 1


def test_make_mesh_over_slices_of_cpu_devices():
    """Without TPU slices, dcn_data splits the devices in order (processes first): 4 fake CPU devices, 2 slices of
    2, the data axis across them. A fresh process: the fake devices exist before JAX starts."""
    code = (
        "import jax; jax.config.update('jax_num_cpu_devices', 4)\n"
        "from mle_jax.infra import sharding as shd\n"
        "m = shd.make_mesh(shd.MeshSettings(1, -1, 1, dcn_data=2))\n"
        "print(dict(m.shape), [[d.id for d in row.flat] for row in m.devices])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{'data': 2, 'fsdp': 2, 'tensor': 1} [[0, 1], [2, 3]]"
