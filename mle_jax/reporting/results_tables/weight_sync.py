"""The weight sync to vLLM servers (BUILD.md): bench/weight_sync.py --to_servers's lines, files against shared
memory, one row per model and number of servers."""

from __future__ import annotations

from mle_jax.reporting.markdown import markdown_table
from mle_jax.reporting.results_tables.sources import RESULTS

WEIGHT_SYNC = f"{RESULTS}/weight_sync.jsonl"


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g} s"


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def render_weight_sync(lines: list[dict]) -> str:
    """Per model and servers, the newest measurement of each (measure, backend): seconds from `sync()` with new
    weights to a greedy token with them from every server (median of the runs), files (`hf`) against shared memory
    (`shm`) and their ratio, the learner's wait, and the two steps inside it (the learner's side writing the weights,
    the worker's own load) on the one-server row; then each run's command and date."""
    newest: dict[tuple, dict] = {}
    for r in lines:
        if "measure" in r:
            newest[(r["model"], r["measure"], r["servers"], r["backend"])] = r
    models = list(dict.fromkeys(k[0] for k in newest))
    rows = []
    for m in models:
        servers = sorted({k[2] for k in newest if k[0] == m and k[1] == "to_sampling"})
        for n in servers:
            hf, shm = newest.get((m, "to_sampling", n, "hf")), newest.get((m, "to_sampling", n, "shm"))
            first = hf or shm
            steps = ["", ""]
            if n == servers[0]:
                h = [newest.get((m, "handover", 0, b)) for b in ("hf", "shm")]
                w = [newest.get((m, "worker_load", n, b)) for b in ("hf", "shm")]
                steps = [" / ".join(_s(x and x["seconds"]) for x in h), " / ".join(_s(x and x["seconds"]) for x in w)]
            ratio = f"{hf['seconds'] / shm['seconds']:.2f}×" if hf and shm and shm["seconds"] else "—"
            rows.append([
                f"{m} ({_size(first['bytes'])})" if n == servers[0] else "", n, _s(hf and hf["seconds"]),
                _s(shm and shm["seconds"]), ratio,
                " / ".join(_s(x and x["learner_wait_s"]) for x in (hf, shm)), *steps,
            ])  # fmt: skip
    header = ["model (weights)", "servers", "to sampling: files", "shared memory", "files / shared memory",
              "learner's wait (files / shm)", "handover (files / shm)", "worker's load (files / shm)"]  # fmt: skip
    # each run's machine as its end-to-end lines name it (the first line's was every run's)
    runs = {(r["command"], r["date"]): r["machine"] for r in newest.values() if r["measure"] == "to_sampling"}
    return markdown_table(header, rows) + "".join(
        f"\n\n`{c}` ({d}, {m})" for (c, d), m in sorted(runs.items(), key=lambda x: x[0][1])
    )
