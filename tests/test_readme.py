"""README.md as a new user meets it: short (at most 250 lines), its quickstart's commands run as written (each in a
form that starts nothing: `make -n`, the launcher's --dry_run, another module's --help), its configs table names
every config with its task, and every relative link of README.md, BUILD.md and docs/*.md reaches a file (and, with
an #anchor, a heading of that file)."""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from mle_jax.reporting.results_tables.engine import documents
from mle_jax.tasks.prepare import PREPARERS
from tests.launch_forks import forked_runs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250
QUICKSTART = re.compile(r"^## Quickstart\n.*?^```bash\n(.*?)^```", re.S | re.M)
LAUNCH = ["-m", "mle_jax.launch"]


def quickstart_commands(text: str) -> list[list[str]]:
    """The command lines of the Quickstart section's first bash block, comments dropped, continuations joined."""
    block = QUICKSTART.search(text)
    assert block, "README.md has no ```bash block under '## Quickstart'"
    lines = block[1].replace("\\\n", " ").splitlines()
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]


def checked_form(argv: list[str]) -> list[str]:
    """How the test runs a quickstart command without starting anything: make targets with -n, the launcher with
    --dry_run, another `python -m` module with --help."""
    if argv[0] == "make":
        return ["make", "-n", "--no-print-directory", *argv[1:]]  # under `make test` too (MAKELEVEL > 0)
    if argv[1:3] == LAUNCH:
        return argv if "--dry_run" in argv else [*argv, "--dry_run"]
    if argv[1] == "-m":
        return [*argv, "--help"]
    raise ValueError(f"the quickstart has a command this test cannot run without starting it: {shlex.join(argv)}")


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; move sections to docs/ pages (at most {MAX_LINES})"


def test_the_quickstart_commands_run_as_written():
    text = README.read_text()
    commands = quickstart_commands(text)
    assert ["make", "run"] in commands
    forms = [checked_form(argv) for argv in commands]
    launches = [f for f in forms if f[1:3] == LAUNCH]
    assert len(launches) >= 3, forms  # a run, its resume, a dry run

    made = {}
    for form in (f for f in forms if f[0] == "make"):
        done = subprocess.run(form, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (form, done.stderr)
        made[form[-1]] = done.stdout.strip().splitlines()
    # what `make run` starts is a launch of the embedded config: dry-run it beside the README's own lines
    make_run = shlex.split(made["run"][-1])
    assert make_run[1:3] == LAUNCH, made["run"][-1]
    launches.append(checked_form(make_run))

    for form in launches:
        assert (ROOT / form[0]).is_file(), f"{form[0]}: no such interpreter in the checkout"
    workdirs = [ROOT / a.split("=", 1)[1] for f in launches for a in f if a.startswith("--config.workdir=")]
    new = [w for w in workdirs if not w.exists()]
    # the launcher's --dry_run of each, forked from one interpreter that imports it once (tests/launch_forks.py)
    results = forked_runs([argv[3:] for argv in launches], "mle_jax.launch", timeout=300)
    for form, done in zip(launches, results, strict=True):
        out = done.stdout + done.stderr
        assert done.returncode == 0 and "dry run: nothing started; ready to run" in out, (form, out[-2000:])
    assert [w for w in new if w.exists()] == []  # a dry run writes nothing
    # the folder the README says `make run` writes is the one its config names
    report = re.search(r"`report: (runs/[\w.-]+)/report\.md`", text)
    assert report, "the quickstart names no `report: runs/.../report.md`"
    assert f"kept in {report[1]}/checkpoints" in results[-1].stdout, results[-1].stdout

    for form in (f for f in forms if f[0] != "make" and f[1:3] != LAUNCH):
        done = subprocess.run(form, cwd=ROOT, capture_output=True, text=True, timeout=120)
        out = done.stdout + done.stderr
        assert done.returncode in (0, 1) and ("usage" in out.lower() or "flags:" in out), (form, out[-2000:])
        named = {a.split("=", 1)[0] for a in form if a.startswith("--") and a != "--help"}
        missing = [f for f in named if not re.search(rf"(?m)^\s*({re.escape(f)}|--\[no\]{re.escape(f[2:])})\b", out)]
        assert missing == [], f"{shlex.join(form)}: its --help lists no {missing}"


def test_checked_forms_start_nothing_and_refuse_what_they_cannot_check():
    py = ".venv/bin/python"
    assert checked_form(["make", "run"]) == ["make", "-n", "--no-print-directory", "run"]
    assert checked_form([py, "-m", "mle_jax.launch", "--config=c"]) == [py, "-m", "mle_jax.launch", "--config=c",
                                                                        "--dry_run"]  # fmt: skip
    assert checked_form([py, "-m", "mle_jax.evaluate", "--workdir", "w"])[-1] == "--help"
    with pytest.raises(ValueError, match="cannot run without starting it: rm -rf runs"):
        checked_form(["rm", "-rf", "runs"])
    text = "## Quickstart\n\n```bash\nmake run  # x\npython -m a \\\n  --b=1\n```\n"
    assert quickstart_commands(text) == [["make", "run"], ["python", "-m", "a", "--b=1"]]


CONFIG_ROW = re.compile(r"^\| `configs/(\w+)\.py` \| ([^|]+?) \| (yes|no) \|", re.M)


def test_the_configs_table_names_every_config_its_task_and_whether_its_data_ships():
    rows = {m[1]: (m[2], m[3]) for m in CONFIG_ROW.finditer(README.read_text())}
    configs = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem not in ("__init__", "base"))
    assert sorted(rows) == configs
    for name, (task, data) in rows.items():
        c = importlib.import_module(f"configs.{name}").get_config("paper")
        ids = list(c.tasks) or [c.task.id]
        if len(ids) == 1:
            assert task.startswith(f"{ids[0]} ("), (name, task)
        assert (data == "yes") == all(t in PREPARERS for t in ids), (name, data)


LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file: lowercase, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+ (.+?)\s*$", FENCE.sub("", md.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def broken_links(path: Path) -> list[str]:
    """Each relative link of the markdown file `path` (outside code blocks) that reaches no file, or no heading."""
    out = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{path.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{path.name}: {target}: no heading #{anchor} in {dest.name}")
    return out


def test_every_relative_link_of_the_documents_reaches_its_file_and_heading():
    docs = documents()
    assert "README.md" in docs and "docs/results.md" in docs and "docs/testing.md" in docs
    others = [ROOT / "mle_jax/warmstart/README.md", ROOT / "data/README.md"]
    assert [b for path in [*(ROOT / d for d in docs), *others] for b in broken_links(path)] == []
    assert "models-and-weights-mle_jaxmodels" in anchors(ROOT / "docs/models.md")


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.md").write_text("# A page: its `title`?\n\n## Two\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#a-page-its-title) [ok](#here) [ok](https://x.org/nothing)\n# Here\n"
        "[bad](docs/b.md) [bad](docs/a.md#three)\n```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        "README.md: docs/b.md: no such file",
        "README.md: docs/a.md#three: no heading #three in a.md",
    ]
