"""TensorBoard event files read and trimmed without TensorBoard: a resumed run drops the points past its checkpoint
from the files of the run it resumes, so that every step has one point (TensorBoard itself shows both otherwise).

An event file is a sequence of TFRecords: uint64 length, uint32 masked CRC32C of the length, the serialized Event
proto, uint32 masked CRC32C of the data (all little-endian).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

EVENT_GLOB = "events.out.tfevents.*"


# tensorboardX is imported where it is used, not with this module: its package imports torch (about 2 s of CPU),
# and every process that imports mle_jax.report (the launcher, the evaluate CLI, the planner) would pay for it
def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of `data`."""
    from tensorboardX.record_writer import masked_crc32c as crc

    return crc(data)


def new_event() -> Any:
    """An empty tensorboardX Event proto."""
    from tensorboardX.proto.event_pb2 import Event

    return Event()


def read_records(path: Path) -> list[bytes]:
    """The whole records of an event file; a torn or corrupt tail (a crash mid-write) ends the list."""
    data = path.read_bytes()
    records, pos = [], 0
    while pos + 12 <= len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        end = pos + 12 + length + 4
        if length_crc != masked_crc32c(header) or end > len(data):
            break
        body = data[pos + 12 : pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[end - 4 : end])
        if body_crc != masked_crc32c(body):
            break
        records.append(body)
        pos = end
    return records


def read_events(path: Path) -> list[Any]:
    """The Event protos of one event file, in order."""
    events = []
    for body in read_records(path):
        event = new_event()
        event.ParseFromString(body)
        events.append(event)
    return events


def scalar_points(tb_dir: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in every event file under tb_dir: what TensorBoard plots."""
    points = []
    for path in sorted(tb_dir.glob(EVENT_GLOB)):
        for event in read_events(path):
            for value in event.summary.value:
                points.append((value.tag, int(event.step), float(value.simple_value)))
    return points


def _record(body: bytes) -> bytes:
    header = struct.pack("<Q", len(body))
    return header + struct.pack("<I", masked_crc32c(header)) + body + struct.pack("<I", masked_crc32c(body))


def drop_steps_after(tb_dir: Path, step: int) -> int:
    """Rewrites each event file under tb_dir without its events of steps past `step` (each file replaced whole,
    atomically); returns how many events were dropped. Files no writer has open only: close the writer first."""
    dropped = 0
    for path in sorted(Path(tb_dir).glob(EVENT_GLOB)):
        records = read_records(path)
        kept = []
        for body in records:
            event = new_event()
            event.ParseFromString(body)
            if event.step <= step or not event.HasField("summary"):
                kept.append(body)
        if len(kept) == len(records) and path.stat().st_size == sum(len(_record(b)) for b in records):
            continue  # nothing past `step`, no torn tail
        dropped += len(records) - len(kept)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(_record(b) for b in kept))
        os.replace(tmp, path)
    return dropped
