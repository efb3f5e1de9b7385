"""docs/config.md: every field of the run config, its default and its meaning, written from configs/base.py.

    python -m mle_jax.run.config_docs --write    rewrite docs/config.md (also part of `make tables`)
    python -m mle_jax.run.config_docs --check    exit 1 if docs/config.md differs from what --write would write

configs/base.py stays the one place a field is defined and explained: the default is `get_config()`'s value, the
meaning is the comment on the line that sets the field, after the comment lines right above it. A model field is
explained where `tiny_model` sets it; a comment where `qwen25_3b_model` sets it again says why the default differs.
A section's meaning is the comment on the line that makes its ConfigDict. A field without a comment is an error
that names it (tests/run/test_config_docs.py), so a new field comes with its line in docs/config.md.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mle_jax.instrument import pyast
from mle_jax.reporting.markdown import markdown_table

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "configs" / "base.py"
DOC = ROOT / "docs" / "config.md"
COMMAND = "python -m mle_jax.run.config_docs --write"
# the functions of base.py whose assignments explain the fields, and the section their variable fills
BUILDERS: dict[str, str] = {"tiny_model": "model.", "qwen25_3b_model": "model.", "get_config": ""}
DEFAULT_MODEL = "qwen25_3b_model"  # get_config's model: its comments say why a default differs from tiny_model's


class UndocumentedFields(ValueError):
    """Fields of get_config() without a comment in configs/base.py; the message names them."""


@dataclass(frozen=True)
class Field:
    name: str  # dotted: "ppo.clip_ratio"; a section is its name alone: "ppo"
    default: Any  # a section's: None
    meaning: str  # "": no comment explains it
    section: bool = False


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """(line -> the text of its comment, the lines that hold nothing but a comment)."""
    text, alone = {}, set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text[tok.start[0]] = tok.string.lstrip("#").strip()
            if not tok.line[: tok.start[1]].strip():
                alone.add(tok.start[0])
    return text, alone


def explanations(source: str) -> dict[str, list[tuple[str, str]]]:
    """Dotted field or section name -> [(the function of BUILDERS that sets it, the comment that explains it)], in
    the source's order: the comment lines right above the assignment, then the comment on its last line."""
    text, alone = _comments(source)
    found: dict[str, list[tuple[str, str]]] = {}
    for func in pyast.parse(source).body:
        if not isinstance(func, ast.FunctionDef) or func.name not in BUILDERS:
            continue
        for stmt in func.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            target = stmt.targets[0]
            if not isinstance(target, ast.Attribute):
                continue
            name = BUILDERS[func.name] + ast.unparse(target).partition(".")[2]
            above, line = [], stmt.lineno - 1
            while line in alone:
                above.insert(0, text[line])
                line -= 1
            inline = [text[stmt.end_lineno]] if stmt.end_lineno in text and stmt.end_lineno not in alone else []
            found.setdefault(name, []).append((func.name, "; ".join(x for x in (" ".join(above), *inline) if x)))
    return found


def _leaves(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, bool]]:
    """Dotted name -> (value, whether it is a section) of every field and section of a ConfigDict."""
    out: dict[str, tuple[Any, bool]] = {}
    for key in cfg.keys():
        value = cfg[key]
        if hasattr(value, "keys"):
            out[prefix + key] = (None, True)
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = (value, False)
    return out


def _in_base_order(names: list[str], source: str) -> list[str]:
    """`names` in get_config's order, a section built by a function of BUILDERS (model) with its fields where
    get_config sets it; any name base.py does not set last, by name."""
    in_source = list(explanations(source))
    order = [n for n in in_source if not any(p and n.startswith(p) for p in BUILDERS.values())]
    for prefix in dict.fromkeys(p for p in BUILDERS.values() if p):
        at = order.index(prefix[:-1]) + 1 if prefix[:-1] in order else len(order)
        order[at:at] = [n for n in in_source if n.startswith(prefix)]
    rank = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


def flat_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Every field of a run config (a ConfigDict), dotted name -> value, in configs/base.py's order, then any field
    base.py does not set, by name."""
    leaves = {name: value for name, (value, section) in _leaves(cfg).items() if not section}
    return {name: leaves[name] for name in _in_base_order(list(leaves), BASE.read_text())}


def _base_config(source: str) -> Mapping[str, Any]:
    """get_config() of the base.py source given."""
    namespace: dict[str, Any] = {"__name__": "configs_base_for_docs"}
    exec(compile(source, str(BASE), "exec"), namespace)  # the repository's own configs/base.py, edited or not
    return namespace["get_config"]()


def _meaning(explained: list[tuple[str, str]]) -> str:
    first = next((text for _, text in explained if text), "")
    why = [text for func, text in explained if func == DEFAULT_MODEL and text and text != first]
    return first + "".join(f" — for Qwen2.5-3B-Instruct: {w}" for w in why) if first else ""


def fields(source: str) -> list[Field]:
    """Every field and section of base.py's get_config(), in base.py's order, with its default and meaning."""
    leaves = _leaves(_base_config(source))
    explained = explanations(source)
    return [
        Field(n, leaves[n][0], _meaning(explained.get(n, [])), section=leaves[n][1])
        for n in _in_base_order(list(leaves), source)
    ]


def undocumented(source: str) -> list[str]:
    """The fields and sections of get_config() that no comment in the source explains."""
    return [f.name for f in fields(source) if not f.meaning]


def value_text(value: Any) -> str:
    """A default as a reader types it: strings quoted, paths inside the repository relative to it."""
    if isinstance(value, str):
        root = f"{ROOT}/"
        return '"' + (value.removeprefix(root) if value.startswith(root) else value) + '"'
    return repr(value)


def _prose(text: str) -> str:
    """Markdown for a comment: `<name>` would be read as an HTML tag, `|` would end a table's cell."""
    return text.replace("<", "\\<").replace("|", "\\|")


def render(source: str) -> str:
    """docs/config.md for the base.py source given; raises UndocumentedFields naming any field without a comment."""
    missing = undocumented(source)
    if missing:
        raise UndocumentedFields(
            f"configs/base.py: no comment explains {', '.join(missing)}: add one on the line that sets each "
            f"(or right above it), then run `{COMMAND}`"
        )
    all_fields = fields(source)
    sections = {f.name: f for f in all_fields if f.section}
    top = [f for f in all_fields if "." not in f.name and not f.section]
    parts = [
        "# The run config",
        "",
        f"<!-- written by `{COMMAND}` from configs/base.py; edit the comments there, not this file -->",
        "",
        "Every field of the run config (`configs/base.py`'s `get_config`), its default (the paper's setup, "
        "`configs/<task>.py` with no argument) and its meaning. Set any field on the command line with "
        "`--config.<section>.<field>=<value>`. The `:cpu` and `:smol` presets change some of them "
        "(`apply_cpu` and `apply_smol` in configs/base.py say which and why); "
        "`python -m mle_jax.launch --config=configs/<task>.py[:cpu] --print_config` prints every field of a "
        "config as it resolves, overrides and presets applied.",
    ]
    header = ["field", "default", "meaning"]

    def rows(group: list[Field]) -> list[list[str]]:
        return [
            [f"`{f.name}`", "`" + value_text(f.default).replace("|", "\\|") + "`", _prose(f.meaning)] for f in group
        ]

    parts += ["", "## Top level", "", markdown_table(header, rows(top))]
    for name, section in sections.items():
        inside = [f for f in all_fields if f.name.startswith(f"{name}.")]
        parts += ["", f"## `{name}`", "", _prose(section.meaning), "", markdown_table(header, rows(inside))]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="docs/config.md, written from configs/base.py")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite docs/config.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/config.md differs from configs/base.py")
    args = ap.parse_args(argv)
    try:
        text = render(BASE.read_text())
    except UndocumentedFields as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.write:
        if not DOC.exists() or DOC.read_text() != text:
            DOC.write_text(text)
            print(f"rewrote {DOC.relative_to(ROOT)}")
        return 0
    if not DOC.exists() or DOC.read_text() != text:
        print(f"{DOC.relative_to(ROOT)} differs from configs/base.py: run `{COMMAND}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
