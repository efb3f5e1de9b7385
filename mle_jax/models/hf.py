"""HF Qwen2 and Llama checkpoints (config.json + safetensors) <-> our Flax NNX Qwen2ForCausalLM.

The mapping is one table, `hf_layout.HF_RULES` (jax-free, for the vLLM worker too): an HF tensor name
pattern, the path of our Param, and a layout transform (HF nn.Linear stores [out, in]; we store [in, heads,
head_dim] and friends). Both families use the same tensor names; which biases exist follows the config
(`Qwen2Config.attention_bias`, ...).

`from_pretrained` builds the model abstractly (no weights allocated), then reads one tensor at a time
from the memory-mapped safetensors files and `jax.device_put`s it straight onto its target
`NamedSharding` (from the Param's logical axes and `rules`) when a mesh is given; the host never holds
more than one tensor. `write_weights` is the one writer of our params as HF safetensors (the vLLM
sampler's weight sync uses it too); `save_pretrained` adds config.json, so that
`transformers.Qwen2ForCausalLM` (or `LlamaForCausalLM`) `.from_pretrained` loads the folder.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from mle_jax.infra.sharding import LOGICAL_RULES, variable_sharding
from mle_jax.models.hf_layout import _IGNORED, hf_to_ours, ours_to_hf  # the layout table, jax-free
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.safetensors_io import SafetensorsError, SafetensorsReader, write_safetensors_streamed

# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def read_config(path: str | Path) -> Qwen2Config:
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no config.json in {path} (expected an HF Qwen2 or Llama checkpoint folder)")
    try:
        d = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{cfg_path}: not a JSON object (an HF config is one)")
    return Qwen2Config.from_hf_dict(d, source=str(cfg_path))


def _weight_files(path: Path) -> dict[str, Path]:
    """HF tensor name -> file, from model.safetensors.index.json or the folder's *.safetensors."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index}: malformed safetensors index ({e})") from None
        return {name: path / fname for name, fname in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors (nor model.safetensors.index.json) in {path}")
    out: dict[str, Path] = {}
    for f in files:
        for name in SafetensorsReader(f).keys():
            out[name] = f
    return out


def runtime_options(model_cfg: Any) -> dict[str, Any]:
    """The run config's `model` fields that shape computation but are not in an HF config.json (remat,
    remat_policy, scan_layers, attn_block, attention), as `from_pretrained` keyword arguments; absent fields are
    left out."""
    get = model_cfg.get if hasattr(model_cfg, "get") else (lambda k, d=None: getattr(model_cfg, k, d))
    names = ("remat", "remat_policy", "scan_layers", "attn_block", "attention")
    return {k: get(k) for k in names if get(k) is not None}


def from_pretrained(
    path: str | Path,
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    mesh: Mesh | None = None,
    rules: Sequence[tuple[str, Any]] | None = None,
    remat: bool | None = None,
    remat_policy: str | None = None,
    attn_block: int | None = None,
    scan_layers: bool | None = None,
    attention: str | None = None,
) -> Qwen2ForCausalLM:
    """Loads an HF Qwen2 or Llama checkpoint folder into our model.

    dtype: compute dtype; param_dtype: storage dtype (defaults to dtype). remat / remat_policy / attn_block /
    scan_layers / attention override the non-HF fields of `Qwen2Config` (see `runtime_options`). With `mesh`, every
    tensor is placed directly onto its NamedSharding (sharding.variable_sharding: its logical axes through `rules`,
    default sharding.LOGICAL_RULES).
    Raises FileNotFoundError / SafetensorsError / ValueError naming the file and tensor on bad input.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {path}")
    cfg = read_config(path)
    if remat is not None:
        cfg = dataclasses.replace(cfg, remat=remat)
    if remat_policy is not None:
        cfg = dataclasses.replace(cfg, remat_policy=remat_policy)
    if attn_block is not None:
        cfg = dataclasses.replace(cfg, attn_block=attn_block)
    if scan_layers is not None:
        cfg = dataclasses.replace(cfg, scan_layers=scan_layers)
    if attention is not None:
        cfg = dataclasses.replace(cfg, attention=attention)
    param_dtype = param_dtype or dtype
    rules = tuple(rules or LOGICAL_RULES)
    abstract = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype))
    graphdef, state = nnx.split(abstract)
    flat = dict(nnx.to_flat_state(state))
    loaded: set[tuple] = set()
    files = _weight_files(path)
    readers: dict[Path, SafetensorsReader] = {}
    for name, fpath in files.items():
        if fpath not in readers:
            readers[fpath] = SafetensorsReader(fpath)
        reader = readers[fpath]
        if name not in reader:
            raise SafetensorsError(f"{fpath}: tensor {name!r} listed in the index is not in the file")
        target = hf_to_ours(name)
        if target is None:
            if _IGNORED.match(name):
                continue
            raise ValueError(f"{fpath}: tensor {name!r} is not a Qwen2/Llama ForCausalLM weight")
        our_path, transform = target
        if our_path not in flat:
            if our_path == ("lm_head",) and cfg.tie_word_embeddings:
                continue  # some tied checkpoints also store the (identical) lm_head
            raise ValueError(f"{fpath}: tensor {name!r} has no place in the model (config {path / 'config.json'})")
        var = flat[our_path]
        shape = tuple(var.get_value().shape)
        want = transform.hf_shape(shape)
        if reader.shape(name) != want:
            raise ValueError(f"{fpath}: tensor {name!r} has shape {reader.shape(name)}, but config.json implies {want}")
        host = np.asarray(transform.to_ours(reader.get(name), shape)).astype(param_dtype)
        if mesh is not None:
            value = jax.device_put(host, variable_sharding(var, mesh, rules))
        else:
            value = jnp.asarray(host)
        flat[our_path] = var.replace(value)
        loaded.add(our_path)
    missing = [p for p in flat if p not in loaded]
    if missing:
        names = [ours_to_hf(p)[0] for p in missing]
        raise ValueError(f"{path}: checkpoint lacks tensors {names[:8]}{' ...' if len(names) > 8 else ''}")
    return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())))


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------


def _gather_to_host(x: jax.Array | np.ndarray) -> np.ndarray:
    """One param on this host as numpy; a sharded multi-host array is all-gathered first, so every
    process must call this for such an array, in the same order. Host arrays pass through."""
    if isinstance(x, np.ndarray):
        return x
    if not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def _flatten(tree: Mapping, prefix: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _param_leaves(params: Any) -> list[tuple[tuple, jax.Array]]:
    """[(our Param path, array)] of our model, an nnx.State of it (all of it or its Params), or a nested
    pure dict of either (nnx.to_pure_dict); non-Param Variables are left out."""
    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    if isinstance(params, nnx.State):
        flat = [(tuple(p), v) for p, v in nnx.to_flat_state(nnx.filter_state(params, nnx.Param))]
    elif isinstance(params, Mapping):
        flat = [(p, v) for p, v in _flatten(params) if not isinstance(v, nnx.Variable) or isinstance(v, nnx.Param)]
    else:
        raise TypeError(
            "write_weights takes our Qwen2 model, an nnx.State of it or a nested dict of it,"
            f" got {type(params).__name__}"
        )
    return [(path, v.get_value() if isinstance(v, nnx.Variable) else v) for path, v in flat]


def hf_device_tensors(params: Any, dtype: Any = None) -> dict[str, jax.Array]:
    """{HF name: array in HF layout, where the param lives} of our params (model, nnx.State or pure dict, as
    `write_weights`): each layout transform (transposes, head reshapes) runs on the param's device, so on an
    accelerator it is a device transpose rather than a host one (on CPU, 6 GB of bf16 transposes take ~13 s).
    Needs fully addressable arrays (one process); `write_weights` handles the rest.
    dtype: convert on the device too (default: each param's own).
    """
    out = {}
    for our_path, value in _param_leaves(params):
        name, transform = ours_to_hf(our_path)
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            raise ValueError(f"hf_host_tensors: {name} is sharded over several processes; use write_weights")
        x = transform.to_hf(value)
        out[name] = x if dtype is None else x.astype(dtype)
    return out


def hf_host_tensors(params: Any, dtype: Any = None) -> dict[str, np.ndarray]:
    """{HF name: host array in HF layout} of our params: `hf_device_tensors`, then all copied to host at once."""
    return {k: np.asarray(v) for k, v in jax.device_get(hf_device_tensors(params, dtype)).items()}


def write_weights(params: Any, path: str | Path, dtype: Any = None, max_shard_bytes: int | None = None) -> Path:
    """Writes our Qwen2's Params in HF names and layouts (`HF_RULES`) as path/model.safetensors, or as
    shards of at most max_shard_bytes + model.safetensors.index.json. Returns path.

    params: our Qwen2ForCausalLM, an nnx.State of it (all of it or its Params), or its nnx.to_pure_dict.
    dtype: storage dtype (default: each param's own). Streams one tensor at a time from device to file.
    Multi-host: every process must call it (sharded arrays are gathered); only process 0 writes.
    """
    path = Path(path)
    leaves = _param_leaves(params)
    if not leaves:
        raise ValueError("write_weights: the given state holds no nnx.Param")
    specs = []  # (HF name, HF shape, numpy dtype, array, transform)
    for our_path, value in leaves:
        name, transform = ours_to_hf(our_path)
        np_dtype = np.dtype(dtype if dtype is not None else value.dtype)
        specs.append((name, transform.hf_shape(tuple(value.shape)), np_dtype, value, transform))
    if jax.process_index() != 0:
        for spec in specs:  # join process 0's gathers, in its order
            if not spec[3].is_fully_addressable:
                _gather_to_host(spec[3])
        return path
    shards: list[list] = [[]]
    size = 0
    for spec in specs:
        nbytes = int(np.prod(spec[1], dtype=np.int64)) * spec[2].itemsize
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    by_name = {s[0]: s for s in specs}

    def produce(name: str) -> np.ndarray:
        _, _, np_dtype, value, transform = by_name[name]
        return np.ascontiguousarray(transform.to_hf(_gather_to_host(value)).astype(np_dtype))

    path.mkdir(parents=True, exist_ok=True)
    n = len(shards)
    fnames = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for fname, shard in zip(fnames, shards, strict=True):
        write_safetensors_streamed(path / fname, [(s[0], s[1], s[2]) for s in shard], produce)
    if n > 1:
        total = sum(int(np.prod(s[1], dtype=np.int64)) * s[2].itemsize for s in specs)
        weight_map = {s[0]: fname for fname, shard in zip(fnames, shards, strict=True) for s in shard}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return path


def save_pretrained(
    model: Qwen2ForCausalLM, path: str | Path, dtype: Any = None, max_shard_bytes: int | None = None
) -> Path:
    """An HF checkpoint folder of the model's family (Qwen2 or Llama: `Qwen2Config.model_type`):
    `write_weights` + config.json (torch_dtype: the stored dtype).

    dtype: storage dtype (default: the params' own). max_shard_bytes: split into shards of at most this
    size. Multi-host: every process must call it; only process 0 writes.
    """
    path = write_weights(model, path, dtype, max_shard_bytes)
    if jax.process_index() != 0:
        return path
    stored = str(np.dtype(dtype if dtype is not None else _param_leaves(model)[0][1].dtype))
    cfg_dict = model.config.to_hf_dict()
    cfg_dict["torch_dtype"] = cfg_dict["dtype"] = stored if stored in ("bfloat16", "float16") else "float32"
    (path / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    return path
