"""TensorBoard event files of scalars and texts, written, read and trimmed without TensorBoard or tensorboardX (whose
package imports torch). A run logs its metrics with `EventFileWriter`; a resumed run drops the points past its
checkpoint from the files of the run it resumes, so that every step has one point (TensorBoard itself
shows both otherwise).

An event file is a sequence of TFRecords: uint64 length, uint32 masked CRC32C of the length, the serialized Event
proto, uint32 masked CRC32C of the data (all little-endian).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT_GLOB = "events.out.tfevents.*"


_CRC32C_TABLE: list[int] = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ 0x82F63B78 if _crc & 1 else _crc >> 1  # CRC-32C (Castagnoli), reflected
    _CRC32C_TABLE.append(_crc)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of `data`."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# The few protobuf fields an event file of scalars uses, written and read here: tensorboardX's package imports torch
# (about 2 s of CPU in every run process that logs to TensorBoard), for what is a handful of bytes per point.
# Event: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary);
# Summary: 1 value (repeated Value); Value: 1 tag (string), 2 simple_value (float), 8 tensor (TensorProto),
# 9 metadata (SummaryMetadata). A text is what tensorboardX's add_text writes: a TensorProto of dtype 7 (DT_STRING),
# shape [1] (2 tensor_shape: 2 dim: 1 size) and 8 string_val, with metadata 1 plugin_data: 1 plugin_name "text".


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as protobuf writes it: a negative number in ten bytes
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def scalar_event(tag: str, step: int, value: float, wall_time: float) -> bytes:
    """The serialized Event of one scalar point."""
    summary_value = _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value)
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + _field(5, _field(1, summary_value))


def text_event(tag: str, step: int, text: str, wall_time: float) -> bytes:
    """The serialized Event of one text (markdown, as TensorBoard's text tab renders it)."""
    shape = _field(2, _field(2, b"\x08\x01"))  # tensor_shape { dim { size: 1 } }
    tensor = b"\x08\x07" + shape + _field(8, text.encode())  # dtype DT_STRING, shape, string_val
    metadata = _field(1, _field(1, b"text"))  # plugin_data { plugin_name: "text" }
    summary_value = _field(1, tag.encode()) + _field(8, tensor) + _field(9, metadata)
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + _field(5, _field(1, summary_value))


def version_event(wall_time: float) -> bytes:
    """The serialized Event that opens every event file."""
    return b"\x09" + struct.pack("<d", wall_time) + _field(3, b"brain.Event:2")


@dataclass
class Event:
    """What a scalar event file's Event holds (the other fields are skipped)."""

    wall_time: float = 0.0
    step: int = 0
    file_version: str = ""
    values: list[tuple[str, float]] = field(default_factory=list)  # the summary's (tag, simple_value)
    texts: list[tuple[str, str]] = field(default_factory=list)  # the summary's (tag, text) of its string tensors
    has_summary: bool = False


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a serialized message: an int for varints, bytes for the rest."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire} (field {number}) is not one an Event uses")
        yield number, wire, value


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("a protobuf varint runs past the end of its message")
        b = data[pos]
        result |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not b & 0x80:
            return result, pos


def parse_event(body: bytes) -> Event:
    """The Event of one record's bytes."""
    event = Event()
    for number, wire, value in _fields(body):
        if number == 1 and wire == 1:
            (event.wall_time,) = struct.unpack("<d", value)
        elif number == 2 and wire == 0:
            event.step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire == 2:
            event.file_version = value.decode()
        elif number == 5 and wire == 2:
            event.has_summary = True
            for n, w, summary_value in _fields(value):
                if n != 1 or w != 2:
                    continue
                tag, simple, strings = "", None, []
                for vn, vw, v in _fields(summary_value):
                    if vn == 1 and vw == 2:
                        tag = v.decode()
                    elif vn == 2 and vw == 5:
                        (simple,) = struct.unpack("<f", v)
                    elif vn == 8 and vw == 2:  # a tensor: its string_val (a text)
                        strings += [t.decode(errors="replace") for tn, tw, t in _fields(v) if tn == 8 and tw == 2]
                if simple is not None:
                    event.values.append((tag, simple))
                event.texts += [(tag, text) for text in strings]
    return event


class EventFileWriter:
    """Scalars to a new event file in `log_dir`, as TensorBoard reads them. Named as tensorboardX names its files
    (events.out.tfevents.<seconds>.<host>), with `suffix` after: a second writer opened in the same second (a
    resume's reopen) writes a file of its own."""

    def __init__(self, log_dir: str | Path, suffix: str = ""):
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = log_dir / f"events.out.tfevents.{int(now)}.{socket.gethostname()}{suffix}"
        self._file = self.path.open("ab")
        self._file.write(_record(version_event(now)))
        self._file.flush()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._file.write(_record(scalar_event(tag, int(step), float(value), time.time())))

    def add_text(self, tag: str, text: str, step: int) -> None:
        self._file.write(_record(text_event(tag, int(step), text, time.time())))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


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


def read_events(path: Path) -> list[Event]:
    """The Events of one event file, in order."""
    return [parse_event(body) for body in read_records(path)]


def scalar_points(tb_dir: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in every event file under tb_dir: what TensorBoard plots."""
    points = []
    for path in sorted(tb_dir.glob(EVENT_GLOB)):
        for event in read_events(path):
            for tag, value in event.values:
                points.append((tag, event.step, value))
    return points


def text_points(tb_dir: Path) -> list[tuple[str, int, str]]:
    """(tag, step, text) of every text in every event file under tb_dir: what TensorBoard's text tab shows."""
    return [
        (tag, event.step, text)
        for path in sorted(tb_dir.glob(EVENT_GLOB))
        for event in read_events(path)
        for tag, text in event.texts
    ]


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
            event = parse_event(body)
            if event.step <= step or not event.has_summary:
                kept.append(body)
        # a record is its body and 16 bytes of framing (length, two CRCs): its size without computing its CRCs again
        if len(kept) == len(records) and path.stat().st_size == sum(len(b) + 16 for b in records):
            continue  # nothing past `step`, no torn tail
        dropped += len(records) - len(kept)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(_record(b) for b in kept))
        os.replace(tmp, path)
    return dropped
