"""The marked blocks of README.md, BUILD.md and the docs/*.md pages: found, rendered from their results files,
rewritten or checked (`main`, the package's command).

A block may appear in more than one document (README.md repeats the headline tables of docs/results.md); every
occurrence is rendered and checked. Renderers write links from the repository root (`docs/results/x/report.md`);
in a document below the root (docs/results.md) they are rewritten relative to it (`results/x/report.md`)."""

from __future__ import annotations

import argparse
import difflib
import posixpath
import re
import sys
from pathlib import Path

from mle_jax.reporting.results_tables.registry import REGISTRY
from mle_jax.reporting.results_tables.sources import ROOT, load

TOP_DOCS: tuple[str, ...] = ("README.md", "BUILD.md")
PAGES = "docs"  # every docs/*.md page is a document too (not the run reports under docs/results)

BLOCK = re.compile(
    r"<!-- (?P<kind>table|figure):(?P<name>[a-z0-9_]+) -->(?P<body>.*?)<!-- /(?P=kind):(?P=name) -->", re.S
)


LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def documents(root: Path = ROOT) -> list[str]:
    """The documents whose marked blocks are rendered, as paths from the root: README.md, BUILD.md, docs/*.md."""
    return [*TOP_DOCS, *sorted(f"{PAGES}/{p.name}" for p in (root / PAGES).glob("*.md"))]


def relative_links(text: str, doc: str) -> str:
    """`text`'s markdown links from the repository root, rewritten to resolve from `doc`'s folder (URLs, anchors and
    absolute paths unchanged)."""
    folder = posixpath.dirname(doc)
    if not folder:
        return text

    def one(m: re.Match) -> str:
        target = m[2]
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):
            return m[0]
        path, hash_, anchor = target.partition("#")
        return f"{m[1]}{posixpath.relpath(path, folder)}{'/' if path.endswith('/') else ''}{hash_}{anchor}{m[3]}"

    return LINK.sub(one, text)


def render(name: str, root: Path = ROOT, doc: str = "README.md") -> str:
    """The block NAME as its renderer writes it now from its results files, its links resolving from `doc`."""
    entry = REGISTRY[name]
    text = entry.render(*(load(src, root) for src in entry.sources))
    if entry.inline and "\n" in text:
        raise ValueError(f"figure:{name} rendered more than one line")
    return relative_links(text, doc)


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def rewrite(text: str, root: Path = ROOT, where: str = "README.md") -> str:
    """`text` (the document `where`, a path from the root) with every marked block replaced by what its renderer
    writes now."""

    def one(m: re.Match) -> str:
        name, kind = m["name"], m["kind"]
        if name not in REGISTRY:
            raise KeyError(f"{where}: <!-- {kind}:{name} --> has no entry in results_tables/registry.py's REGISTRY")
        if REGISTRY[name].inline != (kind == "figure"):
            raise ValueError(f"{where}: {name} is registered as a {'figure' if REGISTRY[name].inline else 'table'}")
        body = render(name, root, where)
        body = body if kind == "figure" else f"\n{body}\n"
        return f"<!-- {kind}:{name} -->{body}<!-- /{kind}:{name} -->"

    return BLOCK.sub(one, text)


def differences(root: Path = ROOT) -> list[str]:
    """One unified diff per marked block whose text differs from what its renderer writes now."""
    out = []
    for doc in documents(root):
        text = (root / doc).read_text()
        for old, new in zip(blocks(text), blocks(rewrite(text, root, doc)), strict=True):
            if old.group(0) != new.group(0):
                diff = difflib.unified_diff(
                    old.group(0).splitlines(), new.group(0).splitlines(), f"{doc} as written", "rendered", lineterm=""
                )
                out.append(f"{doc}: {old['kind']}:{old['name']} differs from its results files:\n" + "\n".join(diff))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="the result tables and figures of README.md, BUILD.md and docs/*.md, written from docs/results"
    )
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the marked blocks of every document")
    mode.add_argument("--check", action="store_true", help="exit 1 if a marked block differs from its files")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    root = args.root
    try:
        if args.write:
            for doc in documents(root):
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
