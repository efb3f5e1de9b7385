"""The result tables and quoted figures of README.md, BUILD.md and the docs/*.md pages are what
mle_jax.reporting.results_tables renders from the files in docs/results, and those files say which command wrote them
and when."""

from __future__ import annotations

import json
import shutil

import pytest

from mle_jax.reporting import provenance, results_tables
from mle_jax.reporting.markdown import number, plus_minus, signed
from mle_jax.reporting.results_tables.engine import blocks, differences, documents, relative_links, rewrite
from mle_jax.reporting.results_tables.learning import wall_figure
from mle_jax.reporting.results_tables.registry import LEGACY, REGISTRY
from mle_jax.reporting.results_tables.sources import ROOT, records
from mle_jax.reporting.results_tables.tiers import render_test_tiers


def _markers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for doc in documents():
        for m in blocks((ROOT / doc).read_text()):
            found.setdefault(m["name"], set()).add(m["kind"])
    return found


def test_the_documents_blocks_are_what_their_renderers_write_now():
    assert differences() == []
    assert results_tables.main(["--check"]) == 0


def test_every_marker_has_an_entry_of_its_kind_and_every_entry_a_marker():
    found = _markers()
    assert set(found) == set(REGISTRY), set(found) ^ set(REGISTRY)
    for name, kinds in found.items():
        assert kinds == {"figure" if REGISTRY[name].inline else "table"}, name


def test_the_documents_are_the_readme_build_and_every_docs_page():
    docs = documents()
    assert docs[:2] == ["README.md", "BUILD.md"]
    assert set(docs[2:]) == {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} and "docs/results.md" in docs


def test_the_headline_tables_are_in_the_readme_and_in_their_docs_page():
    readme = {m["name"] for m in blocks((ROOT / "README.md").read_text())}
    results = {m["name"] for m in blocks((ROOT / "docs/results.md").read_text())}
    assert {"spooky_learning", "pizza_learning"} <= readme & results


def _copy_of_the_docs(tmp_path):
    (tmp_path / "docs").mkdir()
    for doc in documents():
        shutil.copy(ROOT / doc, tmp_path / doc)
    (tmp_path / "docs/results").symlink_to(ROOT / "docs/results")
    return tmp_path


def test_a_corrupted_table_is_found_and_named_and_write_restores_it(tmp_path, capsys):
    root = _copy_of_the_docs(tmp_path)
    text = (root / "README.md").read_text()
    block = next(m for m in blocks(text) if m["name"] == "spooky_learning").group(0)
    changed = block.replace("0.81 → 0.98", "0.81 → 0.99", 1)
    assert changed != block
    (root / "README.md").write_text(text.replace(block, changed))
    (diff,) = differences(root)
    assert diff.startswith("README.md: table:spooky_learning differs") and "+| 150 SFT steps" in diff
    assert results_tables.main(["--check", "--root", str(root)]) == 1
    assert "table:spooky_learning" in capsys.readouterr().out
    assert results_tables.main(["--write", "--root", str(root)]) == 0
    assert (root / "README.md").read_text() == text and differences(root) == []


def test_a_corrupted_block_of_a_docs_page_is_found_and_its_links_written_from_the_page(tmp_path):
    root = _copy_of_the_docs(tmp_path)
    page = root / "docs/results.md"
    text = page.read_text()
    block = next(m for m in blocks(text) if m["name"] == "learning_utilisation").group(0)
    assert "](results/learning-spooky/report.md)" in block and "](docs/results/" not in block
    page.write_text(text.replace(block, block.replace("](results/", "](docs/results/")))
    (diff,) = differences(root)
    assert diff.startswith("docs/results.md: table:learning_utilisation differs")
    assert results_tables.main(["--write", "--root", str(root)]) == 0
    assert page.read_text() == text


def test_links_from_the_root_are_rewritten_for_a_page_below_it():
    text = "[a](docs/results/x/report.md) [b](BUILD.md#one) [c](https://x.org/y) [d](#here) [e](docs/results/)"
    assert relative_links(text, "README.md") == text
    assert relative_links(text, "docs/results.md") == (
        "[a](results/x/report.md) [b](../BUILD.md#one) [c](https://x.org/y) [d](#here) [e](results/)"
    )


def test_a_corrupted_inline_figure_is_found(tmp_path):
    root = _copy_of_the_docs(tmp_path)
    text = (root / "docs/results.md").read_text()
    m = next(m for m in blocks(text) if m["kind"] == "figure")
    (root / "docs/results.md").write_text(text.replace(m.group(0), m.group(0).replace(m["body"], "12.3 min"), 1))
    (diff,) = differences(root)
    assert f"figure:{m['name']} differs" in diff


def test_a_marker_without_an_entry_is_an_error():
    with pytest.raises(KeyError, match="table:no_such_table"):
        rewrite("<!-- table:no_such_table -->\n<!-- /table:no_such_table -->", where="README.md")
    with pytest.raises(ValueError, match="registered as a table"):
        rewrite("<!-- figure:spooky_learning -->x<!-- /figure:spooky_learning -->")


def test_every_results_file_a_table_reads_records_its_command_and_date():
    sources = {src for entry in REGISTRY.values() for src in entry.sources}
    for src in sorted(sources - set(LEGACY)):
        for rec in records(src):
            assert provenance.missing(rec) == [], (
                f"{src} lacks {provenance.missing(rec)}: stamp it (mle_jax.reporting.provenance)"
            )
    for src in LEGACY:  # the exemptions shrink: a file that gets its command and date leaves the list
        assert (ROOT / src).is_file(), src
        assert any(provenance.missing(rec) for rec in records(src)), f"{src} has command and date: drop it from LEGACY"


def test_a_regenerated_summary_quotes_no_wall_time_and_a_ledger_quotes_the_recorded_one():
    arms = {"a": {"stats": {"rl_wall_s_this_process": 0.0}}}
    assert "not recorded" in wall_figure({"arms": arms, "wall_s_this_process": 1.9})
    assert wall_figure({"arms": {"a": {"stats": {"rl_wall_s_this_process": 80.0}}}, "wall_s_this_process": 247.7}) == (
        "4.1 min"
    )
    assert wall_figure({"arms": {}, "wall_s": 4694.7, "command": "c", "date": "d"}) == "78.2 min"


def test_provenance_stamps_the_command_and_the_date(tmp_path):
    path = provenance.write_json(tmp_path / "r.json", {"x": 1})
    rec = json.loads(path.read_text())
    assert list(rec)[:2] == ["command", "date"] and rec["x"] == 1 and provenance.missing(rec) == []
    assert rec["command"].startswith("python") and rec["date"].endswith("+00:00")
    provenance.append_jsonl(tmp_path / "r.jsonl", {"y": 2})
    provenance.append_jsonl(tmp_path / "r.jsonl", {"y": 3})
    assert [r["y"] for r in records(tmp_path / "r.jsonl", root=tmp_path)] == [2, 3]
    assert provenance.missing({"command": "", "x": 1}) == ["command", "date"]


def test_numbers_are_written_with_a_typographic_minus_unless_told_and_no_negative_zero():
    assert (number(-0.204), signed(0.03), signed(-0.2, 1), number(None)) == ("−0.20", "+0.03", "−0.2", "—")
    assert number(-0.001) == "0.00" and number(-0.001, 3) == "−0.001"
    assert plus_minus(-2.0, 0.5, minus="-") == "-2.00 ± 0.50" and plus_minus(0.5123, None, 3) == "0.512"


def test_the_tier_table_gives_each_workers_time_when_recorded():
    """`make test`'s record (tests/conftest.py) keeps each pytest-xdist worker's sum of test phases: the table shows
    them (the wall time follows the busiest); a record made before they were kept renders as before."""
    tier = {"tests": 1, "test_seconds": 60.0}
    times = {"command": "make test", "machine": "2 CPUs", "workers": 2, "date": "2026-11-28 23:00 UTC",
             "wall_s": 400.0, "tiers": {t: tier for t in ("unit", "model", "integration", "e2e")}}  # fmt: skip
    assert "per worker" not in render_test_tiers(times)
    table = render_test_tiers({**times, "worker_seconds": {"gw0": 390.0, "gw1": 300.0}})
    assert (
        "| per worker | each worker's tests (the wall time is about the busiest's) |  | gw0 6.5 min, gw1 5.0 min |"
        in table
    )
