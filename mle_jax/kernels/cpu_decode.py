"""The JAX sampler's decode step on CPU as two XLA FFI custom calls (cpu_decode.cc): the weight matmuls of a few
rows, and attention over a split cache's prefix and filled suffix.

A step of a small model's decode on CPU reads every weight and the KV cache for a handful of rows: it runs at the
speed of memory. XLA:CPU's dot reads weights at about 20 GB/s here and its attention reads the whole suffix (its
phase) at about 24 GB/s; these kernels stream a packed weight panel and only the filled suffix slots on all of
XLA's intra-op threads (docs/smollm2.md has the profile).

`make kernels` (a prerequisite of `make run` and `make test`) builds the library with g++ against jaxlib's FFI
headers: `python -m mle_jax.kernels.cpu_decode --build`. Where it is missing, or the backend is not CPU, the
model keeps XLA's own ops (`available()`).

The kernels plug into the model through its one seam, mle_jax.models.ops (the model imports nothing from here):
inside `enabled()` (the sampler's decode traces under it) `BACKEND` is the active `ops.DecodeBackend`, so
split-cache attention in float32 goes to its kernel, and `packed_weights` packs a model's dense weights once,
outside the decode loop: `ops.weight` then hands the model a `Packed` panel array (an `ops.BackendWeight`) instead
of the weight, which `ops.dense` multiplies by with the kernel. `live_rows` tells the matmul which rows still decode.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import ctypes
import dataclasses
import functools
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from mle_jax.models import ops

Array = jax.Array
SOURCE = Path(__file__).with_name("cpu_decode.cc")
LIBRARY = Path(__file__).with_name("_cpu_decode.so")
PANEL = 32  # columns per packed weight panel (cpu_decode.cc's kPanel)

_LIVE: contextvars.ContextVar[Array | None] = contextvars.ContextVar("mle_jax_live_rows", default=None)


def build(out: Path = LIBRARY) -> Path:
    """Compiles cpu_decode.cc into `out` (g++, C++17, -O3; each hot function for AVX-512, AVX2 and the baseline)."""
    cmd = [
        "g++", "-O3", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=fast", "-Wno-psabi", "-Wno-attributes",
        "-Wno-return-type", f"-I{jax.ffi.include_dir()}", "-o", str(out), str(SOURCE),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    return out


@functools.cache
def _load() -> bool:
    """Registers the two FFI targets on CPU (once per process); False where the library is not built."""
    if not LIBRARY.exists():
        return False
    if LIBRARY.stat().st_mtime < SOURCE.stat().st_mtime:
        warnings.warn(
            f"{LIBRARY} is older than {SOURCE.name}: XLA's ops decode until `make kernels` rebuilds it", stacklevel=3
        )
        return False
    lib = ctypes.cdll.LoadLibrary(str(LIBRARY))
    jax.ffi.register_ffi_target("mle_dense_packed", jax.ffi.pycapsule(lib.MleDensePacked), platform="cpu")
    jax.ffi.register_ffi_target(
        "mle_split_cache_attention", jax.ffi.pycapsule(lib.MleSplitCacheAttention), platform="cpu"
    )
    return True


def _require() -> None:
    """Registers the targets, or says in one line that the library must be built first."""
    if not _load():
        raise RuntimeError(f"{LIBRARY} is not built, or older than its source: run `make kernels`")


def available() -> bool:
    """The kernels can run: the library is built (and not older than its source) and the default backend is CPU."""
    return jax.default_backend() == "cpu" and _load()


@contextlib.contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Within it, tracing routes float32 decode work to the kernels (when `available()`): `BACKEND` is the model's
    decode backend (mle_jax.models.ops.decode_with); off, the model's own ops."""
    with ops.decode_with(BACKEND if on and available() else None):
        yield


def active() -> bool:
    """Whether the code being traced routes decode work to the kernels (`enabled()` and `available()`)."""
    return ops.active_backend() is BACKEND


def pack(w: Array) -> Array:
    """w [K, N] -> panels [ceil(N / 32), K, 32] (the columns zero-padded to a multiple of 32)."""
    k, n = w.shape
    pad = -n % PANEL
    if pad:
        w = jnp.pad(w, ((0, 0), (0, pad)))
    return w.reshape(k, -1, PANEL).transpose(1, 0, 2)


@dataclasses.dataclass(frozen=True)
class Packed(ops.BackendWeight):
    """A dense weight [K, N] in the kernel's panels ([ceil(N / 32), K, 32] float32), packed outside a decode loop."""

    panels: Array
    n: int

    def matmul(self, x: Array) -> Array:
        """x [M, K] -> [M, N] float32 by the kernel (`dense`)."""
        return dense(x, self)


_TABLE: contextvars.ContextVar[dict[int, Packed] | None] = contextvars.ContextVar("mle_jax_packed", default=None)
_RECORD: contextvars.ContextVar[list[tuple[Any, Any, tuple[int, ...], bool]] | None] = contextvars.ContextVar(
    "mle_jax_record", default=None
)


class _Backend:
    """The kernels as the model's decode backend (mle_jax.models.ops.DecodeBackend)."""

    def weight(self, param: Any, dtype: Any, shape: tuple[int, ...] | None, transpose: bool) -> Packed | None:
        """Inside `packed_weights`, the param's `Packed` panels (while it traces a step: None, the use recorded)."""
        table = _TABLE.get()
        if table is not None and id(param) in table:
            return table[id(param)]
        record = _RECORD.get()
        if record is not None:
            record.append((param, dtype, shape, transpose))
        return None

    def split_cache_attention(
        self, q: Array, prefix_kt: Array, prefix_vt: Array, prefix_valid: Array, kt: Array, vt: Array, filled: Array
    ) -> Array | None:
        """The attention kernel where every array is float32; None otherwise (the model's own)."""
        if not all(x.dtype == jnp.float32 for x in (q, prefix_kt, prefix_vt, kt, vt)):
            return None
        return split_cache_attention(q, prefix_kt, prefix_vt, prefix_valid, kt, vt, filled)


BACKEND = _Backend()


@contextlib.contextmanager
def packed_weights(trace_step: Callable[[], Any]) -> Iterator[None]:
    """Packs, here (outside any loop that follows), every float32 dense weight that `trace_step` (one decode step
    of the model, traced abstractly) takes through `ops.weight`; within the context `ops.weight` returns them
    packed.
    Only while `active()`; otherwise it packs nothing."""
    if not active():
        yield
        return
    record: list[tuple[Any, Any, tuple[int, ...], bool]] = []
    token = _RECORD.set(record)
    try:
        jax.eval_shape(trace_step)
    finally:
        _RECORD.reset(token)
    table: dict[int, Packed] = {}
    for param, dtype, shape, transpose in record:
        if id(param) in table:
            continue
        w = ops.plain_weight(param, dtype, shape, transpose)
        if w.dtype == jnp.float32 and w.ndim == 2:
            table[id(param)] = Packed(pack(w), int(w.shape[1]))
    token = _TABLE.set(table)
    try:
        yield
    finally:
        _TABLE.reset(token)


@contextlib.contextmanager
def live_rows(live: Array) -> Iterator[None]:
    """Within it (a decode step being traced), the kernel matmuls of M = len(live) rows compute only the rows
    live [M] bool marks and give zeros for the others: a decode's rows that have stopped cost nothing."""
    token = _LIVE.set(live)
    try:
        yield
    finally:
        _LIVE.reset(token)


def dense(x: Array, w: Packed, live: Array | None = None) -> Array:
    """x [M, K] float32 @ a packed weight [K, N] -> [M, N] float32, by the packed-panel kernel. live [M] bool
    (default: `live_rows`' mask where it has M rows, else every row): the rows computed; the others are zeros."""
    _require()
    m = x.shape[0]
    if live is None:
        live = _LIVE.get()
        if live is None or live.shape != (m,):
            live = jnp.ones((m,), bool)
    out = jax.ffi.ffi_call("mle_dense_packed", jax.ShapeDtypeStruct((m, w.panels.shape[0] * PANEL), jnp.float32))(
        x.astype(jnp.float32), w.panels, jnp.asarray(live, bool)
    )
    return out[:, : w.n]


def split_cache_attention(
    q: Array, prefix_kt: Array, prefix_vt: Array, prefix_valid: Array, kt: Array, vt: Array, filled: Array
) -> Array:
    """`mle_jax.models.split_cache.split_cache_attention` by the kernel (float32): q [R, Hq, Dh], prefix_kt
    [U, Hkv, Dh, P], prefix_vt [U, Hkv, P, Dh], prefix_valid [U, P] bool, kt [R, Hkv, Dh, M], vt [R, Hkv, M, Dh],
    filled [] int32 -> [R, Hq, Dh]; reads suffix slots [0, filled) only. A row with no valid slot gives zeros."""
    _require()
    return jax.ffi.ffi_call("mle_split_cache_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        q, prefix_kt, prefix_vt, prefix_valid, kt, vt, jnp.asarray(filled, jnp.int32)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="compile the library next to its source")
    args = parser.parse_args(argv)
    if args.build:
        print(build())
    return 0


if __name__ == "__main__":
    sys.exit(main())
