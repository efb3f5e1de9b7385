"""Reading and writing the safetensors format one tensor at a time, bfloat16 included.

The `safetensors` package's numpy backend cannot hold bfloat16, and its jax backend puts every
tensor on the default device; this reader memory-maps the file and hands out zero-copy numpy views
(bfloat16 via ml_dtypes), so a loader can move each tensor straight to its target sharding.
Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
then the raw little-endian data.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_CODES = {v: k for k, v in DTYPES.items()}


class SafetensorsError(ValueError):
    """A safetensors file that is missing, truncated or malformed (the message names file and tensor)."""


class SafetensorsReader:
    """Lazy, memory-mapped access to one .safetensors file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"safetensors file not found: {self.path}")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{self.path}: corrupt safetensors file (only {size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise SafetensorsError(
                    f"{self.path}: corrupt safetensors file (header length {n} exceeds file size {size})"
                )
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise SafetensorsError(f"{self.path}: corrupt safetensors header ({e})") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: corrupt safetensors header (not a JSON object)")
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        data_len = size - self._data_start
        self._entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        for name, e in header.items():
            try:
                dtype = DTYPES[e["dtype"]]
                shape = tuple(int(s) for s in e["shape"])
                begin, end = (int(o) for o in e["data_offsets"])
            except (KeyError, TypeError, ValueError) as err:
                raise SafetensorsError(f"{self.path}: tensor {name!r}: malformed header entry {e!r} ({err})") from None
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if end - begin != nbytes or begin < 0 or end > data_len:
                raise SafetensorsError(
                    f"{self.path}: tensor {name!r}: data offsets [{begin}, {end}) do not fit shape {shape} "
                    f"{e['dtype']} ({nbytes} bytes) in a data section of {data_len} bytes "
                    "(truncated or corrupt file)"
                )
            self._entries[name] = (dtype, shape, begin, end)
        self._mmap: mmap.mmap | None = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def dtype(self, name: str) -> np.dtype:
        return self._entries[name][0]

    def get(self, name: str) -> np.ndarray:
        """A read-only numpy view of one tensor (no copy)."""
        if name not in self._entries:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        dtype, shape, begin, end = self._entries[name]
        if self._mmap is None:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if end == begin:
            return np.zeros(shape, dtype)
        start = self._data_start + begin
        return np.frombuffer(self._mmap, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=start).reshape(
            shape
        )

    def close(self) -> None:
        # Views handed out keep the buffer alive; mmap.close would raise while they exist, so let GC do it.
        self._mmap = None

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_safetensors(
    path: str | Path,
    tensors: Mapping[str, np.ndarray] | Sequence[tuple[str, np.ndarray]],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Writes name -> array (any DTYPES dtype) as one safetensors file."""
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    specs = [(name, tuple(a.shape), np.dtype(a.dtype)) for name, a in items]
    arrays = dict(items)
    write_safetensors_streamed(path, specs, arrays.__getitem__, metadata)


def write_safetensors_streamed(
    path: str | Path,
    specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
    produce: Callable[[str], np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Writes tensors whose (name, shape, dtype) are known up front; `produce(name)` is called once per
    tensor, in order, so only one tensor's data is on the host at a time."""
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, shape, dtype in specs:
        code = _CODES.get(np.dtype(dtype))
        if code is None:
            raise TypeError(f"tensor {name!r}: dtype {dtype} cannot be stored in safetensors")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, dtype in specs:
            arr = np.asarray(produce(name))
            if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype):
                raise ValueError(f"tensor {name!r}: produced {arr.shape} {arr.dtype}, declared {shape} {dtype}")
            f.write(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
