"""The marked blocks of README.md and BUILD.md: found, rendered from their results files, rewritten or checked
(`main`, the package's command)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from mle_jax.reporting.results_tables.registry import REGISTRY
from mle_jax.reporting.results_tables.sources import ROOT, load

DOCS: tuple[str, ...] = ("README.md", "BUILD.md")

BLOCK = re.compile(
    r"<!-- (?P<kind>table|figure):(?P<name>[a-z0-9_]+) -->(?P<body>.*?)<!-- /(?P=kind):(?P=name) -->", re.S
)


def render(name: str, root: Path = ROOT) -> str:
    """The block NAME as its renderer writes it now from its results files."""
    entry = REGISTRY[name]
    text = entry.render(*(load(src, root) for src in entry.sources))
    if entry.inline and "\n" in text:
        raise ValueError(f"figure:{name} rendered more than one line")
    return text


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def rewrite(text: str, root: Path = ROOT, where: str = "") -> str:
    """`text` with every marked block replaced by what its renderer writes now."""

    def one(m: re.Match) -> str:
        name, kind = m["name"], m["kind"]
        if name not in REGISTRY:
            raise KeyError(f"{where}: <!-- {kind}:{name} --> has no entry in results_tables/registry.py's REGISTRY")
        if REGISTRY[name].inline != (kind == "figure"):
            raise ValueError(f"{where}: {name} is registered as a {'figure' if REGISTRY[name].inline else 'table'}")
        body = render(name, root)
        body = body if kind == "figure" else f"\n{body}\n"
        return f"<!-- {kind}:{name} -->{body}<!-- /{kind}:{name} -->"

    return BLOCK.sub(one, text)


def differences(root: Path = ROOT) -> list[str]:
    """One unified diff per marked block whose text differs from what its renderer writes now."""
    out = []
    for doc in DOCS:
        text = (root / doc).read_text()
        for old, new in zip(blocks(text), blocks(rewrite(text, root, doc)), strict=True):
            if old.group(0) != new.group(0):
                diff = difflib.unified_diff(
                    old.group(0).splitlines(), new.group(0).splitlines(), f"{doc} as written", "rendered", lineterm=""
                )
                out.append(f"{doc}: {old['kind']}:{old['name']} differs from its results files:\n" + "\n".join(diff))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="README.md's and BUILD.md's result tables, written from docs/results")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the marked blocks of README.md and BUILD.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if a marked block differs from its files")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    root = args.root
    try:
        if args.write:
            for doc in DOCS:
                path = root / doc
                text = path.read_text()
                new = rewrite(text, root, doc)
                if new != text:
                    path.write_text(new)
                    print(f"rewrote {doc}")
            return 0
        diffs = differences(root)
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for d in diffs:
        print(d)
    if diffs:
        print(
            f"{len(diffs)} block(s) differ: run `python -m mle_jax.reporting.results_tables --write`", file=sys.stderr
        )
    return 1 if diffs else 0
