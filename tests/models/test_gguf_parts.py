"""mle_jax.models.gguf_parts: a file shipped in pieces is joined only when every piece is the right one, in order;
a missing, reordered or altered piece is one line naming it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from mle_jax.models import gguf_parts as gp


def _spec(tmp_path: Path) -> tuple[gp.SplitFile, bytes]:
    pieces, data = [], b""
    for i, chunk in enumerate((b"GGUF" + b"a" * 1000, b"b" * 999, b"c" * 17), 1):
        rel = f"part{i}/data/part{i:02d}.bin"
        (tmp_path / rel).parent.mkdir(parents=True)
        (tmp_path / rel).write_bytes(chunk)
        pieces.append(gp.Piece(rel, len(chunk), hashlib.sha256(chunk).hexdigest()))
        data += chunk
    return gp.SplitFile("test file", tuple(pieces), len(data), hashlib.sha256(data).hexdigest()), data


def test_the_pieces_join_in_order_and_a_joined_file_is_kept(tmp_path):
    spec, data = _spec(tmp_path / "parts")
    out = gp.join(spec, tmp_path / "parts", tmp_path / "model.gguf")
    assert out.read_bytes() == data and not (tmp_path / "model.gguf.partial").exists()
    mtime = out.stat().st_mtime_ns
    (tmp_path / "parts" / spec.pieces[0].relpath).unlink()  # already joined: the pieces are not needed again
    assert gp.join(spec, tmp_path / "parts", out).stat().st_mtime_ns == mtime


@pytest.mark.parametrize(
    "spoil, words",
    [
        (lambda root, spec: (root / spec.pieces[1].relpath).unlink(), r"^piece 2 of 3 is missing: .*part02\.bin"),
        (
            lambda root, spec: (root / spec.pieces[0].relpath).write_bytes(
                (root / spec.pieces[1].relpath).read_bytes()
            ),
            r"^piece 1 of 3 \(.*\) holds the bytes of piece 2: reordered$",
        ),
        (
            lambda root, spec: (root / spec.pieces[2].relpath).write_bytes(b"c" * 16 + b"x"),
            r"^piece 3 of 3 \(.*\) is altered: 17 bytes, sha256 [0-9a-f]{12}…, expected 17 bytes",
        ),
    ],
    ids=["missing", "reordered", "altered"],
)
def test_a_bad_piece_is_one_line_naming_it_and_nothing_is_written(tmp_path, spoil, words):
    root = tmp_path / "parts"
    spec, _ = _spec(root)
    spoil(root, spec)
    with pytest.raises(gp.PartsError, match=words):
        gp.join(spec, root, tmp_path / "model.gguf")
    assert not list(tmp_path.glob("model.gguf*"))


def test_the_cli_says_one_line_and_exits_2_when_the_wheels_are_not_installed(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "mle_jax.models.gguf_parts", "--parts", str(tmp_path), "--out", str(tmp_path / "x")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("gguf_parts: piece 1 of 6 is missing")


def test_the_qwen_spec_adds_up():
    spec = gp.QWEN_CODER_05B
    assert sum(p.size for p in spec.pieces) == spec.size == 491_400_064
    assert spec.sha256.startswith("1d9614638d18")
