"""A run's metrics as it trains: one JSON object per step in metrics.jsonl (appended; survives a crash and a
resume), one line per trained sample in samples.jsonl, and TensorBoard event files in tb/ (scalars, and a few
samples per step as text).

samples.jsonl is size-capped: a record's texts (its plan, program, output: the fields the caller names) are written
while the file stays within its allowance, which grows with the steps (step s of S may bring it to s/S of
`samples_mb`, so that the late steps keep texts too); past it a sample's figures alone are written, marked
"texts_dropped"."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import threading
import uuid
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from mle_jax.infra.tensorboard_events import EventFileWriter, drop_steps_after


class MetricsWriter:
    """Appends step metrics to metrics.jsonl and TensorBoard. Safe to reopen after a resume."""

    def __init__(
        self,
        workdir: str | Path,
        tensorboard: bool = True,
        samples_mb: float | None = None,
        steps: int = 0,
        output_chars: int = 2000,
    ):
        """samples_mb: the size samples.jsonl may reach with texts (None: no cap), over `steps` steps (0: all of it at
        once); output_chars: how much of a sample's stdout and stderr (their ends) its record keeps."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / "metrics.jsonl"
        self.samples_path = self.workdir / "samples.jsonl"
        self.samples_bytes = None if samples_mb is None else int(samples_mb * 2**20)
        self.steps, self.output_chars = int(steps), int(output_chars)
        self._tb = None
        if tensorboard:
            self._tb = _summary_writer(self.workdir / "tb")

    def truncate_after(self, step: int) -> None:
        """Drops rows and TensorBoard points past `step` (a resumed run rewrites the steps after its checkpoint):
        one point per step in every view of the run."""
        for path in (self.path, self.workdir / "samples.jsonl"):
            rows = [r for r in read_metrics(path) if r.get("step", -1) <= step]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            tmp.replace(path)
        tb_dir = self.workdir / "tb"
        if tb_dir.is_dir():
            if self._tb is not None:  # its own file is rewritten too: closed first, a new one opened after
                self._tb.close()
            drop_steps_after(tb_dir, step)
            if self._tb is not None:
                self._tb = _summary_writer(tb_dir)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def write_samples(self, step: int, records: Iterable[Mapping[str, Any]], texts: Collection[str] = ()) -> None:
        """Appends one line per sample trained on at `step` to samples.jsonl; a record's `texts` fields only while
        the file is within its allowance at this step (the module's docstring)."""
        size = self.samples_path.stat().st_size if self.samples_path.exists() else 0
        allowance = self.samples_allowance(step)
        with self.samples_path.open("a") as f:
            for rec in records:
                row = {"step": int(step), **{k: _jsonable(v) for k, v in rec.items()}}
                line = json.dumps(row) + "\n"
                if size + len(line.encode()) > allowance and any(k in row for k in texts):
                    row = {k: v for k, v in row.items() if k not in texts}
                    line = json.dumps({**row, "texts_dropped": True}) + "\n"
                f.write(line)
                size += len(line.encode())

    def samples_allowance(self, step: int) -> float:
        """The size samples.jsonl may reach with the texts of `step`'s samples: its share of samples_mb so far."""
        if self.samples_bytes is None:
            return math.inf
        share = min(1.0, max(int(step), 0) / self.steps) if self.steps > 0 else 1.0
        return self.samples_bytes * share

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Text summaries (markdown) of `step` for TensorBoard's text tab, one per tag."""
        if self._tb is None:
            return
        for tag, text in texts.items():
            self._tb.add_text(tag, text, step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _summary_writer(tb_dir: Path) -> EventFileWriter:
    """A writer of a new event file. A file is named by the second it opens in: a suffix of its own keeps a second
    writer in the same second (a resume's reopen) from truncating the first one's file."""
    return EventFileWriter(tb_dir, suffix=f".{uuid.uuid4().hex[:8]}")


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if hasattr(v, "item") and getattr(v, "shape", None) == ():
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a metrics.jsonl; a torn last line (crash mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


_COMPILES = {"count": 0, "seconds": 0.0}
_COMPILES_LOCK = threading.Lock()


def _count_compile(event: str, seconds: float, **_: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":  # one XLA compile (cache hits do not send it)
        with _COMPILES_LOCK:
            _COMPILES["count"] += 1
            _COMPILES["seconds"] += seconds


jax.monitoring.register_event_duration_secs_listener(_count_compile)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]  # fmt: skip


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallinfo2") and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()
if _LIBC is not None:
    _LIBC.mallinfo2.restype = _MallInfo2


def malloc_free_gib() -> float | None:
    """GiB that glibc's malloc holds free in its arenas (freed by the program, not returned to the kernel: resident
    until reused or trimmed); None without glibc."""
    return None if _LIBC is None else round(_LIBC.mallinfo2().fordblks / 2**30, 3)


def release_free_memory() -> None:
    """Returns the free pages of glibc's malloc arenas to the kernel (malloc_trim(0)); nothing without glibc."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def status_kib() -> dict[str, int]:
    """This process's resident memory now (`VmRSS`) and at its peak (`VmHWM`), in KiB, from /proc/self/status ({}
    where there is none)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    lines = [line.split() for line in status.splitlines() if line.startswith(("VmRSS:", "VmHWM:"))]
    return {fields[0].rstrip(":"): int(fields[1]) for fields in lines}


def _buffers(tree: Any) -> dict[int, int]:
    """{buffer address: bytes} of the jax arrays in `tree` (each device buffer once; shared buffers once)."""
    out: dict[int, int] = {}
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and not x.is_deleted():
            for shard in x.addressable_shards:
                out[shard.data.unsafe_buffer_pointer()] = shard.data.nbytes
    return out


def memory_breakdown(parts: Mapping[str, Any]) -> dict[str, float]:
    """`memory/<part>_gib`: the jax arrays each named part of the process holds (pytrees: a learner's state, its
    reference, a sampler's weights), each buffer counted once, for the first part that holds it (so two parts that
    share one copy of the weights show it once); `memory/other_arrays_gib` the live arrays of no part (caches,
    prefills, packed weights)."""
    seen: dict[int, int] = {}
    out = {}
    for name, tree in parts.items():
        own = {k: v for k, v in _buffers(tree).items() if k not in seen}
        seen.update(own)
        out[f"memory/{name}_gib"] = round(sum(own.values()) / 2**30, 3)
    rest = {k: v for k, v in _buffers(jax.live_arrays()).items() if k not in seen}
    out["memory/other_arrays_gib"] = round(sum(rest.values()) / 2**30, 3)
    return out


def process_metrics(release: bool = True) -> dict[str, float | None]:
    """This process now, in GiB: `process/rss_gib` its resident memory (VmRSS) and `process/peak_rss_gib` the most
    it has held (VmHWM); `process/live_arrays_gib` its live jax arrays; `process/malloc_free_gib` what malloc holds
    freed but not returned to the kernel; and `process/compiles`, `process/compile_s` the XLA compiles since
    mle_jax.infra.metrics was imported. A run logs them every step, so that growth in either shows.

    release: first return malloc's free pages to the kernel (`release_free_memory`; the RL loop does at every step):
    `process/rss_gib` is then what the process uses, `process/released_gib` what the release gave back (the
    freed buffers of the step's compiles, prefills, decodes and update, which glibc keeps in its arenas).
    """
    free = malloc_free_gib()
    before = status_kib().get("VmRSS")
    if release:
        release_free_memory()
    kib = status_kib()
    with _COMPILES_LOCK:
        compiles, seconds = _COMPILES["count"], _COMPILES["seconds"]
    out = {
        "process/rss_gib": round(kib["VmRSS"] / 2**20, 3) if "VmRSS" in kib else None,
        "process/peak_rss_gib": round(kib["VmHWM"] / 2**20, 3) if "VmHWM" in kib else None,
        "process/live_arrays_gib": round(sum(x.nbytes for x in jax.live_arrays()) / 2**30, 3),
        "process/malloc_free_gib": free,
        "process/compiles": compiles,
        "process/compile_s": round(seconds, 1),
    }
    if release and before is not None and "VmRSS" in kib:
        out["process/released_gib"] = round((before - kib["VmRSS"]) / 2**20, 3)
    return out
