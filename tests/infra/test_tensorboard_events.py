"""Our TensorBoard event files against tensorboardX (the reference, a test dependency only): each reads what the
other writes, record for record, and a resumed run's trim keeps what TensorBoard shows consistent."""

from __future__ import annotations

import struct

import pytest
from tensorboardX import SummaryWriter
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c as reference_masked_crc32c
from tensorboardX.summary import text as reference_text

from mle_jax.infra.tensorboard_events import (
    EventFileWriter,
    crc32c,
    drop_steps_after,
    masked_crc32c,
    parse_event,
    read_records,
    scalar_points,
    text_event,
    text_points,
)

POINTS = [("reward/mean", 1, -9.5), ("reward/mean", 2, 0.25), ("valid_fraction", 2, 0.75), ("x", 2**40, 1e30)]


def test_crc32c_is_castagnolis_and_masked_as_tfrecord_masks_it():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    for data in (b"", b"a", bytes(range(256)), b"\x00" * 12):
        assert masked_crc32c(data) == reference_masked_crc32c(data)


def test_tensorboardx_reads_our_files_as_we_wrote_them(tmp_path):
    w = EventFileWriter(tmp_path, suffix=".ours")
    for tag, step, value in POINTS:
        w.add_scalar(tag, value, step)
    w.close()
    [path] = tmp_path.glob("events.out.tfevents.*.ours")
    raw = path.read_bytes()
    events, pos = [], 0
    while pos < len(raw):  # each record framed and checksummed as tensorboardX checks it
        header = raw[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", raw[pos + 8 : pos + 12])[0] == reference_masked_crc32c(header)
        body = raw[pos + 12 : pos + 12 + length]
        assert struct.unpack("<I", raw[pos + 12 + length : pos + 16 + length])[0] == reference_masked_crc32c(body)
        event = Event()
        event.ParseFromString(body)
        events.append(event)
        pos += 16 + length
    assert events[0].file_version == "brain.Event:2" and events[0].wall_time > 0
    got = [(v.tag, e.step, v.simple_value) for e in events[1:] for v in e.summary.value]
    assert got == [(t, s, pytest.approx(v, rel=1e-7)) for t, s, v in POINTS]  # simple_value is a float32


def test_we_read_and_trim_the_files_tensorboardx_writes(tmp_path):
    w = SummaryWriter(str(tmp_path))
    for tag, step, value in POINTS:
        w.add_scalar(tag, value, step)
    w.close()
    expected = [(t, s, pytest.approx(v, rel=1e-7)) for t, s, v in POINTS]
    assert scalar_points(tmp_path) == expected
    assert drop_steps_after(tmp_path, 1) == 3  # the three points past step 1 go; the version event stays
    assert scalar_points(tmp_path) == expected[:1]
    [path] = tmp_path.glob("events.out.tfevents.*")
    assert parse_event(read_records(path)[0]).file_version.startswith("brain.Event")


def test_a_negative_step_and_a_torn_tail_read_back(tmp_path):
    w = EventFileWriter(tmp_path)
    w.add_scalar("a", 1.0, -3)
    w.add_scalar("b", 2.0, 4)
    w.close()
    [path] = tmp_path.glob("events.out.tfevents.*")
    assert scalar_points(tmp_path) == [("a", -3, 1.0), ("b", 4, 2.0)]
    path.write_bytes(path.read_bytes()[:-5])  # a crash mid-write
    assert scalar_points(tmp_path) == [("a", -3, 1.0)]


def test_a_text_is_the_summary_tensorboardx_writes_and_reads_back_beside_the_scalars(tmp_path):
    """A text (TensorBoard's text tab: a sample as markdown) is byte for byte tensorboardX's add_text summary; each
    side reads the other's; a text is no scalar point, and a resume's trim drops texts past its step too."""
    markdown = "uid 3 · reward −10\n\n```python\nprint('é')\n```"
    event = Event()
    event.ParseFromString(text_event("samples/best/text_summary", 2, markdown, 1.5))
    assert event.summary.SerializeToString() == reference_text("samples/best", markdown).SerializeToString()
    w = SummaryWriter(str(tmp_path))
    w.add_text("theirs", "a **b**", 1)
    w.close()
    ours = EventFileWriter(tmp_path, suffix=".ours")
    ours.add_scalar("reward/mean", 0.5, 1)
    ours.add_text("samples/best", markdown, 1)
    ours.add_text("samples/best", "later", 3)
    ours.close()
    assert sorted(text_points(tmp_path)) == [
        ("samples/best", 1, markdown),
        ("samples/best", 3, "later"),
        ("theirs/text_summary", 1, "a **b**"),
    ]
    assert scalar_points(tmp_path) == [("reward/mean", 1, 0.5)]
    drop_steps_after(tmp_path, 2)
    assert ("samples/best", 3, "later") not in text_points(tmp_path) and len(text_points(tmp_path)) == 2
